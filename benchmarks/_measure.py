"""How the benchmark measures: interleaved timed blocks, synchronizations counted under
torch.profiler, resident memory after many regions, report time, the cost per region with the
resolution included, and event-vs-CUPTI accuracy. GPU clocks are never locked or changed: the
GPU runs as users run it, and the interleaving and pairing absorb its drift."""

from __future__ import annotations

import gc
import json
import math
import os
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from _timers import SkipTimer, TimerAdapter, TimerSpec
from _workloads import Workload
from torch import nn

Log = Callable[[str], None]


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".strip()


# -- wrapping modules -----------------------------------------------------------------------------


def _wrapper(forward: Callable[..., Any], name: str, region: Any) -> Callable[..., Any]:
    def timed_forward(*args: Any, **kwargs: Any) -> Any:
        with region(name):
            return forward(*args, **kwargs)

    return timed_forward


def wrap_modules(modules: list[tuple[str, nn.Module]], region: Any) -> Callable[[], None]:
    """Put ``with region(name):`` around each module's forward (an instance attribute that
    shadows the class's forward, which is what ``Module.__call__`` looks up); return the undo."""
    wrapped: list[nn.Module] = []
    try:
        for name, module in modules:
            module.forward = _wrapper(module.forward, name, region)
            wrapped.append(module)
    except BaseException:
        _unwrap(wrapped)
        raise
    return lambda: _unwrap(wrapped)


def install(wl: Workload, adapter: TimerAdapter) -> Callable[[], None] | None:
    """Wrap ``wl``'s modules for ``adapter`` (its own way if it has one); return the undo."""
    if not adapter.wraps:
        return None
    own = adapter.wrap_modules(wl.region_modules)
    return own if own is not None else wrap_modules(wl.region_modules, adapter.region)


def _unwrap(modules: list[nn.Module]) -> None:
    for module in modules:
        module.__dict__.pop("forward", None)


def count_regions(wl: Workload) -> int:
    """Run one step with a counting wrapper: regions per iteration, measured, not assumed."""
    n = 0

    class _Count:
        def __enter__(self) -> None:
            nonlocal n
            n += 1

        def __exit__(self, *exc: object) -> None:
            return None

    counter = _Count()
    undo = wrap_modules(wl.region_modules, lambda name: counter)
    try:
        wl.step()
    finally:
        undo()
    sync()
    return n


# -- interleaved timing ---------------------------------------------------------------------------


@dataclass
class TimerRun:
    """One timer on one workload."""

    key: str
    status: str = "ok"  # ok | skipped | error
    reason: str = ""
    recorded_regions: int = 0  # what the timer says it recorded (sanity: it was really on)
    recorded_known: bool = False
    trace: str = ""


@dataclass
class WorkloadRun:
    name: str
    description: str
    regions_per_iter: int
    iters: int
    warmup: int
    rounds_planned: int
    timers: dict[str, TimerRun] = field(default_factory=dict)
    # One dict per round: timer key -> milliseconds per iteration.
    rounds: list[dict[str, float]] = field(default_factory=list)
    orders: list[list[str]] = field(default_factory=list)
    seconds: float = 0.0
    #: The unwrapped step time that set ``iters`` (None: iters fixed, not calibrated).
    calibrated_step_ms: float | None = None
    #: Peak GPU memory allocated by the workload (None: no CUDA).
    peak_mem_gb: float | None = None
    #: "main", or the timer whose own process measured this (e.g. "proton").
    process: str = "main"


@dataclass
class SeparateProcess:
    """What a timer's own child process measured (Proton: CUPTI takes one subscriber per
    process, so it cannot run where torch.profiler runs). ``runs`` hold that process's own
    none/floor/cudatimer blocks next to the timer's: its rows read against them."""

    key: str
    why: str
    runs: dict[str, WorkloadRun] = field(default_factory=dict)  # by workload name
    checks: dict[str, dict[str, Any]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    error: str | None = None  # why it measured nothing (or stopped early)
    check_error: str | None = None  # the exact error of its quick check, if that failed
    rc: int | None = None
    seconds: float = 0.0
    path: str = ""  # its JSON file, next to results.json


def run_from_dict(d: dict[str, Any]) -> WorkloadRun:
    """A WorkloadRun back from ``dataclasses.asdict`` output (a child process's JSON)."""
    known = {f for f in WorkloadRun.__dataclass_fields__}
    data = {k: v for k, v in d.items() if k in known}
    data["timers"] = {k: TimerRun(**t) for k, t in d.get("timers", {}).items()}
    return WorkloadRun(**data)


def calibrate_iters(wl: Workload, min_s: float = 0.3, max_steps: int = 200) -> float:
    """Time the unwrapped step (after the caller's warm-up) and set ``wl.iters`` so a timed
    block lasts about ``wl.block_ms`` (never fewer than the workload's own ``iters``, never more
    than ``max_iters``). Returns the measured step time in ms."""
    sync()
    steps = 0
    t0 = time.perf_counter()
    while True:
        wl.step()
        steps += 1
        if steps % 2 == 0 or steps >= max_steps:
            sync()
            if time.perf_counter() - t0 >= min_s or steps >= max_steps:
                break
    step_ms = (time.perf_counter() - t0) * 1e3 / steps
    want = math.ceil(wl.block_ms / max(step_ms, 1e-3))
    wl.iters = max(wl.iters, min(wl.max_iters, want))
    return step_ms


@contextmanager
def _session(wl: Workload, adapter: TimerAdapter) -> Iterator[None]:
    """The workload wrapped by ``adapter`` with its session started (collected garbage first,
    so no collection lands inside); stopped and unwrapped on the way out, also on errors."""
    undo = install(wl, adapter)
    try:
        gc.collect()
        adapter.start_round()
        try:
            yield
        finally:
            adapter.end_round()
    finally:
        if undo is not None:
            undo()


def _timed_block(wl: Workload, adapter: TimerAdapter, iters: int | None = None) -> float:
    """One block: wrap, start the timer's session, warm up, time ``iters`` steps (default
    ``wl.iters``), stop, unwrap. Milliseconds per iteration, GPU work included (synchronized
    before and after)."""
    iters = wl.iters if iters is None else iters
    with _session(wl, adapter):
        for _ in range(wl.warmup):
            wl.step()
        sync()
        t0 = time.perf_counter()
        for _ in range(iters):
            wl.step()
        sync()
        dt = time.perf_counter() - t0
    return dt * 1e3 / iters


def _drain(run: WorkloadRun, adapters: dict[str, TimerAdapter], log: Log) -> None:
    """Resolve and free what each timer accumulated, outside the timed blocks."""
    for key, adapter in adapters.items():
        tr = run.timers[key]
        if tr.status != "ok":
            continue
        try:
            n = adapter.drain()
        except Exception as exc:
            tr.status, tr.reason, tr.trace = "error", f"drain: {error_text(exc)}", _tb()
            log(f"  {key}: drain failed: {tr.reason}")
            continue
        if n is not None:
            tr.recorded_regions += n
            tr.recorded_known = True


def _tb() -> str:
    return traceback.format_exc(limit=8)


def run_interleaved(
    wl: Workload,
    specs: list[TimerSpec],
    build: Callable[[TimerSpec], TimerAdapter],
    skips: dict[str, str],
    log: Log,
    drain_every: int = 3,
    deadline: float | None = None,
    min_rounds: int = 3,
    warm_blocks: bool = True,
) -> WorkloadRun:
    """Time every timer on ``wl``: round r runs each timer's block once, in an order rotated by
    r (A B C, B C A, ...), so drift and position effects spread evenly over the timers. Past
    ``deadline`` (a perf_counter time) no new round starts once ``min_rounds`` are done.

    With ``warm_blocks``, each timer first runs one untimed block (warm-up + 1 step, results
    dropped): first-use costs (event pools, NVTX string registration, a profiler's first
    session, lazy imports) stay out of round 1.

    Profiler-based timers (torch.profiler, Proton) close every round instead of rotating: a
    CUPTI session can leave callbacks attached after it stops (kineto tears CUPTI down only on
    CUDA >= 12.6 or with TEARDOWN_CUPTI=1; without that, later kernels launch 10-20% slower,
    pytorch#146604). Placed last, any such slowdown falls on the whole next round, which the
    pairing with that round's baseline absorbs, rather than on whichever timers follow."""
    t_start = time.perf_counter()
    run = WorkloadRun(
        name=wl.name,
        description=wl.description,
        regions_per_iter=wl.regions_per_iter,
        iters=wl.iters,
        warmup=wl.warmup,
        rounds_planned=wl.rounds,
    )
    adapters: dict[str, TimerAdapter] = {}
    for spec in specs:
        tr = run.timers[spec.key] = TimerRun(spec.key)
        if spec.key in skips:
            tr.status, tr.reason = "skipped", skips[spec.key]
            continue
        try:
            adapters[spec.key] = build(spec)
        except Exception as exc:
            if isinstance(exc, SkipTimer):
                tr.status, tr.reason = "skipped", str(exc)
            else:
                tr.status, tr.reason, tr.trace = "error", f"setup: {error_text(exc)}", _tb()
            log(f"  {spec.key}: {tr.status}: {tr.reason}")
    late = {s.key for s in specs if s.profiler_based}
    keys = [k for k in adapters if k not in late]
    last = [k for k in adapters if k in late]
    # Everything alive now (torch, the model) moves to the permanent generation, so the
    # gc.collect() before each block takes microseconds instead of ~0.1 s.
    gc.collect()
    gc.freeze()
    try:
        if warm_blocks:
            for key in keys + last:
                tr = run.timers[key]
                try:
                    _timed_block(wl, adapters[key], iters=1)
                    adapters[key].drain()  # what it recorded is not counted
                except Exception as exc:
                    tr.status, tr.reason, tr.trace = "error", f"warm-up: {error_text(exc)}", _tb()
                    log(f"  {key}: error in its warm-up block: {tr.reason}")
        for r in range(wl.rounds):
            k = r % max(1, len(keys))
            order = keys[k:] + keys[:k] + last
            row: dict[str, float] = {}
            for key in order:
                tr = run.timers[key]
                if tr.status != "ok":
                    continue
                try:
                    row[key] = _timed_block(wl, adapters[key])
                except Exception as exc:
                    tr.status, tr.reason, tr.trace = "error", error_text(exc), _tb()
                    log(f"  {key}: error in round {r + 1}: {tr.reason}")
            run.rounds.append(row)
            run.orders.append(order)
            if (r + 1) % drain_every == 0 or r + 1 == wl.rounds:
                _drain(run, adapters, log)
            base = row.get("none")
            cells = " ".join(
                f"{key}={ms:.3f}" + (f"({ms / base:.2f}x)" if base else "")
                for key, ms in row.items()
            )
            log(f"  {wl.name} round {r + 1}/{wl.rounds} ms/iter: {cells}")
            if deadline is not None and r + 1 >= min_rounds and time.perf_counter() > deadline:
                if r + 1 < wl.rounds:
                    _drain(run, adapters, log)
                    log(f"  {wl.name}: time share used up after {r + 1} rounds")
                break
    finally:
        gc.unfreeze()
        for key, adapter in adapters.items():
            try:
                adapter.close()
            except Exception as exc:
                log(f"  {key}: close failed: {error_text(exc)}")
    run.seconds = time.perf_counter() - t_start
    return run


# -- synchronizations in the hot path -------------------------------------------------------------

SYNC_NAMES = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize")
OTHER_NAMES = ("cudaEventQuery", "cudaEventRecord", "cudaEventRecordWithFlags")


def count_runtime_calls(wl: Workload, adapter: TimerAdapter, iters: int) -> dict[str, int]:
    """Run ``iters`` steps under torch.profiler (CPU + CUDA) and count the CUDA runtime calls
    that synchronize (and event queries/records). The timer's session and its resolution stay
    outside the profiled steps; diff against the unwrapped model to get the timer's own."""
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with _session(wl, adapter):
        wl.step()  # warm: pools filled, lazy state built, outside the count
        sync()
        with torch.profiler.profile(activities=acts) as prof:
            for _ in range(iters):
                wl.step()
        sync()
    adapter.drain()
    counts = dict.fromkeys(SYNC_NAMES + OTHER_NAMES, 0)
    for evt in prof.key_averages():
        if evt.key in counts:
            counts[evt.key] += int(evt.count)
    return counts


# -- memory and report time -----------------------------------------------------------------------


def rss_bytes() -> int:
    """Resident set size now (Linux /proc; psutil elsewhere; 0 when neither works)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except Exception:
        return 0


def memory_growth(
    adapter: TimerAdapter, device: str, regions: int, cap_s: float | None
) -> dict[str, Any]:
    """Enter ``regions`` regions around a tiny op (an in-place add on one element, ~5 us to
    launch on the GPU) with no report in between; resident memory before and after. Stops early
    at ``cap_s`` seconds (competitors whose regions cost tens of us), and says so."""
    x = torch.zeros(1, device=device)
    region = adapter.region
    chunk = 1000
    adapter.start_round()
    try:
        with region("tiny"):  # first use (event creation, name registration) not counted
            x.add_(1.0)
        sync()
        gc.collect()
        before = rss_bytes()
        t0 = time.perf_counter()
        done = 0
        while done < regions:
            for _ in range(min(chunk, regions - done)):
                with region("tiny"):
                    x.add_(1.0)
            done += min(chunk, regions - done)
            if cap_s is not None and time.perf_counter() - t0 > cap_s:
                break
        seconds = time.perf_counter() - t0
        after = rss_bytes()
    finally:
        adapter.end_round()
    sync()
    adapter.drain()
    grown = after - before
    return {
        "regions": done,
        "planned": regions,
        "capped": done < regions,
        "seconds": seconds,
        "us_per_region": seconds * 1e6 / max(1, done),
        "rss_before_mb": before / 2**20,
        "rss_after_mb": after / 2**20,
        "growth_mb": grown / 2**20,
        "bytes_per_region": grown / max(1, done),
    }


def report_time(adapter: TimerAdapter, device: str, samples: int) -> dict[str, Any]:
    """Leave ``samples`` regions (16 names, a tiny op each) pending, let the GPU finish, then
    time what producing the timer's report takes (a profiler's stop counts: it must stop first)."""
    x = torch.zeros(1, device=device)
    names = [f"region{i:02d}" for i in range(16)]
    region = adapter.region
    adapter.start_round()
    ended = False
    try:
        for i in range(samples):
            with region(names[i & 15]):
                x.add_(1.0)
        sync()  # time the report's own work, not the GPU draining its queue
        t0 = time.perf_counter()
        adapter.end_round()
        ended = True
        text = adapter.report()
        seconds = time.perf_counter() - t0
    finally:
        if not ended:
            adapter.end_round()
    adapter.drain()
    return {
        "samples": samples,
        "seconds": seconds,
        "has_report": text is not None,
        "report_chars": len(text) if text is not None else 0,
    }


# -- the cost of resolving, amortized ------------------------------------------------------------


def _loop_then_resolve(wl: Workload, adapter: TimerAdapter, iters: int) -> tuple[float, float]:
    """``iters`` steps (GPU work included), then the timer's resolution (a report would do it);
    seconds of each. Freeing what it kept happens after, outside both clocks."""
    with _session(wl, adapter):
        sync()
        t0 = time.perf_counter()
        for _ in range(iters):
            wl.step()
        sync()
        t1 = time.perf_counter()
        adapter.resolve()
        t2 = time.perf_counter()
    adapter.drain()
    return t1 - t0, t2 - t1


def resolution_cost(
    wl: Workload, adapters: dict[str, TimerAdapter], regions: int, reps: int, log: Log
) -> dict[str, Any]:
    """Run about ``regions`` regions of ``wl`` (whole steps), synchronize, then resolve once,
    for each adapter, ``reps`` times in rotated order after one warm-up rep (dropped).

    cudatimer defers resolution: finished samples are resolved without blocking when a stream's
    backlog reaches a threshold (in the loop) or when a report is asked (in ``summary()``). The
    in-loop figure of the main table may leave the second part out; (loop + resolution -
    unwrapped loop of the same rep) / regions counts both. The floor never resolves anything.
    Raw seconds per rep; ``_report`` turns them into microseconds per region."""
    per_iter = max(1, wl.regions_per_iter)
    iters = max(1, math.ceil(regions / per_iter))
    keys = list(adapters)
    rows: list[dict[str, dict[str, float]]] = []  # per rep: key -> loop_s, resolve_s
    errors: dict[str, str] = {}
    for rep in range(reps + 1):
        k = rep % max(1, len(keys))
        row: dict[str, dict[str, float]] = {}
        for key in keys[k:] + keys[:k]:
            if key in errors:
                continue
            try:
                loop_s, resolve_s = _loop_then_resolve(wl, adapters[key], iters)
            except Exception as exc:
                errors[key] = error_text(exc)
                log(f"  resolution {key}: error: {errors[key]}")
                continue
            row[key] = {"loop_s": loop_s, "resolve_s": resolve_s}
        if rep:  # rep 0 warmed pools and lazy state
            rows.append(row)
            cells = (
                f"{key}={v['loop_s'] * 1e3:.1f}+{v['resolve_s'] * 1e3:.2f}ms"
                for key, v in row.items()
            )
            log(f"  resolution rep {rep}/{reps} (loop+resolve): {' '.join(cells)}")
    return {
        "workload": wl.name,
        "regions_per_iter": per_iter,
        "iters": iters,
        "regions": iters * per_iter,
        "keys": keys,
        "reps": rows,
        "errors": errors,
    }


# -- accuracy against CUPTI -----------------------------------------------------------------------


def accuracy_vs_cupti(regions: int, matmuls: int, log: Log) -> dict[str, Any]:
    """cudatimer's GPU time per region against the CUPTI kernel span (first kernel start to last
    kernel end) of the same region, from one profiled execution. Each region is ``matmuls`` bf16
    4096^3 GEMMs (~0.17 ms each on an H200: 60 make ~10 ms); regions run back to
    back, so only the first one starts on an idle GPU (its launch latency belongs to it)."""
    import cudatimer

    n = 4096
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(10):  # cuBLAS heuristics, clocks up
        torch.mm(a, b, out=c)
    timer = cudatimer.Timer("accuracy")
    names = [f"acc{i}" for i in range(regions)]
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    sync()
    with torch.profiler.profile(activities=acts) as prof:
        for name in names:
            with timer.region(name), torch.profiler.record_function(name):
                for _ in range(matmuls):
                    torch.mm(a, b, out=c)
        sync()
    summary = timer.summary()
    fd, path = tempfile.mkstemp(suffix=".json", prefix="cudatimer-acc-")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            trace = json.load(f)
    finally:
        os.unlink(path)
    spans = kernel_spans(trace, names)
    rows = []
    for i, name in enumerate(names):
        stats = summary[name]
        ev = stats.gpu_total_ms
        k = spans.get(name)
        rows.append(
            {
                "region": name,
                "first_after_idle": i == 0,
                "matmuls": matmuls,
                "clock": stats.clock,
                "cudatimer_gpu_ms": ev,
                "cupti_span_ms": k,
                "diff_pct": (ev - k) / k * 100 if ev is not None and k else None,
                "kernels": spans.get(name + "#kernels"),
            }
        )
        log(f"  {name}: cudatimer {ev} ms, CUPTI span {k} ms")
    return {"rows": rows}


def kernel_spans(trace: dict[str, Any], names: list[str]) -> dict[str, float]:
    """Per ``record_function`` annotation in a chrome trace: the span from the first kernel start
    to the last kernel end among kernels launched inside it, matched launch -> kernel by CUPTI
    correlation id. Also ``name#kernels``: how many kernels matched."""
    events = trace.get("traceEvents", [])
    wanted = set(names)
    annotations = [
        e for e in events if e.get("cat") == "user_annotation" and e.get("name") in wanted
    ]
    launches = [
        e
        for e in events
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})
    ]
    kernels: dict[int, dict[str, Any]] = {}
    for e in events:
        if e.get("cat") == "kernel" and "correlation" in e.get("args", {}):
            kernels[int(e["args"]["correlation"])] = e
    out: dict[str, float] = {}
    for ann in annotations:
        t0, t1 = float(ann["ts"]), float(ann["ts"]) + float(ann.get("dur", 0))
        ks = [
            kernels[c]
            for c in (int(e["args"]["correlation"]) for e in launches if t0 <= float(e["ts"]) <= t1)
            if c in kernels
        ]
        if ks:
            first = min(float(k["ts"]) for k in ks)
            last = max(float(k["ts"]) + float(k.get("dur", 0)) for k in ks)
            out[ann["name"]] = (last - first) / 1e3  # trace times are microseconds
            out[ann["name"] + "#kernels"] = float(len(ks))
    return out
