"""The marks' direct call against the dispatcher call, in one process: the compiled GPT-2-small
training step of ``compile_targets.py`` compiled three times (plain; every module instrumented
with Inductor's code calling the marks' kernels straight; the same with the marks called as
ops through the dispatcher, as ``CUDATIMER_COMPILE_DIRECT=0`` gives), then interleaved rounds.
Each step's host issue time per phase too (forward, backward, optimizer; no sync inside).

A diagnostic: it switches the lowering off for the third compile through ``_compile``'s
module state, which no user code should touch.

    python benchmarks/compile_direct_ab.py --rounds 12 --json results/compile_direct_ab.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _workloads import GPT
from compile_targets import _step_fn, _sync, _timed_steps, workload

import cudatimer
from cudatimer.sources import _compile


def _without_lowering() -> dict[Any, Any]:
    """Take the marks' lowerings out of Inductor's table (given back by ``_restore``)."""
    from torch._inductor import lowering

    ops = [op for group in (_compile._ENTER, _compile._EXIT) for op in group or ()]
    taken = {op: lowering.lowerings.pop(op) for op in ops if op in lowering.lowerings}
    _compile._DIRECT = False
    return taken


def _restore(taken: dict[Any, Any]) -> None:
    from torch._inductor import lowering

    lowering.lowerings.update(taken)
    _compile._DIRECT = True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny model: the script runs")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    device, cfg, idx = workload(args.smoke)
    steps = {}
    out: dict[str, Any] = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu"}
    out["torch"] = torch.__version__
    for name in ("plain", "direct", "dispatcher"):
        model = GPT(cfg).to(device)
        if name != "plain":
            cudatimer.instrument(model, timer=cudatimer.Timer(name=f"ab-{name}"))
        taken = _without_lowering() if name == "dispatcher" else None
        try:
            step = _step_fn(model, torch.compile(model), idx, device)
            t0 = time.perf_counter()
            step()  # compiles forward and backward
            _sync(device)
            out[f"compile_s_{name}"] = time.perf_counter() - t0
        finally:
            if taken is not None:
                _restore(taken)
        for _ in range(3):
            step()
        steps[name] = step
    per: dict[str, list[float]] = {name: [] for name in steps}
    order = list(steps)
    for r in range(args.rounds):
        for name in order if r % 2 == 0 else order[::-1]:
            per[name].append(_timed_steps(steps[name], args.steps, device))
    med = {name: statistics.median(v) for name, v in per.items()}
    out.update({f"{name}_ms": v for name, v in med.items()})
    out["direct_ratio"] = med["direct"] / med["plain"]
    out["dispatcher_ratio"] = med["dispatcher"] / med["plain"]
    out["direct_vs_dispatcher"] = med["direct"] / med["dispatcher"]
    out["direct_vs_dispatcher_per_round"] = [
        a / b for a, b in zip(per["direct"], per["dispatcher"], strict=True)
    ]
    print(json.dumps(out, indent=2))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
