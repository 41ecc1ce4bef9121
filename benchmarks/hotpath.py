"""Per-region cost of cudatimer's hot path against the floor, in the launch-bound loop.

The loop is 48 x (Linear(256,256) + GELU), batch 32, fp32: ~35 us of CPU work per layer, so
every microsecond a region adds shows. The same loop's time moves by 20-40% between blocks of
100 ms (measured on an H200), far more than the differences we look for, so:

- every round runs each variant once for ``--iters`` iterations (a few ms), in an order
  rotated by one each round, and a variant's cost in a round is its time minus the unwrapped
  loop's time in that same round (pairs a few ms apart see the same machine state);
- the estimate is the 10% trimmed mean of those paired differences over hundreds of rounds
  (a mean, not a median: a harvest lands in some blocks and not others, and its cost counts),
  with a 95% bootstrap interval for each ratio to the floor (rounds resampled in pairs);
- ``--pin CPU`` pins the process to one core (no migrations; the loop is single-threaded).

"added us/region" = (variant - none) / regions per iteration; "vs floor" divides that by the
floor's. ``--workload compute`` runs the compute-bound loop instead (16 x Linear(4096), batch
8192, bf16), where the question is the slowdown, not the ratio to the floor.

    python benchmarks/hotpath.py --rounds 400 --iters 3 --pin 5
    python benchmarks/hotpath.py --workload compute --rounds 200 --iters 1 --pin 5
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import cudatimer


def build(device: str, workload: str) -> tuple[list[torch.nn.Module], torch.Tensor]:
    """launch: 48 x Linear(256,256), batch 32, fp32 (CPU-bound); compute: 16 x Linear(4096),
    batch 8192, bf16 (GPU-bound: ~0.4 ms of matmul per layer on an H200)."""
    torch.manual_seed(0)
    if workload == "compute":
        bf16 = torch.bfloat16
        big = [torch.nn.Linear(4096, 4096).to(device, bf16) for _ in range(16)]
        return big, torch.randn(8192, 4096, device=device, dtype=bf16)
    layers = [torch.nn.Linear(256, 256).to(device) for _ in range(48)]
    return layers, torch.randn(32, 256, device=device)


class Floor:
    """Two pre-created timing torch.Events re-recorded on a cached stream: nothing else."""

    def __init__(self) -> None:
        self.stream = torch.cuda.current_stream()
        self.a = torch.Event(device="cuda", enable_timing=True)
        self.b = torch.Event(device="cuda", enable_timing=True)

    def __enter__(self) -> None:
        self.a.record(self.stream)

    def __exit__(self, *exc: object) -> None:
        self.b.record(self.stream)


class FloorPool:
    """The floor with distinct events: each region records the next two of 512 pre-recorded
    events (a lazily resolving timer cannot re-record an event before reading it), still no
    stream lookup, no bookkeeping, never read. Separates the cost of cycling through many CUDA
    events from the cost of the timer's own code."""

    def __init__(self, n: int = 512) -> None:
        self.stream = torch.cuda.current_stream()
        self.events = [torch.Event(device="cuda", enable_timing=True) for _ in range(n)]
        for ev in self.events:
            ev.record(self.stream)
        self.i = 0

    def __enter__(self) -> None:
        self.i = i = (self.i + 1) % len(self.events)
        self.events[i].record(self.stream)

    def __exit__(self, *exc: object) -> None:
        self.i = i = (self.i + 1) % len(self.events)
        self.events[i].record(self.stream)


def variants(device: str) -> dict[str, Callable[[], AbstractContextManager[object]]]:
    null = nullcontext()
    out: dict[str, Callable[[], AbstractContextManager[object]]] = {"none": lambda: null}
    if device == "cuda":
        floor = Floor()
        out["floor"] = lambda: floor  # type: ignore[assignment,return-value]
        floor_pool = FloorPool()
        out["floor-pool"] = lambda: floor_pool  # type: ignore[assignment,return-value]
    full = cudatimer.Timer(name="full")
    events = cudatimer.Timer(name="events", mode="events")
    nvtx_only = cudatimer.Timer(name="nvtx", mode="nvtx")
    off = cudatimer.Timer(name="off", enabled=False)
    out["cudatimer"] = lambda: full.region("layer")
    # The same Timer with the compiled event calls switched off (the pure Python path).
    out["cudatimer-py"] = lambda: full.region("layer")
    held = full.region("layer")
    out["cudatimer-held"] = lambda: held  # the Region object kept, not looked up per call
    notrace = cudatimer.Timer(name="notrace", trace_samples=0)
    out["no-trace"] = lambda: notrace.region("layer")
    plain = cudatimer.Timer(name="plain", trace_samples=0, keep_steps=0)
    out["no-trace-steps"] = lambda: plain.region("layer")
    out["events-only"] = lambda: events.region("layer")
    out["nvtx-only"] = lambda: nvtx_only.region("layer")
    out["disabled"] = lambda: off.region("layer")
    return out


def trimmed_mean(values: list[float], cut: float = 0.1) -> float:
    v = sorted(values)
    k = int(len(v) * cut)
    v = v[k : len(v) - k] or v
    return sum(v) / len(v)


def ratio_interval(
    added: list[float], floor: list[float], rng: random.Random, draws: int = 400
) -> tuple[float, float]:
    """95% bootstrap interval of trimmed_mean(added) / trimmed_mean(floor), resampling rounds
    (a round's two values stay together)."""
    n = len(added)
    ratios = []
    for _ in range(draws):
        idx = [rng.randrange(n) for _ in range(n)]
        f = trimmed_mean([floor[i] for i in idx])
        ratios.append(trimmed_mean([added[i] for i in idx]) / f if f > 0 else math.nan)
    ratios.sort()
    return ratios[int(0.025 * draws)], ratios[int(0.975 * draws) - 1]


def mean_interval(values: list[float], rng: random.Random, draws: int = 400) -> tuple[float, float]:
    """95% bootstrap interval of trimmed_mean(values), resampling rounds."""
    n = len(values)
    means = sorted(trimmed_mean([values[rng.randrange(n)] for _ in range(n)]) for _ in range(draws))
    return means[int(0.025 * draws)], means[int(0.975 * draws) - 1]


def main() -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=400)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--pin", type=int, default=None, help="pin the process to this CPU core")
    p.add_argument("--workload", choices=("launch", "compute"), default="launch")
    args = p.parse_args()
    if args.pin is not None:
        os.sched_setaffinity(0, {args.pin})
    device = "cuda" if torch.cuda.is_available() else "cpu"
    layers, x = build(device, args.workload)
    n = len(layers)
    gelu = torch.nn.functional.gelu
    vs = variants(device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    from cudatimer import _cuda, _timer

    def run(make: Callable[[], AbstractContextManager[object]], iters: int) -> float:
        pure = make is vs.get("cudatimer-py")
        compiled = _timer.compiled()
        if pure:
            _timer.use_compiled(False)
        sync()
        t0 = time.perf_counter()
        for _ in range(iters):
            y = x
            for layer in layers:
                with make():
                    y = gelu(layer(y))
        sync()
        dt = (time.perf_counter() - t0) / iters
        if pure:
            _timer.use_compiled(compiled)
        return dt

    for make in vs.values():  # warm-up: pools, stream entries, cuBLAS
        run(make, 5)
        run(make, 5)
    keys = list(vs)
    times: dict[str, list[float]] = {k: [] for k in keys}
    gc.collect()
    gc.freeze()  # no collection inside a block
    gc.disable()
    try:
        for r in range(args.rounds):
            k = r % len(keys)
            for name in keys[k:] + keys[:k]:
                times[name].append(run(vs[name], args.iters))
    finally:
        gc.enable()
        gc.unfreeze()
    base = times["none"]
    added = {
        k: [(a - b) / n * 1e6 for a, b in zip(v, base, strict=True)] for k, v in times.items()
    }
    floor = added.get("floor")
    floor_us = trimmed_mean(floor) if floor else math.nan
    rng = random.Random(0)
    print(
        f"device={torch.cuda.get_device_name() if device == 'cuda' else 'cpu'} "
        f"torch={torch.__version__} workload={args.workload} rounds={args.rounds} "
        f"iters={args.iters} pin={args.pin} "
        f"compiled={_timer.compiled()} runtime_bound={_cuda.RUNTIME_BOUND}"
    )
    print(
        f"unwrapped loop: {statistics.median(base) * 1e3:.3f} ms/iter (median); "
        "added us/region: 10% trimmed mean of per-round paired differences"
    )
    print(
        f"{'variant':<16} {'slowdown':>9} {'95% interval':>14} {'us/region':>10} "
        f"{'vs floor':>9} {'95% interval':>14}"
    )
    for k in keys[1:]:
        us = trimmed_mean(added[k])
        if floor and k != "floor":
            lo, hi = ratio_interval(added[k], floor, rng)
            ci = f"{lo:.2f}-{hi:.2f}"
        else:
            ci = ""
        slow = [a / b for a, b in zip(times[k], base, strict=True)]
        s_lo, s_hi = mean_interval(slow, rng)
        print(
            f"{k:<16} {trimmed_mean(slow):9.4f} {f'{s_lo:.4f}-{s_hi:.4f}':>14} {us:10.2f} "
            f"{us / floor_us:9.2f} {ci:>14}"
        )
    return str(args.workload)


def micro(n: int = 20000) -> None:
    """Per-call cost of the primitives on an idle GPU (outside the loop), in us."""
    stream = torch.cuda.current_stream()
    dev = torch.cuda.current_device()
    ev = [torch.Event(device="cuda", enable_timing=True) for _ in range(2)]
    cev = torch.cuda.Event(enable_timing=True)
    t = cudatimer.Timer(name="micro", trace_samples=0)
    r = t.region("m")
    get_stream = torch._C._cuda_getCurrentStream
    cases: dict[str, Callable[[], object]] = {
        "getCurrentStream": lambda: get_stream(dev),
        "getDevice": torch._C._cuda_getDevice,
        "Event.record(stream)": lambda: ev[0].record(stream),
        "Event.record()": lambda: ev[0].record(),
        "cuda.Event.record(stream)": lambda: cev.record(stream),
        "Event.query": lambda: ev[0].query(),
        "elapsed_time": lambda: ev[0].elapsed_time(ev[1]),
        "is_compiling": torch.compiler.is_compiling,
    }

    def region() -> None:
        with r:
            pass

    cases["cudatimer enter+exit"] = region
    from cudatimer import _cuda

    entry = _cuda.BACKEND.entries[torch._C._cuda_getCurrentStream(-1)]
    if _cuda.RUNTIME_BOUND:
        from cudatimer import _speedups  # type: ignore[attr-defined]

        def take_compiled() -> None:
            entry.pool.append(_speedups.take_record(entry))

        cases["take_record (compiled)"] = take_compiled
        cases["elapsed_ms (compiled)"] = lambda: _speedups.elapsed_ms(ev[0], ev[1])

    def take_python() -> None:
        entry.pool.append(entry.take_recorded())

    cases["take_recorded (Python)"] = take_python
    ev[1].record(stream)
    torch.cuda.synchronize()
    for name, fn in cases.items():
        for _ in range(200):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        dt = (time.perf_counter() - t0) / n * 1e6
        torch.cuda.synchronize()
        print(f"micro {name:<28} {dt:7.3f} us")
    t0 = time.perf_counter()
    s = t.summary()
    print(f"micro summary after {s['m'].calls} regions: {(time.perf_counter() - t0) * 1e3:.1f} ms")
    split(n)


def split(n: int) -> None:
    """Hot path alone (harvesting held off) and resolution per sample, for two Timer setups."""
    from cudatimer import _cuda

    batch = _cuda.HARVEST_BATCH
    _cuda.HARVEST_BATCH = 10**9  # read by both paths when they set their next harvest point
    try:
        for label, kwargs in (
            ("defaults", {}),
            ("no steps, no trace", {"keep_steps": 0, "trace_samples": 0}),
        ):
            t = cudatimer.Timer(name=f"split-{label}", **kwargs)
            r = t.region("m")
            for _ in range(2):  # the first pass fills the event pool, the second is measured
                with r:
                    pass
                t.summary()  # a harvest: the next one is HARVEST_BATCH samples away
                for entry in _cuda.BACKEND.entries.values():
                    entry.check_at = 10**9
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(n):
                    with r:
                        pass
                hot = (time.perf_counter() - t0) / n * 1e6
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                t.summary()
                resolve = (time.perf_counter() - t0) / n * 1e6
            print(
                f"split {label:<20} enter+exit {hot:6.3f} us   resolution {resolve:6.3f} us/sample"
            )
    finally:
        _cuda.HARVEST_BATCH = batch
        t.summary()


if __name__ == "__main__":
    if main() == "launch" and torch.cuda.is_available():
        micro()
