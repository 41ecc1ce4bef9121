"""Core behaviour on a CUDA device: lazy resolution, no synchronisation, streams, accuracy."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable

import pytest
import torch

import cudatimer
from cudatimer import Timer, _cuda

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
    assert with_regions.get("cudaEventRecord", 0) + with_regions.get(
        "cudaEventRecordWithFlags", 0
    ) >= 2 * 50 * 9
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
    assert key in _cuda.BACKEND.entries


def test_pending_stays_bounded_and_events_are_reused() -> None:
    """10^4 regions without a report keep few pending samples and a small event pool."""
    timer = Timer(name="bounded", trace_samples=0)
    x = torch.randn(64, 64, device="cuda")
    entry_key = torch._C._cuda_getCurrentStream(0)
    high_water = 0
    for _ in range(10_000):
        with timer.region("tiny"):
            x = x * 1.0001
        high_water = max(high_water, _cuda.BACKEND.pending_count())  # both paths' samples
    assert timer.summary()["tiny"].calls == 10_000
    assert high_water < 4096, high_water
    entry = _cuda.BACKEND.entries[entry_key]
    speedups = _cuda._speedups
    pooled = len(_cuda._pools[0]) + (speedups.pooled(entry) if speedups is not None else 0)
    assert pooled < 2 * 4096 + 2 * _cuda.PREWARM_EVENTS


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
