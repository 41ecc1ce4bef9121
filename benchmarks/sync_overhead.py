"""What sync detection costs on the launch-bound loop: 48 x (Linear(256,256)+GELU), batch 32.

Every layer is a cudatimer region, and each iteration ends with a planted ``.item()`` (the loss
a training loop logs) inside a "step" region, so detection has one sync per iteration to find.
torch's GPU-trace hooks cannot be switched off once on (torch <= 2.13), so each process runs two
phases, each a set of variants interleaved round by round (A B C, B C A, ...):

1. before the trace was ever activated: no cudatimer (bare model), cudatimer regions, cudatimer
   regions + ``detect_syncs(source="debug_mode")``;
2. after activating it: the bare model again, regions + ``detect_syncs(source="trace")``
   (what ``"auto"`` picks), and regions with detection switched off again (what stays).

Ratios are against "regions" of phase 1 in the same process; several fresh processes give the
spread. Usage (needs CUDA; about 30 s)::

    python benchmarks/sync_overhead.py [--processes 3] [--rounds 15] [--iters 20]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

PHASE1 = ("bare", "regions", "regions+debug_mode")
PHASE2 = ("bare (trace active)", "regions+trace", "regions, detection off (trace active)")
LABELS = {
    "bare": "no cudatimer",
    "regions": "cudatimer regions (baseline)",
    "regions+debug_mode": "regions + detect_syncs(source='debug_mode')",
    "bare (trace active)": "no cudatimer, after the trace was activated",
    "regions+trace": "regions + detect_syncs() (trace)",
    "regions, detection off (trace active)": "regions, after detect_syncs(False) (trace stays)",
}


def child(rounds: int, iters: int, warmup: int) -> dict[str, Any]:
    """One process: both phases; milliseconds per iteration for each round and variant."""
    import torch
    from torch import nn

    import cudatimer

    torch.manual_seed(0)
    width, depth, batch = 256, 48, 32

    def model() -> nn.Sequential:
        blocks = [nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(depth)]
        return nn.Sequential(*blocks).cuda().requires_grad_(False)

    bare, timed = model(), model()
    timer = cudatimer.Timer(name="bench", keep_steps=0, trace_samples=0)
    for i, block in enumerate(timed):
        timer.region(f"layer{i}")(block)  # wraps the block's forward
    step_region = timer.region("step")
    x = torch.randn(batch, width, device="cuda")

    def step_bare() -> None:
        bare(x).sum().item()

    def step_timed() -> None:
        with step_region:
            timed(x).sum().item()

    def block(step: Callable[[], None], source: str | None) -> float:
        detection = cudatimer.detect_syncs(timer=timer, source=source) if source else None
        try:
            for _ in range(warmup):
                step()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(iters):
                step()
            torch.cuda.synchronize()
            return (time.perf_counter() - t0) * 1e3 / iters
        finally:
            if detection is not None:
                cudatimer.detect_syncs(False)

    variants: dict[str, Callable[[], float]] = {
        "bare": lambda: block(step_bare, None),
        "regions": lambda: block(step_timed, None),
        "regions+debug_mode": lambda: block(step_timed, "debug_mode"),
        "bare (trace active)": lambda: block(step_bare, None),
        "regions+trace": lambda: block(step_timed, "trace"),
        "regions, detection off (trace active)": lambda: block(step_timed, None),
    }
    for name in PHASE1:  # warm every path once (cuBLAS handles, event pools, bytecode caches)
        variants[name]()
    times: dict[str, list[float]] = {name: [] for name in variants}
    expected_syncs = 0

    def phase(names: tuple[str, ...]) -> None:
        nonlocal expected_syncs
        for r in range(rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            for name in order:
                times[name].append(variants[name]())
                if "+" in name:  # detection was on: one .item() per step
                    expected_syncs += warmup + iters
            timer.summary()  # resolve pending events outside the timed blocks

    timer.reset()
    phase(PHASE1)
    cudatimer.detect_syncs(source="trace")  # activates torch's trace for good
    cudatimer.detect_syncs(False)
    phase(PHASE2)
    counted = timer.summary()["step"].syncs
    return {
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0),
        "regions_per_iter": depth + 1,
        "times_ms": times,
        "syncs_counted": counted,
        "syncs_expected": expected_syncs,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--processes", type=int, default=3, help="fresh processes (default 3)")
    ap.add_argument("--rounds", type=int, default=15, help="interleaved rounds per phase")
    ap.add_argument("--iters", type=int, default=20, help="timed iterations per block")
    ap.add_argument("--warmup", type=int, default=2, help="untimed iterations per block")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args.rounds, args.iters, args.warmup)))
        return

    import torch

    if not torch.cuda.is_available():
        print("sync_overhead: needs a CUDA device; nothing measured.")
        return
    runs: list[dict[str, Any]] = []
    for p in range(args.processes):
        cmd = [sys.executable, os.path.abspath(__file__), "--child"]
        cmd += ["--rounds", str(args.rounds), "--iters", str(args.iters)]
        cmd += ["--warmup", str(args.warmup)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            sys.exit(f"process {p} failed:\n{proc.stderr[-3000:]}")
        (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        runs.append(json.loads(line[len("RESULT ") :]))
    report(runs, args)


def report(runs: list[dict[str, Any]], args: argparse.Namespace) -> None:
    first = runs[0]
    n_regions = first["regions_per_iter"]
    print(
        f"# Sync detection overhead: {first['device']}, torch {first['torch']}\n"
        f"48 x (Linear(256,256)+GELU), batch 32, fp32 forward, one region per layer + 'step' "
        f"({n_regions} regions/iter), one .item() per iteration.\n"
        f"{len(runs)} processes x {args.rounds} interleaved rounds per phase x {args.iters} "
        f"iterations; medians per process, then the median and range over processes.\n"
    )
    print("| variant | ms/iter | vs regions | added us/region vs regions |")
    print("| --- | --- | --- | --- |")
    for name in (*PHASE1, *PHASE2):
        per_proc = [statistics.median(r["times_ms"][name]) for r in runs]
        ratios = [
            statistics.median(r["times_ms"][name]) / statistics.median(r["times_ms"]["regions"])
            for r in runs
        ]
        added = [
            (statistics.median(r["times_ms"][name]) - statistics.median(r["times_ms"]["regions"]))
            * 1e3
            / n_regions
            for r in runs
        ]
        print(
            f"| {LABELS[name]} | {statistics.median(per_proc):.3f} "
            f"| {statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}) "
            f"| {statistics.median(added):+.1f} ({min(added):+.1f} to {max(added):+.1f}) |"
        )
    print()
    for i, r in enumerate(runs):
        ok = "ok" if r["syncs_counted"] == r["syncs_expected"] else "MISMATCH"
        print(
            f"process {i}: syncs counted in 'step' {r['syncs_counted']} of "
            f"{r['syncs_expected']} planted while detection was on ({ok})"
        )
    print("\nRAW " + json.dumps(runs))


if __name__ == "__main__":
    main()
