"""What one region costs inside compiled code, as a slope: a compiled function of N steps
``x = x + 1``, each a decorated call (its marks depend on its tensors) or a ``with`` block (no
dependencies), timed at N = 1 and N = 33 against the same function without regions.

    python benchmarks/mark_slope.py [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import timeit
from collections.abc import Callable

import torch

import cudatimer


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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--number", type=int, default=2000)
    args = ap.parse_args()
    timer = cudatimer.Timer(name="slope")
    x = torch.ones(16, device=args.device)
    per: dict[str, float] = {}
    for kind in ("none", "call", "block"):
        for n in (1, 33):
            fn = _build(n, kind, timer)
            fn(x)
            best = min(timeit.repeat(lambda f=fn: f(x), number=args.number, repeat=5))
            per[f"{kind}_{n}"] = best / args.number * 1e6
    out = {k: round(v, 2) for k, v in per.items()}
    for kind in ("call", "block"):
        slope = (per[f"{kind}_33"] - per[f"{kind}_1"] - per["none_33"] + per["none_1"]) / 32
        out[f"{kind}_us_per_region"] = round(slope, 2)
    enter, exit_ = torch.ops.cudatimer.enter, torch.ops.cudatimer.exit
    fn = _build(1, "block", timer)  # makes sure the "step" block region has its key
    # The overloads Inductor's code calls: one tensor (a decorated call of one tensor in, one
    # out), none (a `with` block); and the list overload, taken for three tensors or more.
    pairs: dict[str, Callable[[], object]] = {
        "op_pair_with_dep_us": lambda: (enter.one(0, x), exit_.one(0, x)),
        "op_pair_no_dep_us": lambda: (enter.none(0), exit_.none(0)),
        "op_pair_dep_list_us": lambda: (enter.default(0, [x]), exit_.default(0, [x])),
    }
    for label, pair in pairs.items():
        best = min(timeit.repeat(pair, number=args.number, repeat=5))
        out[label] = round(best / args.number * 1e6, 2)
    region = timer.region("direct")
    best = min(
        timeit.repeat(
            lambda: (region.__enter__(), region.__exit__(None, None, None)),
            number=args.number,
            repeat=5,
        )
    )
    out["eager_region_us"] = round(best / args.number * 1e6, 2)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
