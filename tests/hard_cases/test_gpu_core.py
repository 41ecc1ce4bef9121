"""Core behaviour on a CUDA device: lazy resolution, no synchronisation, streams, accuracy, and
the recorder core's contract (``cudatimer/core/_core.pyi``) on a real GPU.

The suite runs once per core: as is (the C core, ``_speedups``, where it was built) and with
``CUDATIMER_PURE_PYTHON=1`` (the Python reference, ``_core_py``); a few tests also compare
with the other core in a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import cudatimer
from cudatimer import Timer
from cudatimer.core import _core, _device
from cudatimer.records._hist import Histogram

pytestmark = pytest.mark.gpu

SYNC_CALLS = ("cudaEventSynchronize", "cudaStreamSynchronize", "cudaDeviceSynchronize")


_CYCLES_PER_MS: list[float] = []


def sleep_ms(ms: float) -> None:
    """Keep the current stream busy for about ``ms`` (a spin kernel, no host involvement).

    ``torch.cuda._sleep`` spins for clock cycles and the SM clock moves (345 MHz idle, 1980 MHz
    boost on the H200), so the cycles per millisecond are measured once, on a warm GPU.
    """
    if not _CYCLES_PER_MS:
        nominal = (torch.cuda.get_device_properties(0).clock_rate or 1_980_000) * 1.0
        torch.cuda._sleep(int(nominal))  # load the kernel and wake the clocks up (~1 ms)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        torch.cuda._sleep(int(20 * nominal))
        b.record()
        b.synchronize()
        _CYCLES_PER_MS.append(20 * nominal / a.elapsed_time(b))
    torch.cuda._sleep(int(ms * _CYCLES_PER_MS[0]))


def test_region_exits_before_gpu_finishes_and_resolves_later() -> None:
    """A region around a 50 ms GPU sleep exits at once; the report later gives ~50 ms."""
    torch.cuda.init()
    sleep_ms(1)  # load the sleep kernel's module (lazy loading costs ~10 ms on first launch)
    torch.cuda.synchronize()
    timer = Timer(name="lazy")
    with timer.region("sleep"):  # first region on this stream: pool and stream entry set up
        pass
    ref_start = torch.cuda.Event(enable_timing=True)
    ref_end = torch.cuda.Event(enable_timing=True)
    ref_start.record()
    with timer.region("sleep"):
        sleep_ms(50)
    ref_end.record()
    # Read at once, the sample is still pending: the region did not wait for the GPU.
    assert timer.summary(timeout_s=0).pending == 1, "the region waited for the GPU"
    r = timer.summary()["sleep"]
    reference_ms = ref_start.elapsed_time(ref_end)
    assert r.clock == "cuda:0" and r.calls == 2
    assert r.cpu_total_ms < 10.0  # the host did not wait for the 50 ms of GPU work
    assert r.gpu_max_ms is not None and 40.0 < r.gpu_max_ms <= reference_ms + 0.01
    assert r.gpu_max_ms == pytest.approx(reference_ms, rel=0.01)


def count_runtime_calls(body: Callable[[], None]) -> dict[str, int]:
    """Run ``body`` under torch.profiler and count CUDA runtime calls by name."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        body()
    counts: dict[str, int] = {}
    for e in prof.key_averages():
        counts[e.key] = counts.get(e.key, 0) + e.count
    return counts


def test_hot_path_never_synchronizes() -> None:
    """Zero cudaEvent/Stream/DeviceSynchronize calls between the first enter and the report."""
    timer = Timer(name="nosync")
    x = torch.randn(256, 256, device="cuda")
    layers = [torch.nn.Linear(256, 256).cuda() for _ in range(8)]

    def plain() -> None:
        for _ in range(50):
            y = x
            for layer in layers:
                y = torch.nn.functional.gelu(layer(y))

    def timed() -> None:
        for i in range(50):
            y = x
            with timer.region("step", payload=i):
                for layer in layers:
                    with timer.region("layer"):
                        y = torch.nn.functional.gelu(layer(y))

    def synced() -> None:  # positive control: the counter must see a real sync
        plain()
        torch.cuda.synchronize()

    plain(), timed()  # warm-up: pools, cuBLAS handles, stream entries
    torch.cuda.synchronize()
    base = count_runtime_calls(plain)
    with_regions = count_runtime_calls(timed)
    control = count_runtime_calls(synced)
    assert control.get("cudaDeviceSynchronize", 0) >= 1, control
    for name in SYNC_CALLS:
        assert with_regions.get(name, 0) == base.get(name, 0), (name, with_regions, base)
    assert (
        with_regions.get("cudaEventRecord", 0) + with_regions.get("cudaEventRecordWithFlags", 0)
        >= 2 * 50 * 9
    )
    s = timer.summary()
    assert s["step/layer"].calls == 8 * 50 + 8 * 50  # warm-up run + profiled run
    assert s["step"].calls == 100


def test_side_stream_work_is_measured() -> None:
    """A region inside `with torch.cuda.stream(s)` records on s and measures its work."""
    timer = Timer(name="streams")
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(side), timer.region("on_side"):
        sleep_ms(20)
    r = timer.summary()["on_side"]
    assert r.gpu_total_ms == pytest.approx(20.0, rel=0.15)
    key = (side.stream_id, side.device_index, side.device_type)
    rec = _core.stream_of(key)
    assert rec is not None and rec.key == key and rec.device == side.device_index
    assert rec.stream.cuda_stream == side.cuda_stream and rec.pending == 0


def test_pending_stays_bounded_and_events_are_reused() -> None:
    """10^4 regions without a report keep few pending samples and a small event pool."""
    timer = Timer(name="bounded", trace_samples=0)
    x = torch.randn(64, 64, device="cuda")
    entry_key = torch._C._cuda_getCurrentStream(0)
    high_water = 0
    for _ in range(10_000):
        with timer.region("tiny"):
            x = x * 1.0001
        high_water = max(high_water, _core.pending_total())  # every stream's samples
    assert timer.summary()["tiny"].calls == 10_000
    assert high_water < 4096, high_water
    rec = _core.stream_of(entry_key)
    assert rec is not None and rec.pending == 0
    assert rec.pooled < 2 * 4096 + 2 * _device.PREWARM_EVENTS


def kernel_spans(trace_path: str) -> list[tuple[float, float, str]]:
    with open(trace_path) as f:
        events = json.load(f)["traceEvents"]
    spans = [
        (float(e["ts"]), float(e["ts"]) + float(e["dur"]), str(e.get("name", "")))
        for e in events
        if e.get("cat") == "kernel" and "dur" in e
    ]
    return sorted(spans)


def test_compute_bound_region_matches_cupti_kernel_span() -> None:
    """>= 1 ms of bf16 matmuls: event time agrees with the CUPTI kernel span within 2%."""
    from torch.profiler import ProfilerActivity, profile

    timer = Timer(name="accuracy")
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    for _ in range(5):
        a @ b  # warm-up: cuBLAS handle and heuristics outside the profile
    torch.cuda.synchronize()
    n = 100
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        a @ b  # busy GPU before the region, so the start event is not followed by idle time
        with timer.region("matmuls"):
            for _ in range(n):
                a @ b
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        spans = kernel_spans(path)
    assert len(spans) >= n + 1, len(spans)
    region_kernels = spans[-n:]
    cupti_ms = (region_kernels[-1][1] - region_kernels[0][0]) / 1000.0
    r = timer.summary()["matmuls"]
    assert cupti_ms > 1.0
    assert r.gpu_total_ms == pytest.approx(cupti_ms, rel=0.02), (r.gpu_total_ms, cupti_ms)


def test_cpu_and_gpu_time_stand_side_by_side() -> None:
    """A host-bound region shows host time well above its GPU time, both recorded."""
    import time

    timer = Timer(name="sides")
    x = torch.randn(16, device="cuda")
    with timer.region("host_bound"):
        time.sleep(0.02)
        x + 1
    r = timer.summary()["host_bound"]
    assert r.cpu_total_ms >= 20.0
    # The GPU span ends after the kernel queued last, a few us past the host's exit.
    assert r.gpu_total_ms is not None and r.gpu_total_ms <= r.cpu_total_ms + 1.0
    assert r.gpu_total_ms >= 19.0  # idle gaps count: the start event ran before the sleep


def test_module_api_on_gpu_model() -> None:
    """The quickstart pattern on a real CUDA model: decorated forward inside a step region."""

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(512, 512)

        @cudatimer.cuda_timed(name="Net.forward")
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.fc(x))

    net = Net().cuda()
    x = torch.randn(64, 512, device="cuda")
    for _ in range(10):
        with cudatimer.cuda_region("step"):
            net(x).sum().backward()
    s = cudatimer.summary()
    assert s["step"].calls == 10 and s["step/Net.forward"].calls == 10
    assert s["step"].gpu_total_ms >= s["step/Net.forward"].gpu_total_ms


# -- the core's contract on the GPU ----------------------------------------------------------------
ROOT = Path(__file__).resolve().parents[2]


def _records(counts: dict[str, int]) -> int:
    return counts.get("cudaEventRecord", 0) + counts.get("cudaEventRecordWithFlags", 0)


@pytest.fixture
def rec() -> Any:
    """The record of the current stream, made by a first region once CUDA is in use."""
    torch.cuda.init()
    timer = Timer(name="rec")
    with timer.region("warm"):
        pass
    timer.summary()
    found = _core.stream_of(torch._C._cuda_getCurrentStream(-1))
    assert found is not None
    return found


def test_the_c_core_records_through_the_runtime() -> None:
    """The C core binds to the CUDA runtime torch loaded (records skip torch's wrapper); the
    Python reference records through torch."""
    torch.cuda.init()
    assert cudatimer.compiled() == (_core.IMPL == "c")
    assert _core.runtime_bound() == (_core.IMPL == "c"), _core.IMPL


def test_take_and_give_cycle_the_pool(rec: Any) -> None:
    """take() hands out a pooled event recorded now on the stream; give() puts it back."""
    n = rec.pooled
    assert n >= 1  # pre-warmed when the stream was first seen, refilled by every harvest
    ev = rec.take()
    assert rec.pooled == n - 1
    ev2 = rec.take(True)  # torch's record
    assert rec.pooled == n - 2
    torch.cuda.synchronize()
    assert ev.query() and ev2.query() and ev.elapsed_time(ev2) >= 0.0
    rec.give(ev)
    rec.give(ev2)
    assert rec.pooled == n


def test_taken_events_are_seen_by_the_profiler_and_never_sync(rec: Any) -> None:
    """Each take() is one event record the profiler counts (a CUDA runtime call either way);
    no synchronising call among them; regions record exactly two per call."""
    timer = Timer(name="prof")
    x = torch.randn(64, 64, device="cuda")

    def takes() -> None:
        for _ in range(100):
            rec.give(rec.take())
        for _ in range(10):
            rec.give(rec.take(True))

    def plain() -> None:
        for _ in range(100):
            torch.mm(x, x)

    def regions() -> None:
        for _ in range(100):
            with timer.region("r"):
                torch.mm(x, x)

    takes(), regions()  # warm-up
    torch.cuda.synchronize()
    base = count_runtime_calls(plain)  # the profiler's own calls (it synchronises at stop)
    counts = count_runtime_calls(takes)
    assert _records(counts) - _records(base) == 110, counts
    with_regions = count_runtime_calls(regions)
    assert _records(with_regions) - _records(base) == 200, with_regions
    for name in SYNC_CALLS:
        assert counts.get(name, 0) == base.get(name, 0), (name, counts, base)
        assert with_regions.get(name, 0) == base.get(name, 0), (name, with_regions, base)
    assert timer.summary()["r"].calls == 200


def test_taken_events_complete_and_time_the_work_between(rec: Any) -> None:
    """Two takes around 30 ms of GPU work: the second is recorded behind it without waiting,
    both complete, and they time the work."""
    sleep_ms(0.1)  # calibrates the spin kernel (a 20 ms run) the first time
    torch.cuda.synchronize()
    start = rec.take()
    sleep_ms(30)
    t0 = time.perf_counter()
    end = rec.take()
    took = time.perf_counter() - t0
    assert not end.query() and took < 0.005  # queued behind the work, no wait
    torch.cuda.synchronize()
    assert start.query() and end.query()
    assert 25.0 < start.elapsed_time(end) < 40.0
    rec.give(start)
    rec.give(end)


def test_harvest_never_waits_and_leaves_no_runtime_error(rec: Any) -> None:
    """A pushed sample whose end is still running: harvest() returns at once leaving it
    pending, and the next kernel launch is unaffected (a not-ready query's error was cleared);
    once done it folds the events' exact elapsed time."""
    timer = Timer(name="harvest")
    store, slot = timer.recorder.store, timer.recorder.tree.child(-1, "manual")
    sleep_ms(0.1)
    torch.cuda.synchronize()
    t0 = _core.now_ns()
    start = rec.take()
    sleep_ms(30)
    end = rec.take()
    t1 = _core.now_ns()
    rec.push(store, slot, store.gen, start, end, (), t0, t1, store.step, threading.get_ident())
    before = time.perf_counter()
    rec.harvest()
    waited = time.perf_counter() - before
    assert waited < 0.005 and rec.pending >= 1 and store.pending() == 1
    y = torch.ones(4, device="cuda") * 2  # raises if a stale runtime error were left behind
    torch.cuda.synchronize()
    assert float(y.sum()) == 8.0
    reference = start.elapsed_time(end)
    rec.harvest()
    assert store.pending() == 0
    (st,) = store.snapshot().stats
    gpu, cpu = Histogram(*st.gpu), Histogram(*st.cpu)  # as the recorder reads them
    assert (st.slot, st.dev, st.calls, gpu.count, cpu.count) == (slot, 0, 1, 1, 1)
    assert gpu.total == pytest.approx(reference, abs=1e-6)
    assert 25.0 < gpu.total < 40.0
    assert cpu.total == pytest.approx((t1 - t0) * 1e-6)


def test_drain_polls_and_never_blocks() -> None:
    """drain(timeout) waits at most about the timeout for unfinished samples, polling: no
    synchronising CUDA call, and every sample resolved once the GPU is done."""
    timer = Timer(name="drain", trace_samples=0)
    sleep_ms(0.1)
    torch.cuda.synchronize()
    with timer.region("long"):
        sleep_ms(200)
    t0 = time.perf_counter()
    left = _core.drain(0.0)
    assert left >= 1 and time.perf_counter() - t0 < 0.01
    t0 = time.perf_counter()
    left = _core.drain(0.02)
    assert left >= 1 and 0.015 < time.perf_counter() - t0 < 0.1
    base = count_runtime_calls(lambda: None)
    after: list[int] = []
    counts = count_runtime_calls(lambda: after.append(_core.drain(10.0)))
    assert after == [0] and _core.pending_total() == 0
    for name in SYNC_CALLS:
        assert counts.get(name, 0) == base.get(name, 0), (name, counts, base)
    r = timer.summary(timeout_s=0)["long"]
    assert r.gpu_total_ms == pytest.approx(200.0, rel=0.1)


def test_c10_stream_read_matches_torch() -> None:
    """A core that reads c10's current stream itself reads what torch's getter returns."""
    current = getattr(_core, "current_stream", None)
    if current is None:
        pytest.skip(f"the {_core.IMPL} core reads the stream through torch's getter only")
    timer = Timer(name="c10")
    torch.cuda.init()
    with timer.region("warm"):
        pass
    get = torch._C._cuda_getCurrentStream
    assert tuple(current()) == get(-1)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        assert tuple(current()) == get(-1)
        assert current()[0] != 0


def test_default_stream_regions_fold_in_the_core() -> None:
    """Regions on the default stream queue their samples on its record and are folded by the
    harvest every HARVEST_BATCH samples; a side-stream region (the general path) is exact too."""
    timer = Timer(name="fast", trace_samples=8)
    torch.cuda.init()
    for _ in range(300):  # more than one harvest batch
        with timer.region("r"):
            torch.cuda._sleep(1000)
    rec = _core.stream_of(torch._C._cuda_getCurrentStream(-1))
    assert rec is not None
    # The samples since the last in-loop harvest wait on the stream record, in the core.
    # The harvest at the HARVEST_BATCH-th exit folded what the GPU had finished by then.
    assert 0 < timer.recorder.store.pending() < 300 and _device.HARVEST_BATCH < 300
    assert timer.recorder.store.pending() <= rec.pending <= _core.pending_total()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side), timer.region("side"):
        sleep_ms(2)
    s = timer.summary(trace=True)
    assert s["r"].calls == 300 and s["r"].gpu.count == 300 and s.pending == 0
    assert s["side"].calls == 1 and s["side"].gpu_total_ms == pytest.approx(2.0, rel=0.3)
    assert len(s.trace) == 8 and all(t.gpu_ms is not None for t in s.trace)
    assert rec.pending == 0


def test_threads_on_the_default_stream_count_exactly() -> None:
    """Four threads x 1000 nested regions on the default stream: exact counts, no lost frame."""
    timer = Timer(name="threads")
    x = torch.ones(16, device="cuda")

    def work() -> None:
        for _ in range(1000):
            with timer.region("outer"), timer.region("inner"):
                x.add_(1)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    s = timer.summary()
    assert s["outer"].calls == 4000 and s["outer/inner"].calls == 4000
    assert s["outer"].gpu.count == 4000 and s.open == 0


_AGREE = """
import json

import torch

import cudatimer
from cudatimer import Timer
from tests.hard_cases.test_gpu_core import sleep_ms

torch.cuda.init()
sleep_ms(0.1)
torch.cuda.synchronize()
t = Timer(name="agree")
for _ in range(3):
    with t.region("outer"):
        sleep_ms(5)
        with t.region("inner"):
            sleep_ms(10)
s = t.summary()
w = Timer(name="steps", keep_steps=3, trace_samples=4)
for _ in range(5):
    with w.region("a"):
        sleep_ms(1)
        with w.region("b"):
            sleep_ms(2)
    w.step()
ws = w.summary(last=2, step_stats=True, trace=True)
print(json.dumps({
    "compiled": cudatimer.compiled(),
    "means": [s["outer"].gpu_mean_ms, s["outer/inner"].gpu_mean_ms],
    "regions": [[r.name, r.calls, round(r.gpu_mean_ms, 1)] for r in ws.regions],
    "steps": [[r.step, r.name, r.calls] for r in ws.step_stats],
    "trace": [[r.name, r.step] for r in ws.trace],
}))
"""


def _agree_run(pure: bool) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env["CUDATIMER_PURE_PYTHON"] = "1" if pure else "0"
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_AGREE)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=str(ROOT),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


def test_both_cores_agree_on_gpu_times_steps_and_windows() -> None:
    """The same sleeps timed by each core (one process each) give the same GPU times (within
    2%), and the same steps, windows and trace."""
    if _core.IMPL != "c":
        pytest.skip("compares with the C core: runs in the suite's run on the C core")
    c, py = _agree_run(pure=False), _agree_run(pure=True)
    assert c["compiled"] is True and py["compiled"] is False
    assert c["means"][0] == pytest.approx(py["means"][0], rel=0.02)
    assert c["means"][1] == pytest.approx(py["means"][1], rel=0.02)
    assert c["means"][1] == pytest.approx(10.0, rel=0.1)
    assert (c["regions"], c["steps"], c["trace"]) == (py["regions"], py["steps"], py["trace"])
    assert c["regions"] == [["a", 2, 3.0], ["a/b", 2, 2.0]]
