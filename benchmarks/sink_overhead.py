"""What per-step sinks (``cudatimer.StepFeed``) add to a GPT-2 small training step.

The GPT-2 small workload of ``compare.py`` (12 x 768, seq 1024, batch 16, bf16 autocast, fused
AdamW; a cudatimer region around every module's forward) runs in one process as variants
interleaved round by round (A B C, B C A, ...), each block ending in one synchronize:

- ``regions``: the regions and ``timer.step()`` (the baseline every ratio is against);
- ``regions+feed``: ``feed.step()`` instead, a plain callable sink taking ``scalars()``;
- ``regions+feed+tensorboard``: the same with ``cudatimer.sinks.tensorboard`` writing to a
  ``SummaryWriter`` in a temporary folder (skipped without tensorboard).

Then each variant's steps run under torch.profiler and its synchronizing CUDA runtime calls
are counted: a sink must add none. The goal: ratios <= 1.01 and no added sync. Usage::

    python benchmarks/sink_overhead.py --out sinks.json      # H200: about a minute
    python benchmarks/sink_overhead.py --smoke               # CPU: seconds
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _measure
import _workloads
import torch

import cudatimer
import cudatimer.sinks

BASE = "regions"


def _variants(folder: str) -> dict[str, tuple[cudatimer.Timer, Callable[[], Any]]]:
    """Each variant's Timer and end-of-step call. One Timer each: a feed sends every step of
    its Timer, so a shared one would make each feed catch up on the other variants' steps."""
    seen: list[int] = []

    def plain(times: cudatimer.StepTimes) -> None:
        seen.append(len(times.scalars()))

    def timer(name: str) -> cudatimer.Timer:
        return cudatimer.Timer(name=name, trace_samples=0)

    base = timer(BASE)
    variants: dict[str, tuple[cudatimer.Timer, Callable[[], Any]]] = {BASE: (base, base.step)}
    fed = timer("feed")
    variants["regions+feed"] = (fed, cudatimer.StepFeed(plain, timer=fed).step)
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        print("tensorboard is not installed: regions+feed+tensorboard skipped")
    else:
        sink = cudatimer.sinks.tensorboard(SummaryWriter(folder))
        tb = timer("tensorboard")
        variants["regions+feed+tensorboard"] = (tb, cudatimer.StepFeed(sink, timer=tb).step)
    return variants


def _block(step: Callable[[], None], end: Callable[[], Any], iters: int) -> float:
    """Milliseconds per iteration of ``iters`` steps, the GPU drained at both ends."""
    _measure.sync()
    t0 = time.perf_counter()
    for _ in range(iters):
        step()
        end()
    _measure.sync()
    return (time.perf_counter() - t0) * 1e3 / iters


def _syncs(step: Callable[[], None], end: Callable[[], Any], iters: int) -> dict[str, int]:
    acts = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    step(), end()
    _measure.sync()
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(iters):
            step()
            end()
    _measure.sync()
    counts = dict.fromkeys(_measure.SYNC_NAMES + _measure.OTHER_NAMES, 0)
    for evt in prof.key_averages():
        if evt.key in counts:
            counts[evt.key] += int(evt.count)
    return counts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="tiny GPT on any device: seconds")
    p.add_argument("--rounds", type=int, default=None, help="rounds (default 15; smoke 2)")
    p.add_argument("--iters", type=int, default=None, help="steps per block (20; smoke 2)")
    p.add_argument("--sync-iters", type=int, default=5, help="steps counted under torch.profiler")
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = p.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    rounds = args.rounds or (2 if args.smoke else 15)
    iters = args.iters or (2 if args.smoke else 20)
    wl = _workloads.build("gpt2", device, args.smoke)
    current: list[cudatimer.Timer] = []
    # Every variant's regions go through the same lookup (the current variant's Timer), so
    # the lookup costs all of them the same and the ratios show the feeds alone.
    _measure.wrap_modules(wl.region_modules, lambda name: current[0].region(name))
    with tempfile.TemporaryDirectory() as folder:
        variants = _variants(folder)
        names = list(variants)

        def run(name: str, n: int) -> float:
            timer, end = variants[name]
            current[:] = [timer]
            return _block(wl.step, end, n)

        for name in names:  # warm-up: kernels, pools, the writer's first file
            run(name, max(1, wl.warmup))
        times: dict[str, list[float]] = {n: [] for n in names}
        for r in range(rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            for name in order:
                times[name].append(run(name, iters))
        syncs = {}
        for name in names:
            timer, end = variants[name]
            current[:] = [timer]
            syncs[name] = _syncs(wl.step, end, args.sync_iters)
    base = times[BASE]
    rows = []
    for name in names:
        ratios = [t / b for t, b in zip(times[name], base, strict=True)]
        added = {
            k: (syncs[name][k] - syncs[BASE][k]) / args.sync_iters for k in _measure.SYNC_NAMES
        }
        rows.append(
            {
                "variant": name,
                "ms_per_step_median": statistics.median(times[name]),
                "ratio_median": statistics.median(ratios),
                "ratio_min": min(ratios),
                "ratio_max": max(ratios),
                "added_syncs_per_step": added,
                "event_queries_per_step": syncs[name]["cudaEventQuery"] / args.sync_iters,
            }
        )
    print(f"workload: {wl.description} on {device}; {rounds} rounds of {iters} steps")
    print("| variant | ms/step (median) | vs regions (median [min, max]) | added syncs/step |")
    print("|---|---|---|---|")
    for row in rows:
        added_total = sum(row["added_syncs_per_step"].values())
        print(
            f"| {row['variant']} | {row['ms_per_step_median']:.3f} | "
            f"{row['ratio_median']:.4f}x [{row['ratio_min']:.4f}, {row['ratio_max']:.4f}] | "
            f"{added_total:g} |"
        )
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        meta = {"device": device, "torch": torch.__version__, "smoke": args.smoke}
        args.out.write_text(json.dumps({"meta": meta, "rounds": times, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
