"""What publishing a run for ``cudatimer watch`` (``cudatimer.live``) costs, and how soon a
finished step shows.

**Cost.** One instrumented training loop runs as two variants interleaved round by round
(A B, B A, ...), each block some seconds long (several of the publisher's writes), ending in
one synchronize:

- ``regions``: a region around every module's forward and ``timer.step()`` (the baseline);
- ``regions+live``: the same with ``cudatimer.live(path, timer=...)`` publishing that Timer
  (started before the block, closed after it: its first and final writes are outside).

Each variant has its own Timer (a publisher reads only its own). Workloads: ``launch`` (48 x
(Linear(256)+GELU), batch 32, forward only: the CPU benchmark loop, launch-bound on a GPU)
and ``gpt2`` (12-layer GPT-2 small, batch 8 x 512, bf16 autocast, AdamW: training). The goal:
a median ratio <= 1.005.

**Latency.** Steps of a given length (``--latency-steps``, sleeps plus the workload) run with
``live(every_s=1.0)`` while a reader thread checks the file ten times a second, as ``watch``
does; per step, the time from its end (on a GPU: after a synchronize, so the GPU has finished
it) to the first read of a file holding it. The goal: <= 2 s for steps shorter than 1 s.

Usage::

    python benchmarks/live_overhead.py --workload launch --out live_cpu.json   # CPU
    python benchmarks/live_overhead.py --workload gpt2 --out results/live_gpu.json     # H200
    python benchmarks/live_overhead.py --smoke                                         # seconds
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _measure
import _workloads
import torch
import torch.nn.functional as F

import cudatimer
from cudatimer.render._livefile import read_live

BASE, LIVE = "regions", "regions+live"


def _gpt2_b8x512(device: str) -> _workloads.Workload:
    """GPT-2 small at batch 8 x 512 (the GPU target's training step), on _workloads' model."""
    cfg, batch = _workloads.GPTConfig(seq=512), 8
    model = _workloads.GPT(cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device == "cuda" or None)
    idx = torch.randint(0, cfg.vocab, (batch, cfg.seq), device=device)
    tgt = torch.randint(0, cfg.vocab, (batch, cfg.seq), device=device)
    autocast = (
        torch.autocast(device_type="cuda", dtype=torch.bfloat16) if device == "cuda" else None
    )

    def step() -> None:
        if autocast is not None:
            with autocast:
                logits = model(idx)
                loss = F.cross_entropy(logits.view(-1, logits.size(-1)), tgt.view(-1))
        else:
            logits = model(idx)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), tgt.view(-1))
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
        opt.zero_grad(set_to_none=True)

    return _workloads.Workload(
        name="gpt2",
        description="GPT-2 small (12 x 768), batch 8 x 512, AdamW"
        + (", bf16 autocast" if device == "cuda" else ""),
        step=step,
        region_modules=[
            (n, m)
            for n, m in model.named_modules()
            if n and not isinstance(m, (torch.nn.ModuleList, torch.nn.ModuleDict))
        ],
        iters=3,
        warmup=2,
        rounds=12,
    )


def _block(step: Callable[[], None], seconds: float, per_s: float) -> tuple[float, float]:
    """(wall ms, process CPU ms) per step of a block of about ``seconds`` (``per_s``: steps
    per second measured before, so the block is a fixed number of steps: the same work both
    ways). The process's CPU time adds the publishing thread's own to the loop's and leaves
    out the time other processes took the cores: on a loaded machine, where wall time
    scatters by +-30%, it is what shows the publisher's cost."""
    n = max(3, round(seconds * per_s))
    _measure.sync()
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(n):
        step()
    _measure.sync()
    return (time.perf_counter() - t0) * 1e3 / n, (time.process_time() - c0) * 1e3 / n


def cost(wl: _workloads.Workload, rounds: int, block_s: float, folder: str) -> dict[str, Any]:
    timers = {BASE: cudatimer.Timer(name=BASE), LIVE: cudatimer.Timer(name=LIVE)}
    current: list[cudatimer.Timer] = [timers[BASE]]
    # Both variants' regions go through the same lookup (the current variant's Timer).
    undo = _measure.wrap_modules(wl.region_modules, lambda name: current[0].region(name))

    def step(timer: cudatimer.Timer) -> Callable[[], None]:
        def one() -> None:
            with timer.region("train_step"):
                wl.step()
            timer.step()

        return one

    steps = {name: step(t) for name, t in timers.items()}
    for name in timers:  # warm-up, and the step rate the blocks are sized by
        current[:] = [timers[name]]
        for _ in range(max(2, wl.warmup)):
            steps[name]()
    current[:] = [timers[BASE]]
    _measure.sync()
    t0 = time.perf_counter()
    for _ in range(5):
        steps[BASE]()
    _measure.sync()
    per_s = 5 / (time.perf_counter() - t0)
    times: dict[str, list[float]] = {BASE: [], LIVE: []}
    cpu: dict[str, list[float]] = {BASE: [], LIVE: []}
    duty: list[float] = []  # the publishing thread's CPU time over the block's wall time
    path = os.path.join(folder, "live.json")
    for r in range(rounds):
        for name in (BASE, LIVE) if r % 2 == 0 else (LIVE, BASE):
            current[:] = [timers[name]]
            pub = cudatimer.live(path, timer=timers[name]) if name == LIVE else None
            t0 = time.perf_counter()
            ms, cpu_ms = _block(steps[name], block_s, per_s)
            if pub is not None:
                duty.append(pub.busy_s / (time.perf_counter() - t0))
                pub.close()
            times[name].append(ms)
            cpu[name].append(cpu_ms)
    undo()
    ratios = [b / a for a, b in zip(times[BASE], times[LIVE], strict=True)]
    cpu_ratios = [b / a for a, b in zip(cpu[BASE], cpu[LIVE], strict=True)]
    return {
        "publisher_duty_median": statistics.median(duty),
        "publisher_duty_max": max(duty),
        "cpu_ms_per_step": {k: statistics.median(v) for k, v in cpu.items()},
        "cpu_ratio_median": statistics.median(cpu_ratios),
        "cpu_ratio_min": min(cpu_ratios),
        "cpu_ratio_max": max(cpu_ratios),
        "cpu_rounds": cpu,
        "steps_per_s": per_s,
        "block_steps": max(3, round(block_s * per_s)),
        "ms_per_step": {k: statistics.median(v) for k, v in times.items()},
        "ratio_median": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "rounds": times,
        "regions_per_step": len(wl.region_modules) + 1,
    }


def latency(wl: _workloads.Workload, step_s: float, steps: int, folder: str) -> dict[str, Any]:
    """Seconds from each step's end to the first read of a file that holds it."""
    timer = cudatimer.Timer(name=f"latency-{step_s}")
    undo = _measure.wrap_modules(wl.region_modules, timer.region)
    path = Path(folder) / f"latency-{step_s}.json"
    ended: dict[int, float] = {}
    seen: dict[int, float] = {}
    stop = threading.Event()

    def reader() -> None:  # what watch does: a look at the file ten times a second
        last = 0
        while not stop.wait(0.1):
            try:
                f = read_live(path)
            except (OSError, ValueError):
                continue
            now = time.time()
            if f.finished > last:
                for k in range(last, f.finished):
                    seen.setdefault(k, now)
                last = f.finished

    pub = cudatimer.live(path, timer=timer)
    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    try:
        for k in range(steps):
            t0 = time.perf_counter()
            with timer.region("train_step"):
                wl.step()
                left = step_s - (time.perf_counter() - t0)
                if left > 0:
                    time.sleep(left)
            _measure.sync()  # the GPU has finished the step: its end is now
            ended[k] = time.time()
            timer.step()
        time.sleep(2.5)
    finally:
        stop.set()
        thread.join()
        pub.close()
        undo()
    lat = [seen[k] - ended[k] for k in ended if k in seen]
    return {
        "step_s": step_s,
        "steps": steps,
        "seen": len(lat),
        "median_s": statistics.median(lat) if lat else None,
        "p90_s": sorted(lat)[int(0.9 * (len(lat) - 1))] if lat else None,
        "max_s": max(lat) if lat else None,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--workload", choices=("launch", "gpt2"), default="launch")
    p.add_argument("--smoke", action="store_true", help="tiny loop, 2 rounds: seconds")
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 12)")
    p.add_argument("--block-s", type=float, default=None, help="seconds a block (default 4)")
    p.add_argument(
        "--latency-steps",
        type=float,
        nargs="*",
        default=None,
        help="step lengths in s for the latency (default 0.2 0.9)",
    )
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = p.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        # 2 shared cores: torch's intra-op threads fought the other processes (the launch
        # loop read 464 ms/step with them, 14 ms with one thread).
        torch.set_num_threads(1)
    rounds = args.rounds or (2 if args.smoke else 12)
    block_s = args.block_s or (1.0 if args.smoke else 4.0)
    if args.workload == "gpt2" and not args.smoke:
        wl = _gpt2_b8x512(device)
    else:
        wl = _workloads.build(args.workload, device, args.smoke)
    lat_steps = args.latency_steps if args.latency_steps is not None else [0.2, 0.9]
    with tempfile.TemporaryDirectory() as folder:
        result = cost(wl, rounds, block_s, folder)
        lat = [latency(wl, s, 4 if args.smoke else 12, folder) for s in lat_steps]
    print(f"workload: {wl.description} on {device}; {rounds} rounds of {block_s:g} s blocks")
    print(f"({result['block_steps']} steps each, {result['regions_per_step']} regions a step)")
    print("| variant | wall ms/step | vs regions (median [min, max]) | CPU ms/step | vs regions |")
    print("|---|---|---|---|---|")
    print(
        f"| {BASE} | {result['ms_per_step'][BASE]:.3f} | 1 | "
        f"{result['cpu_ms_per_step'][BASE]:.3f} | 1 |"
    )
    print(
        f"| {LIVE} | {result['ms_per_step'][LIVE]:.3f} | {result['ratio_median']:.4f}x "
        f"[{result['ratio_min']:.4f}, {result['ratio_max']:.4f}] | "
        f"{result['cpu_ms_per_step'][LIVE]:.3f} | {result['cpu_ratio_median']:.4f}x "
        f"[{result['cpu_ratio_min']:.4f}, {result['cpu_ratio_max']:.4f}] |"
    )
    print(
        f"publishing thread's own CPU time over the block's wall time: median "
        f"{result['publisher_duty_median']:.3%}, max {result['publisher_duty_max']:.3%}"
    )
    print("| step length | steps seen | step end -> in the file (median / p90 / max) |")
    print("|---|---|---|")
    for row in lat:
        if row["median_s"] is None:
            print(f"| {row['step_s']:g} s | 0 of {row['steps']} | - |")
            continue
        print(
            f"| {row['step_s']:g} s | {row['seen']} of {row['steps']} | {row['median_s']:.2f} / "
            f"{row['p90_s']:.2f} / {row['max_s']:.2f} s |"
        )
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        meta = {
            "device": device,
            "torch": torch.__version__,
            "core": "c" if cudatimer.compiled() else "python",
            "workload": wl.description,
            "smoke": args.smoke,
            "python": sys.version.split()[0],
        }
        args.out.write_text(json.dumps({"meta": meta, "cost": result, "latency": lat}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
