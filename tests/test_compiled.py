"""The compiled hot path (``cudatimer._speedups``) on the CPU: built, wired in, same behaviour.

The fake GPU tests in test_hard_cases.py run once through each path; these check what is
particular to the compiled one: that the install built it, its fallbacks, its error paths and
its NVTX calls. Its CUDA runtime calls are checked on the GPU (tests/gpu/test_gpu_compiled.py).
"""

from __future__ import annotations

import shutil
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import cudatimer
from cudatimer import Timer, _cuda, _steps, _timer
from tests.fake_cuda import FakeGPU, install
from tests.subproc import run_python

speedups: Any = _cuda._speedups
needs_module = pytest.mark.skipif(speedups is None, reason="the compiled module is not built here")


@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeGPU]:
    """A fake GPU with the compiled hot path switched on."""
    if speedups is None:
        pytest.skip("the compiled module is not built here")
    was = _timer.compiled()
    _timer.use_compiled(True)
    try:
        yield install(monkeypatch)
    finally:
        _timer.use_compiled(was)


def test_install_built_the_module() -> None:
    """Where a C compiler and Python's headers exist, the install built the compiled module."""
    include = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if (shutil.which("cc") is None and shutil.which("gcc") is None) or not include.exists():
        pytest.skip("no C compiler or Python headers: the pure Python path is expected")
    assert speedups is not None, "cudatimer._speedups was not built by the install"
    assert cudatimer.compiled() is True


@needs_module
def test_pure_python_switch_is_honoured() -> None:
    """CUDATIMER_PURE_PYTHON=1 keeps the compiled module unused; 0 uses it."""
    code = "import cudatimer; print(cudatimer.compiled())"
    for value, expected in (("1", "False"), ("0", "True")):
        out = run_python(code, {"CUDATIMER_PURE_PYTHON": value})
        assert out.stdout.strip() == expected, out.stderr


@needs_module
def test_runtime_is_not_bound_without_cuda_runtime() -> None:
    """On a CPU build of torch no CUDA runtime is loaded: load() says so, nothing is bound."""
    import torch

    if torch.version.cuda is not None:
        pytest.skip("this torch carries a CUDA runtime")
    assert speedups.load() is False
    assert speedups.runtime_path() is None
    assert _cuda.RUNTIME_BOUND is False


class _Entry:
    """What take_record reads of a StreamEntry."""

    def __init__(self, pool: list[Any], raw: int | None) -> None:
        self.pool = pool
        self.raw = raw
        self.calls = 0

    def take_recorded(self) -> str:
        self.calls += 1
        return "via python"


@needs_module
def test_take_record_falls_back_to_python() -> None:
    """Without a bound runtime, or with an empty pool or no stream handle, Python records."""
    for entry in (_Entry([], 0), _Entry(["ev"], None), _Entry(["ev"], 0)):
        assert speedups.take_record(entry) == "via python"
        assert entry.calls == 1


@needs_module
def test_elapsed_falls_back_to_torch_semantics() -> None:
    """elapsed_ms of events without a CUDA handle is start.elapsed_time(end), errors included."""

    class Ev:
        def elapsed_time(self, end: object) -> float:
            if end is None:
                raise ValueError("Both events must be recorded")
            return 1.5

    assert speedups.elapsed_ms(Ev(), Ev()) == 1.5
    with pytest.raises(ValueError, match="recorded"):
        speedups.elapsed_ms(Ev(), None)
    with pytest.raises(TypeError, match="takes 2 arguments"):
        speedups.elapsed_ms(Ev())


def test_compiled_path_records_like_python(gpu: FakeGPU) -> None:
    """Nested regions through the compiled hooks: same paths, GPU and host times."""
    assert _timer.compiled() and "__enter__" not in _timer.Region.__dict__
    timer = Timer(name="c")
    before = time.perf_counter_ns()
    with timer.region("outer"):
        gpu.run(3.0)
        with timer.region("inner"):
            frame = timer._local.stack[-1]
            gpu.run(2.0)
    after = time.perf_counter_ns()
    # The host clock of the C path is time.perf_counter_ns's clock.
    assert before <= frame[4] <= after
    s = timer.summary()
    assert s["outer"].gpu_total_ms == pytest.approx(5.0)
    assert s["outer/inner"].gpu_total_ms == pytest.approx(2.0)
    assert 0 < s["outer"].cpu_total_ms <= (after - before) * 1e-6


def test_compiled_exit_failure_pops_frame_and_raises(gpu: FakeGPU) -> None:
    """A failing end record raises from the exit, and leaves no frame open."""
    timer = Timer(name="fail")
    with timer.region("warm"):
        pass
    entry = next(iter(_cuda.BACKEND.entries.values()))

    def boom() -> Any:
        raise RuntimeError("no more events")

    region = timer.region("r")
    region.__enter__()
    speedups.pooled(entry, True)  # the compiled pool's events back to entry.pool: none left
    entry.pool.clear()
    entry.make_event = boom
    with pytest.raises(RuntimeError, match="no more events"):
        region.__exit__(None, None, None)
    assert timer._local.stack == []


def test_switching_paths_keeps_pending_samples(gpu: FakeGPU) -> None:
    """Samples still on the GPU when the path is switched are reported, not dropped."""
    timer = Timer(name="switch")
    with timer.region("warm"):  # the stream's first region sets it up (general path)
        pass
    gpu.hold()
    for _ in range(5):
        with timer.region("r"):
            gpu.run(1.0)
    assert timer._core.pending() == 5
    _timer.use_compiled(False)
    with timer.region("r"):
        gpu.run(1.0)
    _timer.use_compiled(True)
    gpu.release()
    s = timer.summary()
    assert s["r"].calls == 6 and s["r"].gpu.count == 6 and s.pending == 0


def test_compiled_path_caps_raw_samples_per_step(
    gpu: FakeGPU, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The compiled harvest drops a step's raw samples past STEP_SAMPLE_CAP, and the window
    leaves that step out, as the Python path does."""
    monkeypatch.setattr(_steps, "STEP_SAMPLE_CAP", 5)
    timer = Timer(name="cap-c")
    with timer.region("warm"):  # the stream's first region sets it up (general path)
        pass
    for _ in range(7):
        with timer.region("r"):
            gpu.run(1.0)
    assert timer._core.pending() == 7  # these went through the compiled path
    _cuda.BACKEND.drain(1.0)  # harvested in C, not yet handed to Python
    assert timer._core.series == 0  # the C side dropped the step's samples at once (memory)
    timer.step()
    for _ in range(3):
        with timer.region("r"):
            gpu.run(2.0)
    s = timer.summary(steps=range(0, 2))
    assert s["r"].calls == 3 and s["r"].gpu_total_ms == pytest.approx(6.0)
    assert dict(s.meta)["window_note"].startswith("step 0 left out")
    assert timer.summary()["r"].calls == 10


def test_compiled_hooks_fall_back_for_disabled_and_side_streams(gpu: FakeGPU) -> None:
    """A disabled Timer, a side stream, a host-clock region: the Python paths take over."""
    timer = Timer(name="fb")
    side = gpu.new_stream()
    with timer.region("default"):
        gpu.run(1.0)
    with gpu.use(side), timer.region("side"):
        gpu.run(4.0)
    with timer.region("host", clock="host"):
        pass
    timer.disable()
    with timer.region("off"):
        pass
    timer.enable()
    s = timer.summary()
    assert s["side"].gpu_total_ms == pytest.approx(4.0)
    assert s["host"].clock == "host"
    assert "off" not in [r.name for r in s.regions]


def test_compiled_path_under_nvtx_injection(tmp_path: Path) -> None:
    """The compiled hooks push and pop NVTX ranges exactly, also when the body or record fails."""
    try:
        from tests.nvtx_harness import HarnessUnavailable, run_with_injection, trace
    except ImportError:  # pragma: no cover
        pytest.skip("NVTX harness unavailable")
    if speedups is None:
        pytest.skip("the compiled module is not built here")
    code = """
        import pytest
        from cudatimer import Timer, _cuda, _steps, _timer
        from tests.fake_cuda import install
        install(pytest.MonkeyPatch())
        assert _timer.compiled()
        t = Timer(name="n")
        with t.region("outer"):
            with t.region("inner"):
                pass
        try:
            with t.region("raises"):
                raise KeyError("x")
        except KeyError:
            pass
        entry = next(iter(_cuda.BACKEND.entries.values()))
        def boom():
            raise RuntimeError("no events")
        _cuda._speedups.pooled(entry, True)
        entry.pool.clear()
        entry.make_event = boom
        try:
            with t.region("record_fails"):
                pass
        except RuntimeError:
            pass
        assert t._local.stack == []
    """
    try:
        recs = run_with_injection(code)
    except HarnessUnavailable as exc:
        pytest.skip(str(exc))
    assert trace(recs) == ["+outer", "+inner", "-inner", "-outer", "+raises", "-raises",
                           "+record_fails", "-record_fails"]


def _scenario(gpu: FakeGPU, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, ...]:
    """A run that takes every branch of the harvest: batches every 4 exits while the GPU lags
    (binary search, samples put back), side-stream ends, a reset with samples pending, the
    trace ring and the step window overflowing. Returns what a user can read of it, less the
    host times (they differ from run to run)."""
    monkeypatch.setattr(_cuda, "HARVEST_BATCH", 4)
    timer = Timer(name="diff", trace_samples=5, keep_steps=2)
    side = gpu.new_stream()
    for step in range(4):
        if step == 1:
            gpu.hold()  # the GPU falls behind: harvests find only part of the backlog done
        for i in range(6):
            with timer.region("a"):
                gpu.run(1.0 + i)
                with timer.region("b"):
                    gpu.run(0.5)
            with timer.region("s", streams=[side]):
                gpu.run(0.25)
                gpu.run(2.0 + step, side)
        if step == 1:
            gpu.release()
        if step == 2:
            timer.reset()  # what was recorded before is gone, pending samples included
            gpu.run(150.0)  # trace placement moves its anchor (past _cuda.ANCHOR_HOP_MS)
        timer.step()
    s = timer.summary(step_stats=True, trace=True)
    regions = tuple(
        (r.name, r.clock, r.calls, r.skipped, r.gpu_total_ms, r.gpu_min_ms, r.gpu_max_ms,
         r.gpu_p50_ms, r.cpu.count)
        for r in s.regions
    )
    steps = tuple((t.step, t.name, t.clock, t.calls, t.gpu_ms) for t in s.step_stats)
    # GPU start times are placed from a host reference: compare them relative to the first.
    first = s.trace[0].gpu_start_ms if s.trace else 0.0
    trace = tuple(
        (t.name, t.step, t.gpu_ms, round((t.gpu_start_ms or 0.0) - (first or 0.0), 6))
        for t in s.trace
    )
    return regions, steps, trace, s.pending


def test_compiled_harvest_matches_python(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same scenario through the compiled and the Python paths reads back identically."""
    if speedups is None:
        pytest.skip("the compiled module is not built here")
    got = {}
    was = _timer.compiled()
    try:
        for compiled in (True, False):
            with pytest.MonkeyPatch.context() as mp:
                assert _timer.use_compiled(compiled) is compiled
                assert _timer.compiled() is compiled
                got[compiled] = _scenario(install(mp), mp)
    finally:
        _timer.use_compiled(was)
    regions, steps, trace, pending = got[True]
    assert {r[0] for r in regions} == {"a", "a/b", "s"} and pending == 0
    # reset() restarts the step count: the step after it is 1, and only it was recorded since.
    assert len(trace) == 5 and {t[0] for t in steps} == {1}
    assert got[True] == got[False]
