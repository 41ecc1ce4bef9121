"""How large and how fast the HTML report is for a long run: 10^4 steps of 200 regions.

Builds the run's records directly (a Summary with one StepStats per step and region, 2e6 of
them, as ``Timer(keep_steps=10_000)`` would keep; numbers drawn from a seeded generator), then
times ``cudatimer.html(path, summary=run)``, rendering and writing the file, best of
``--repeat``, and prints the file's size. Targets: <= 5 MB, <= 2 s.

    python benchmarks/html_report.py                     # 200 regions, 10^4 steps
    python benchmarks/html_report.py --steps 100 --regions 20 --out small.html
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import cudatimer
from cudatimer import Histogram, RegionStats, StepStats, Summary

TARGET_MB, TARGET_S = 5.0, 2.0


def synthetic_run(regions: int, steps: int, seed: int = 0) -> Summary:
    """``regions`` regions called once per step for ``steps`` steps: a host-clock ``data``
    region and a GPU-timed ``train_step`` holding blocks holding layers, each parent's time
    a little over the sum of its children's (the numbers come from a seeded generator)."""
    rng = random.Random(seed)
    tree: dict[str, list[str]] = {"train_step": []}
    width = max(1, round((regions - 2) ** 0.5))  # 200 regions: 14 blocks of 13 layers
    count, block = 2, 0
    while count < regions:
        name = f"train_step/block{block}"
        tree["train_step"].append(name)
        tree[name] = []
        count += 1
        for layer in range(width - 1):
            if count == regions:
                break
            tree[name].append(f"{name}/layer{layer}")
            count += 1
        block += 1
    scale = {n: rng.uniform(0.05, 0.5) for kids in tree.values() for n in kids}
    cpu: dict[str, list[float]] = {}
    gpu: dict[str, list[float]] = {}

    def fill(name: str) -> None:  # children first: a parent covers them
        for kid in tree.get(name, []):
            fill(kid)
        kids = tree.get(name, [])
        if kids:
            gpu[name] = [1.03 * sum(gpu[k][i] for k in kids) for i in range(steps)]
        else:
            gpu[name] = [scale[name] * rng.uniform(0.9, 1.3) for _ in range(steps)]
        cpu[name] = [v * rng.uniform(0.6, 1.0) for v in gpu[name]]

    fill("train_step")
    names = ["train_step", *(n for kids in tree.values() for n in kids)]
    names.sort(key=lambda n: n.split("/"))  # parents before children, as a Timer orders them
    records = [
        RegionStats(
            n, "cuda:0", steps, Histogram.of(gpu[n]), Histogram.of(cpu[n]), depth=n.count("/")
        )
        for n in names
    ]
    data = [rng.uniform(0.5, 3.0) for _ in range(steps)]
    records.append(RegionStats("data", "host", steps, None, Histogram.of(data)))
    rows = []
    for k in range(steps):
        rows.append(StepStats(k, "data", "host", 1, None, data[k]))
        rows += [StepStats(k, n, "cuda:0", 1, gpu[n][k], cpu[n][k]) for n in names]
    meta = (("timer", "synthetic"), ("torch", "n/a"))
    return Summary(regions=tuple(records), steps=steps, meta=meta, step_stats=tuple(rows))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--regions", type=int, default=200)
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", help="where to write the page (default: a temporary file)")
    args = parser.parse_args()
    # cudatimer.html goes through the default Timer, whose first use imports torch (2-4 s):
    # loaded here, so that the timings below are the page's alone, as they were when the
    # package imported torch at import.
    cudatimer.default_timer()
    t0 = time.perf_counter()
    run = synthetic_run(args.regions, args.steps)
    built_s = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or os.path.join(tmp, "report.html")
        times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            cudatimer.html(out, summary=run)
            times.append(time.perf_counter() - t0)
        size_mb = os.path.getsize(out) / 1e6
    best = min(times)
    print(
        f"html report: {args.regions} regions, {args.steps} steps "
        f"({len(run.step_stats)} step rows, built in {built_s:.1f} s): "
        f"{size_mb:.2f} MB in {best:.2f} s (best of {args.repeat}: "
        f"{', '.join(f'{t:.2f}' for t in times)} s); targets <= {TARGET_MB:g} MB, "
        f"<= {TARGET_S:g} s"
    )
    met = size_mb <= TARGET_MB and best <= TARGET_S
    print("targets met" if met else "targets NOT met")
    return 0


if __name__ == "__main__":
    sys.exit(main())
