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
