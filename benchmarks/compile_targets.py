"""Regions inside torch.compile: what timing every module of a compiled model costs.

A GPT-2-small training step (batch 8 x 512 tokens, bf16 autocast, inductor default mode),
compiled three times in one process: plain, with every module instrumented (each forward's
regions become cudatimer's enter/exit marks inside the graph), and with every module
instrumented with ``backward=True`` (also one mark per call in the backward graph). The three
compiled steps then run in interleaved rounds (plain, timed, backward, then reversed ...); the
figures are the ratios of the median step times to plain's. Also: each compile's wall time,
and that every module has a GPU total (and a backward row).

Then what one region costs inside compiled code, as a slope: a compiled function of N steps
``x = x + 1``, each a decorated call or a ``with`` block, at N = 1 and N = 33 against the same
function without regions; beside it the marks' ops called through the dispatcher and the
region's eager enter and exit (``decorated_region_us``, ``compiled_region_us``, ...).

    python benchmarks/compile_targets.py --rounds 12 --json compile_targets.json
    python benchmarks/compile_targets.py --smoke   # CPU, a tiny model: the script runs

Needs CUDA for the real figures; with ``--smoke`` it runs a 2-layer model on the CPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _workloads import GPT, GPTConfig

import cudatimer
from cudatimer.sources import _compile


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _step_fn(
    model: torch.nn.Module, compiled: Any, idx: torch.Tensor, device: str
) -> Callable[[], None]:
    tgt = idx.roll(1, dims=1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device == "cuda" or None)
    dtype = torch.bfloat16

    def step() -> None:
        with torch.autocast(device_type=device, dtype=dtype):
            logits = compiled(idx)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)).float(), tgt.view(-1))
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def _timed_steps(step: Callable[[], None], n: int, device: str) -> float:
    """Milliseconds per step over ``n`` steps (one sync at each end)."""
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    _sync(device)
    return (time.perf_counter() - t0) * 1e3 / n


def _slope_fn(n: int, kind: str, timer: cudatimer.Timer) -> Callable[[torch.Tensor], torch.Tensor]:
    """A compiled function of ``n`` steps ``x = x + 1``: each a decorated call (``call``: its
    marks depend on its tensors), a ``with`` block (``block``: no dependencies), or bare."""
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


def _least(cases: dict[str, tuple[Callable[[], object], int]], rounds: int) -> dict[str, float]:
    """Microseconds a call, the least of ``rounds`` rounds; each round times every case in
    turn, so a neighbour's load on a shared machine hits all cases alike (timed one after
    another, the same case read 9-15 us a pair on the 2-core CPU machine)."""
    best = dict.fromkeys(cases, float("inf"))
    for _ in range(rounds):
        for label, (fn, number) in cases.items():
            best[label] = min(best[label], timeit.timeit(fn, number=number) / number * 1e6)
    return best


def region_cost(device: str, rounds: int, number: int) -> dict[str, float]:
    """Host microseconds one region adds inside compiled code, as a slope: the compiled
    functions of ``_slope_fn`` at 1 and 33 steps, against the same functions without regions;
    beside them the marks' ops called through the dispatcher (one tensor: a decorated call's
    overload; none: a ``with`` block's; the list overload, taken for three tensors or more)
    and the region's eager enter and exit."""
    timer = cudatimer.Timer(name="region-cost")
    x = torch.ones(16, device=device)
    cases: dict[str, tuple[Callable[[], object], int]] = {}
    for kind in ("none", "call", "block"):
        for n in (1, 33):
            fn = _slope_fn(n, kind, timer)
            fn(x)
            cases[f"{kind}_{n}"] = (lambda f=fn: f(x), max(number // (4 * n), 20))
    enter, exit_ = torch.ops.cudatimer.enter, torch.ops.cudatimer.exit
    key = _compile.key_of(timer.region("step"))
    region = timer.region("direct")
    pairs: dict[str, Callable[[], object]] = {
        "op_pair_with_dep_us": lambda: (enter.one(key, x), exit_.one(key, x)),
        "op_pair_no_dep_us": lambda: (enter.none(key), exit_.none(key)),
        "op_pair_dep_list_us": lambda: (enter.default(key, [x]), exit_.default(key, [x])),
        "eager_region_us": lambda: (region.__enter__(), region.__exit__(None, None, None)),
    }
    cases.update((label, (pair, number)) for label, pair in pairs.items())
    per = _least(cases, rounds)
    _sync(device)
    out = {label: round(per[label], 2) for label in pairs}
    for kind, label in (("call", "decorated_region_us"), ("block", "compiled_region_us")):
        slope = (per[f"{kind}_33"] - per[f"{kind}_1"] - per["none_33"] + per["none_1"]) / 32
        out[label] = round(slope, 2)
    return out


def workload(smoke: bool) -> tuple[str, GPTConfig, torch.Tensor]:
    """(device, model config, token batch): GPT-2-small at 8 x 512 on CUDA, or with ``smoke``
    (or no CUDA) a 2-layer model on the CPU; the seed set first."""
    device = "cpu" if smoke or not torch.cuda.is_available() else "cuda"
    if smoke:
        cfg, batch, seq = GPTConfig(vocab=256, seq=32, layers=2, width=64, heads=4), 2, 32
    else:
        cfg, batch, seq = GPTConfig(), 8, 512
    torch.manual_seed(0)
    return device, cfg, torch.randint(0, cfg.vocab, (batch, seq), device=device)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--steps", type=int, default=5, help="steps per round and variant")
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny model: the script runs")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument(
        "--slope-rounds", type=int, default=20, help="rounds of the per-region slope (least kept)"
    )
    ap.add_argument(
        "--slope-number", type=int, default=2000, help="calls a round of a direct case in the slope"
    )
    args = ap.parse_args(argv)
    if args.smoke:
        args.slope_rounds, args.slope_number = min(args.slope_rounds, 2), 200

    device, cfg, idx = workload(args.smoke)
    plain = GPT(cfg).to(device)
    timed = GPT(cfg).to(device)
    timed.load_state_dict(plain.state_dict())
    both = GPT(cfg).to(device)
    both.load_state_dict(plain.state_dict())
    timer = cudatimer.Timer(name="compiled-gpt2")
    handle = cudatimer.instrument(timed, timer=timer)
    modules = len(handle.regions)
    both_timer = cudatimer.Timer(name="compiled-gpt2-backward")
    both_handle = cudatimer.instrument(both, timer=both_timer, backward=True)

    out: dict[str, Any] = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu"}
    out["torch"] = torch.__version__
    out["modules"] = modules
    steps: dict[str, Callable[[], None]] = {}
    for name, model in (("plain", plain), ("timed", timed), ("backward", both)):
        compiled = torch.compile(model)
        step = _step_fn(model, compiled, idx, device)
        _sync(device)
        t0 = time.perf_counter()
        step()  # compiles forward and backward
        _sync(device)
        out[f"compile_s_{name}"] = time.perf_counter() - t0
        for _ in range(3):
            step()  # warm: autotuning done, allocator settled
        steps[name] = step
    timer.reset()
    both_timer.reset()

    per: dict[str, list[float]] = {"plain": [], "timed": [], "backward": []}
    order = ["plain", "timed", "backward"]
    for r in range(args.rounds):
        for name in order if r % 2 == 0 else order[::-1]:
            per[name].append(_timed_steps(steps[name], args.steps, device))
    plain_ms = statistics.median(per["plain"])
    timed_ms = statistics.median(per["timed"])
    out["plain_ms"] = plain_ms
    out["timed_ms"] = timed_ms
    out["ratio"] = timed_ms / plain_ms
    out["ratios_per_round"] = [t / p for p, t in zip(per["plain"], per["timed"], strict=True)]
    out["backward_ms"] = statistics.median(per["backward"])
    out["backward_ratio"] = out["backward_ms"] / plain_ms
    rows = [r for r in both_timer.summary().regions if ".backward" in r.name]
    out["backward_rows"] = len(rows)
    out["backward_calls_per_row"] = sorted({r.calls for r in rows})
    s = timer.summary()
    names = {r.name for r in s.regions if r.gpu_total_ms is not None or device == "cpu"}
    out["regions_with_gpu_time"] = len(names)
    out["calls_per_module"] = sorted({r.calls for r in s.regions})
    handle.remove()
    both_handle.remove()
    out.update(region_cost(device, args.slope_rounds, args.slope_number))
    print(json.dumps(out, indent=2))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    if out["regions_with_gpu_time"] < modules:
        print(f"only {out['regions_with_gpu_time']} of {modules} modules timed", file=sys.stderr)
        return 1
    if out["backward_rows"] < len(set(both_handle.backward_regions.values())):
        print(f"only {out['backward_rows']} backward rows", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
