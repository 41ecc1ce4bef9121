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

cudatimer chooses its core once, at import, so ``cudatimer-py`` (the pure-Python core) is
measured by a second run of this script, after this one's rounds, in a process started with
CUDATIMER_PURE_PYTHON=1: its own none, floor and cudatimer rounds, and its row reads against
that process's none and floor.

    python benchmarks/hotpath.py --rounds 400 --iters 3 --pin 5
    python benchmarks/hotpath.py --workload compute --rounds 200 --iters 1 --pin 5
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import cudatimer
from cudatimer.core import _core, _device


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


def variants(
    device: str, pure_child: bool = False
) -> dict[str, Callable[[], AbstractContextManager[object]]]:
    """Every variant; ``pure_child``: only what the pure-Python core's process measures (its
    none, floor and cudatimer)."""
    null = nullcontext()
    out: dict[str, Callable[[], AbstractContextManager[object]]] = {"none": lambda: null}
    if device == "cuda":
        floor = Floor()
        out["floor"] = lambda: floor  # type: ignore[assignment,return-value]
        if not pure_child:
            floor_pool = FloorPool()
            out["floor-pool"] = lambda: floor_pool  # type: ignore[assignment,return-value]
    full = cudatimer.Timer(name="full")
    out["cudatimer"] = lambda: full.region("layer")
    if pure_child:
        return out
    events = cudatimer.Timer(name="events", mode="events")
    nvtx_only = cudatimer.Timer(name="nvtx", mode="nvtx")
    off = cudatimer.Timer(name="off", enabled=False)
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


PURE_ROW = "cudatimer-py"  # the pure-Python core's cudatimer, from its own process


def measure_pure(args: argparse.Namespace) -> dict[str, list[float]] | str:
    """Run this script again in a process started with CUDATIMER_PURE_PYTHON=1 (its none,
    floor and cudatimer rounds); its per-round times, or why there are none."""
    with tempfile.TemporaryDirectory(prefix="hotpath-") as d:
        path = Path(d) / "pure.json"
        argv = [sys.executable, str(Path(__file__).resolve()), "--pure-child", str(path)]
        argv += ["--rounds", str(args.rounds), "--iters", str(args.iters)]
        argv += ["--workload", args.workload]
        if args.pin is not None:
            argv += ["--pin", str(args.pin)]
        env = {**os.environ, "CUDATIMER_PURE_PYTHON": "1"}
        done = subprocess.run(argv, env=env, capture_output=True, text=True)
        if done.returncode != 0 or not path.exists():
            tail = " | ".join(done.stderr.strip().splitlines()[-3:])
            return f"its process exited with rc {done.returncode}: {tail}"
        data = json.loads(path.read_text())
    if data.get("core") != "python":
        return f"its process ran the {data.get('core')} core, not the Python one"
    times: dict[str, list[float]] = data["times"]
    return times


def main() -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=400)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--pin", type=int, default=None, help="pin the process to this CPU core")
    p.add_argument("--workload", choices=("launch", "compute"), default="launch")
    p.add_argument(
        "--pure-child",
        type=Path,
        default=None,
        metavar="JSON",
        help="internal: this process runs the pure-Python core (started with "
        "CUDATIMER_PURE_PYTHON=1); measure none, floor and cudatimer, write the times to JSON",
    )
    args = p.parse_args()
    child = args.pure_child is not None
    if child and _core.IMPL != "python":
        raise SystemExit("--pure-child: start this process with CUDATIMER_PURE_PYTHON=1")
    if args.pin is not None:
        os.sched_setaffinity(0, {args.pin})
    device = "cuda" if torch.cuda.is_available() else "cpu"
    layers, x = build(device, args.workload)
    n = len(layers)
    gelu = torch.nn.functional.gelu
    vs = variants(device, pure_child=child)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def run(make: Callable[[], AbstractContextManager[object]], iters: int) -> float:
        sync()
        t0 = time.perf_counter()
        for _ in range(iters):
            y = x
            for layer in layers:
                with make():
                    y = gelu(layer(y))
        sync()
        return (time.perf_counter() - t0) / iters

    for make in vs.values():  # warm-up: pools, stream records, cuBLAS
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
    if child:
        args.pure_child.write_text(json.dumps({"core": _core.IMPL, "times": times}))
        return "pure-child"  # its parent prints the rows (and runs the micro-benchmarks)
    pure = measure_pure(args)  # after this process's rounds: never two loops at once
    base = times["none"]
    added = {k: [(a - b) / n * 1e6 for a, b in zip(v, base, strict=True)] for k, v in times.items()}
    floor = added.get("floor")
    rng = random.Random(0)
    print(
        f"device={torch.cuda.get_device_name() if device == 'cuda' else 'cpu'} "
        f"torch={torch.__version__} workload={args.workload} rounds={args.rounds} "
        f"iters={args.iters} pin={args.pin} "
        f"core={_core.IMPL} compiled={cudatimer.compiled()} "
        f"runtime_bound={_core.runtime_bound()}"
    )
    print(
        f"unwrapped loop: {statistics.median(base) * 1e3:.3f} ms/iter (median); "
        "added us/region: 10% trimmed mean of per-round paired differences"
    )
    print(
        f"{'variant':<16} {'slowdown':>9} {'95% interval':>14} {'us/region':>10} "
        f"{'vs floor':>9} {'95% interval':>14}"
    )

    def row(k: str, own: list[float], none: list[float], floor_added: list[float] | None) -> None:
        mine = [(a - b) / n * 1e6 for a, b in zip(own, none, strict=True)]
        us = trimmed_mean(mine)
        f_us = trimmed_mean(floor_added) if floor_added else math.nan
        if floor_added and k != "floor":
            lo, hi = ratio_interval(mine, floor_added, rng)
            ci = f"{lo:.2f}-{hi:.2f}"
        else:
            ci = ""
        slow = [a / b for a, b in zip(own, none, strict=True)]
        s_lo, s_hi = mean_interval(slow, rng)
        print(
            f"{k:<16} {trimmed_mean(slow):9.4f} {f'{s_lo:.4f}-{s_hi:.4f}':>14} {us:10.2f} "
            f"{us / f_us:9.2f} {ci:>14}"
        )

    for k in keys[1:]:
        row(k, times[k], base, floor)
        if k == "cudatimer" and not isinstance(pure, str):
            # Against its own process's none and floor (paired within that process's rounds).
            p_none = pure["none"]
            p_floor = pure.get("floor")
            p_added = (
                [(a - b) / n * 1e6 for a, b in zip(p_floor, p_none, strict=True)]
                if p_floor
                else None
            )
            row(PURE_ROW, pure["cudatimer"], p_none, p_added)
    if isinstance(pure, str):  # every other row is printed; the run still fails
        raise SystemExit(f"{PURE_ROW} was not measured: {pure}")
    print(
        f"({PURE_ROW}: the pure-Python core, measured in a process started with "
        "CUDATIMER_PURE_PYTHON=1, against that process's own none and floor)"
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
    region()  # the current stream's record exists from the first region on
    rec = _core.stream_of(torch._C._cuda_getCurrentStream(-1))
    assert rec is not None

    def take() -> None:  # a pooled event recorded now (through the runtime where bound)
        rec.give(rec.take())

    def take_torch() -> None:  # the same through torch's record
        rec.give(rec.take(True))

    cases[f"StreamRec.take ({_core.IMPL})"] = take
    cases[f"StreamRec.take(torch) ({_core.IMPL})"] = take_torch
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
    # The core reads it when it sets a stream's next harvest point (at each harvest).
    _device.configure_core(harvest_batch=10**9)
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
                t.summary()  # a harvest: the next one is 10**9 samples away on every stream
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
        _device.configure_core()
        t.summary()  # harvest points back to HARVEST_BATCH samples away


if __name__ == "__main__":
    if main() == "launch" and torch.cuda.is_available():
        micro()
