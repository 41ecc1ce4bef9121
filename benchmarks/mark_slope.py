"""What one region costs inside compiled code, as a slope: a compiled function of N steps
``x = x + 1``, each a decorated call (its marks depend on its tensors) or a ``with`` block (no
dependencies), timed at N = 1 and N = 33 against the same function without regions; then the
marks' ops and the region's enter and exit called directly.

    python benchmarks/mark_slope.py [--device cuda] [--rounds 40]
"""

from __future__ import annotations

import argparse
import json
import timeit
from collections.abc import Callable

import torch

import cudatimer
from cudatimer.sources import _compile


def _build(n: int, kind: str, timer: cudatimer.Timer) -> Callable[[torch.Tensor], torch.Tensor]:
    step = timer.timed(lambda x: x + 1, name="step")

    def fn(x: torch.Tensor) -> torch.Tensor:
        for _ in range(n):
            if kind == "call":
                x = step(x)
            elif kind == "block":
                with timer.region("step"):
                    x = x + 1
            else:
                x = x + 1
        return x

    return torch.compile(fn, fullgraph=True)


def _best(cases: dict[str, tuple[Callable[[], object], int]], rounds: int) -> dict[str, float]:
    """Microseconds a call, the least of ``rounds`` rounds; each round times every case in
    turn, so a neighbour's load on a shared machine hits all cases alike (timed one after
    another, the same case read 9-15 us a pair on the 2-core CPU machine)."""
    best = dict.fromkeys(cases, float("inf"))
    for _ in range(rounds):
        for label, (fn, number) in cases.items():
            best[label] = min(best[label], timeit.timeit(fn, number=number) / number * 1e6)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--number", type=int, default=2000, help="calls a round of a direct case")
    ap.add_argument("--rounds", type=int, default=40)
    args = ap.parse_args()
    timer = cudatimer.Timer(name="slope")
    x = torch.ones(16, device=args.device)
    cases: dict[str, tuple[Callable[[], object], int]] = {}
    for kind in ("none", "call", "block"):
        for n in (1, 33):
            fn = _build(n, kind, timer)
            fn(x)
            cases[f"{kind}_{n}"] = (lambda f=fn: f(x), max(args.number // (4 * n), 20))
    enter, exit_ = torch.ops.cudatimer.enter, torch.ops.cudatimer.exit
    # The overloads Inductor's code calls: one tensor (a decorated call of one tensor in, one
    # out), none (a `with` block); and the list overload, taken for three tensors or more.
    key = _compile.key_of(timer.region("step"))
    pairs: dict[str, Callable[[], object]] = {
        "op_pair_with_dep_us": lambda: (enter.one(key, x), exit_.one(key, x)),
        "op_pair_no_dep_us": lambda: (enter.none(key), exit_.none(key)),
        "op_pair_dep_list_us": lambda: (enter.default(key, [x]), exit_.default(key, [x])),
    }
    region = timer.region("direct")
    pairs["eager_region_us"] = lambda: (region.__enter__(), region.__exit__(None, None, None))
    cases.update((label, (pair, args.number)) for label, pair in pairs.items())
    per = _best(cases, args.rounds)
    out = {k: round(v, 2) for k, v in per.items()}
    for kind in ("call", "block"):
        slope = (per[f"{kind}_33"] - per[f"{kind}_1"] - per["none_33"] + per["none_1"]) / 32
        out[f"{kind}_us_per_region"] = round(slope, 2)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
