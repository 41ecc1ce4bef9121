"""The compiled hot path on a CUDA device: bound to torch's runtime, same results as torch."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from cudatimer import Timer, _cuda, _timer
from tests.gpu.test_gpu_core import count_runtime_calls, sleep_ms

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(_cuda._speedups is None, reason="the compiled module is not built here"),
]
speedups: Any = _cuda._speedups


@pytest.fixture(autouse=True)
def _cuda_in_use() -> None:
    """Regions time with events once CUDA is initialised (before that, on the host clock)."""
    torch.cuda.init()


def test_bound_to_torchs_runtime() -> None:
    """The module found the CUDA runtime torch loaded, and regions use it."""
    assert _cuda.RUNTIME_BOUND
    assert "libcudart" in speedups.runtime_path()
    assert _timer.compiled()
    timer = Timer(name="bound")
    with timer.region("r"):
        pass
    entry = _cuda.BACKEND.entries[torch._C._cuda_getCurrentStream(-1)]
    assert entry.raw == torch.cuda.current_stream().cuda_stream


def test_elapsed_matches_torch_and_never_waits() -> None:
    """elapsed_ms equals torch's elapsed_time; on a busy event it raises at once, and the next
    kernel launch is unaffected (the runtime's last error was cleared)."""
    timer = Timer(name="el")
    with timer.region("warm"):
        pass
    entry = _cuda.BACKEND.entries[torch._C._cuda_getCurrentStream(-1)]
    sleep_ms(0.1)  # calibrates the spin kernel (a 20 ms run) the first time
    torch.cuda.synchronize()
    start = speedups.take_record(entry)
    sleep_ms(30)
    end = speedups.take_record(entry)
    with pytest.raises(RuntimeError, match="not complete"):
        speedups.elapsed_ms(start, end)
    y = torch.ones(4, device="cuda") * 2  # raises if a stale runtime error were left behind
    torch.cuda.synchronize()
    assert float(y.sum()) == 8.0
    assert speedups.elapsed_ms(start, end) == start.elapsed_time(end)
    assert 25.0 < speedups.elapsed_ms(start, end) < 40.0


def test_compiled_and_python_paths_agree() -> None:
    """The same sleeps timed through each path give the same GPU times (within 2%)."""
    got = {}
    for compiled in (True, False):
        _timer.use_compiled(compiled)
        try:
            timer = Timer(name=f"agree-{compiled}")
            for _ in range(3):
                with timer.region("outer"):
                    sleep_ms(5)
                    with timer.region("inner"):
                        sleep_ms(10)
            s = timer.summary()
            got[compiled] = (s["outer"].gpu_mean_ms, s["outer/inner"].gpu_mean_ms)
        finally:
            _timer.use_compiled(True)
    assert got[True][0] == pytest.approx(got[False][0], rel=0.02)
    assert got[True][1] == pytest.approx(got[False][1], rel=0.02)
    assert got[True][1] == pytest.approx(10.0, rel=0.1)


def test_compiled_records_are_seen_by_the_profiler_and_never_sync() -> None:
    """Its records are CUDA runtime calls the profiler counts; no synchronising call among them."""
    timer = Timer(name="prof")
    x = torch.randn(64, 64, device="cuda")

    def plain() -> None:
        for _ in range(100):
            torch.mm(x, x)

    def body() -> None:
        for _ in range(100):
            with timer.region("r"):
                torch.mm(x, x)

    body()
    torch.cuda.synchronize()
    base = count_runtime_calls(plain)  # the profiler's own calls (it synchronises at stop)
    counts = count_runtime_calls(body)
    assert counts.get("cudaEventRecord", 0) - base.get("cudaEventRecord", 0) == 200, counts
    for name in ("cudaEventSynchronize", "cudaStreamSynchronize", "cudaDeviceSynchronize"):
        assert counts.get(name, 0) == base.get(name, 0), (name, counts, base)


def test_c10_stream_read_matches_torch() -> None:
    """The compiled path reads the current stream from c10 only where it matches torch."""
    timer = Timer(name="c10")
    with timer.region("warm"):
        pass
    get = torch._C._cuda_getCurrentStream
    assert speedups.current_stream() == get(-1)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        assert speedups.current_stream() == get(-1)
        assert speedups.current_stream()[0] != 0
    assert speedups.trust_current_stream(True) is True


def test_default_stream_regions_take_the_compiled_path() -> None:
    """Regions on the default stream are recorded by the C harvest (its pool and statistics),
    and their frames are C frames; a side-stream region goes through Python and is exact too."""
    timer = Timer(name="fast", trace_samples=8)
    entry = _cuda.BACKEND.entry(torch._C._cuda_getCurrentStream(-1))
    for _ in range(300):  # more than one harvest batch
        with timer.region("r"):
            torch.cuda._sleep(1000)
    # Recorded by the C path: its samples since the last in-loop harvest wait in C.
    assert timer._core.slots >= 1 and timer._core.pending() > 0
    assert not any(s[0].owner is timer for s in entry.pending)  # none went through Python
    side = torch.cuda.Stream()
    with torch.cuda.stream(side), timer.region("side"):
        sleep_ms(2)
    s = timer.summary(trace=True)
    assert s["r"].calls == 300 and s["r"].gpu.count == 300 and s.pending == 0
    assert s["side"].calls == 1 and s["side"].gpu_total_ms == pytest.approx(2.0, rel=0.3)
    assert len(s.trace) == 8 and all(t.gpu_ms is not None for t in s.trace)


def test_threads_on_the_compiled_path_count_exactly() -> None:
    """Four threads x 2000 nested regions on the default stream: exact counts, no lost frame."""
    import threading

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


def test_compiled_and_python_agree_on_steps_and_windows() -> None:
    """Steps, windows and trace read the same through both paths on a real GPU."""
    got = {}
    for compiled in (True, False):
        _timer.use_compiled(compiled)
        try:
            timer = Timer(name=f"steps-{compiled}", keep_steps=3, trace_samples=4)
            for _ in range(5):
                with timer.region("a"):
                    sleep_ms(1)
                    with timer.region("b"):
                        sleep_ms(2)
                timer.step()
            s = timer.summary(last=2, step_stats=True, trace=True)
            got[compiled] = (
                [(r.name, r.calls, round(r.gpu_mean_ms, 1)) for r in s.regions],
                [(t.step, t.name, t.calls) for t in s.step_stats],
                [(t.name, t.step) for t in s.trace],
            )
        finally:
            _timer.use_compiled(True)
    assert got[True] == got[False]
    assert got[True][0] == [("a", 2, 3.0), ("a/b", 2, 2.0)]
