"""Per-region cost of cudatimer's hot path against the floor, in the launch-bound loop.

The loop is 48 x (Linear(256,256) + GELU), batch 32, fp32: ~40 us of CPU work per layer, so
every microsecond a region adds shows. Variants run interleaved (A B C ... per round) and we
take medians over rounds, because the same loop's floor moved 6-12 us per region between runs
(measured on an H200). "added us/region" = (variant - none) / 48; "vs floor" divides that
by the floor's.

    python benchmarks/hotpath.py --rounds 21 --iters 20
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import cudatimer


def build(device: str) -> tuple[list[torch.nn.Module], torch.Tensor]:
    torch.manual_seed(0)
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
    notrace32 = cudatimer.Timer(name="notrace32", trace_samples=0)
    out["no-trace-b32"] = lambda: notrace32.region("layer")
    out["events-only"] = lambda: events.region("layer")
    out["nvtx-only"] = lambda: nvtx_only.region("layer")
    out["disabled"] = lambda: off.region("layer")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=21)
    p.add_argument("--iters", type=int, default=20)
    args = p.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    layers, x = build(device)
    gelu = torch.nn.functional.gelu
    vs = variants(device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    from cudatimer import _cuda, _timer

    def run(make: Callable[[], AbstractContextManager[object]], iters: int) -> float:
        pure = make is vs.get("cudatimer-py")
        b32 = make is vs.get("no-trace-b32")
        batch = _cuda.HARVEST_BATCH
        if b32:
            _cuda.HARVEST_BATCH = 32
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
        _cuda.HARVEST_BATCH = batch
        return dt

    for make in vs.values():  # warm-up: pools, stream entries, cuBLAS
        run(make, 5)
    times: dict[str, list[float]] = {k: [] for k in vs}
    for _ in range(args.rounds):
        for name, make in vs.items():
            times[name].append(run(make, args.iters))
    med = {k: statistics.median(v) for k, v in times.items()}
    base = med["none"]
    floor_add = (med["floor"] - base) / 48 if "floor" in med else float("nan")
    print(f"device={torch.cuda.get_device_name() if device == 'cuda' else 'cpu'} "
          f"torch={torch.__version__} rounds={args.rounds} iters={args.iters} "
          f"compiled={_timer.compiled()} runtime_bound={_cuda.RUNTIME_BOUND}")
    print(f"{'variant':<12} {'ms/iter':>9} {'slowdown':>9} {'us/region':>10} {'vs floor':>9} "
          f"{'spread us/region':>18}")
    for k, v in med.items():
        add = (v - base) / 48 * 1e6
        lo = (min(times[k]) - base) / 48 * 1e6
        hi = (max(times[k]) - base) / 48 * 1e6
        ok = floor_add == floor_add and floor_add > 0
        ratio = add / (floor_add * 1e6) if ok else float("nan")
        print(f"{k:<12} {v * 1e3:9.3f} {v / base:9.3f} {add:10.2f} {ratio:9.2f} "
              f"{lo:8.2f}..{hi:<8.2f}")


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
            print(f"split {label:<20} enter+exit {hot:6.3f} us   "
                  f"resolution {resolve:6.3f} us/sample")
    finally:
        _cuda.HARVEST_BATCH = batch
        t.summary()


if __name__ == "__main__":
    main()
    if torch.cuda.is_available():
        micro()
