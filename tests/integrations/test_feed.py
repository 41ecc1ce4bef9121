"""Per-step region times sent to sinks as steps finish (``StepFeed``, ``cudatimer.sinks``):
exactly once, in step order, never waiting for the GPU, and nothing lost when a sink raises.
GPU lag is played by the fake CUDA (tests/helpers/fake_cuda.py)."""

from __future__ import annotations

import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import cudatimer
import cudatimer.sinks
from cudatimer import StepFeed, StepTimes, Timer
from tests.helpers.extras import needs
from tests.helpers.fake_cuda import FakeGPU, install

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def gpu() -> Iterator[FakeGPU]:
    with install() as fake:
        yield fake


def _loop(timer: Timer, feed: StepFeed, steps: int, gpu: FakeGPU | None = None) -> None:
    for i in range(steps):
        with timer.region("train_step"):
            with timer.region("forward"):
                if gpu is not None:
                    gpu.run(1.0 + i)
            with timer.region("backward"):
                if gpu is not None:
                    gpu.run(2.0)
        feed.step()


def test_host_clock_steps_are_sent_once_in_order_with_names_and_nesting() -> None:
    """Without a GPU each step is sent at its boundary: names, nesting, calls and clocks."""
    timer = Timer(name="feed-host")
    got: list[StepTimes] = []
    feed = StepFeed(got.append, timer=timer)
    _loop(timer, feed, 4)
    assert [t.step for t in got] == [0, 1, 2, 3]
    assert [r.name for r in got[2].regions] == [
        "train_step",
        "train_step/forward",
        "train_step/backward",
    ]
    assert {(r.clock, r.calls, r.gpu_ms) for r in got[2].regions} == {("host", 1, None)}
    assert feed.close() == 0 and feed.sent == 4
    assert [t.step for t in got] == [0, 1, 2, 3]  # close sends nothing twice


def test_gpu_steps_wait_for_the_gpu_without_blocking(gpu: FakeGPU) -> None:
    """Steps whose GPU work runs are held back, then sent in order with GPU times."""
    timer = Timer(name="feed-gpu")
    got: list[StepTimes] = []
    feed = StepFeed(got.append, timer=timer)
    _loop(timer, feed, 2, gpu)
    assert [t.step for t in got] == [0, 1]
    gpu.hold()  # the GPU falls behind: nothing recorded from now on finishes
    _loop(timer, feed, 3, gpu)
    assert [t.step for t in got] == [0, 1], "a step was sent before its GPU work finished"
    gpu.release()
    assert feed.poll() == 3
    assert [t.step for t in got] == [0, 1, 2, 3, 4]
    step3 = {r.name: r for r in got[3].regions}
    assert step3["train_step/forward"].gpu_ms == pytest.approx(2.0)  # the second i=1
    assert step3["train_step/backward"].gpu_ms == pytest.approx(2.0)
    assert step3["train_step"].gpu_ms == pytest.approx(4.0)
    assert step3["train_step"].clock == "cuda:0"
    assert feed.poll() == 0 and len(got) == 5


def test_a_step_is_sent_only_once_all_its_streams_finished(gpu: FakeGPU) -> None:
    """A step with work on a side stream waits for that stream too."""
    timer = Timer(name="feed-side")
    got: list[int] = []
    feed = StepFeed(lambda t: got.append(t.step), timer=timer)
    side = gpu.new_stream()
    with timer.region("main"):
        gpu.run(1.0)
    with gpu.use(side), timer.region("side"):
        gpu.run(1.0)
    gpu.hold(side)  # only the side stream lags
    feed.step()
    assert got == []
    gpu.release()
    feed.poll()
    assert got == [0]


def test_one_event_per_stream_and_step(gpu: FakeGPU) -> None:
    """Polling records one boundary event per stream and step, however many regions ran."""
    timer = Timer(name="feed-cost")
    feed = StepFeed(timer=timer)
    _loop(timer, feed, 1, gpu)
    before = gpu.records
    for _ in range(5):
        for _ in range(50):
            with timer.region("r"):
                gpu.run(0.1)
        feed.step()
        feed.poll()  # a poll without a new boundary records nothing
    assert gpu.records - before == 5 * (50 * 2 + 1)


def test_a_raising_sink_loses_nothing_and_the_run_goes_on() -> None:
    """A sink that raises gets that step again at the next poll; others are not affected."""
    timer = Timer(name="feed-raise")
    flaky: list[int] = []
    steady: list[int] = []
    fails = {1, 2}  # raises on its first two calls for step 1

    def sink(t: StepTimes) -> None:
        if t.step == 1 and fails:
            fails.pop()
            raise OSError("disk full")
        flaky.append(t.step)

    feed = StepFeed(sink, lambda t: steady.append(t.step), timer=timer)
    with pytest.warns(RuntimeWarning, match=r"raised OSError\('disk full'\) on step 1") as rec:
        _loop(timer, feed, 5)
    assert len([w for w in rec if "step sink" in str(w.message)]) == 1  # the first error only
    assert steady == [0, 1, 2, 3, 4]
    assert flaky == [0, 1, 2, 3, 4] and feed.failures == 2


def test_a_failing_sink_keeps_its_backlog_until_close() -> None:
    """A sink failing until the end gets its backlog in order once it recovers."""
    timer = Timer(name="feed-backlog")
    got: list[int] = []
    broken = [True]

    def sink(t: StepTimes) -> None:
        if broken[0]:
            raise ConnectionError("dashboard down")
        got.append(t.step)

    feed = StepFeed(sink, timer=timer)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        _loop(timer, feed, 3)
        assert feed.close() == 3  # three steps waiting for the sink
    broken[0] = False
    assert feed.close() == 0
    assert got == [0, 1, 2]


def test_close_waits_for_the_gpu_within_its_timeout(gpu: FakeGPU) -> None:
    """close() sends finished steps and reports those still running past its timeout."""
    timer = Timer(name="feed-close")
    got: list[int] = []
    feed = StepFeed(lambda t: got.append(t.step), timer=timer)
    gpu.hold()
    _loop(timer, feed, 2, gpu)
    assert feed.close(timeout_s=0.01) == 2 and got == []
    gpu.release()
    assert feed.close(timeout_s=1.0) == 0 and got == [0, 1]


def test_reset_starts_the_feed_again_from_step_zero() -> None:
    """After timer.reset() the feed follows the new steps from 0 and sends no old one."""
    timer = Timer(name="feed-reset")
    got: list[tuple[int, int]] = []
    feed = StepFeed(lambda t: got.append((t.step, len(t.regions))), timer=timer)
    _loop(timer, feed, 2)
    timer.reset()
    _loop(timer, feed, 2)
    assert got == [(0, 3), (1, 3), (0, 3), (1, 3)]


def test_match_keeps_only_matching_regions() -> None:
    """match= filters region paths as report(match=...) does."""
    timer = Timer(name="feed-match")
    got: list[StepTimes] = []
    feed = StepFeed(got.append, timer=timer, match="*/forward")
    _loop(timer, feed, 1)
    assert [r.name for r in got[0].regions] == ["train_step/forward"]


def test_scalars_name_paths_and_clocks() -> None:
    """scalars() gives gpu_ms on CUDA rows, cpu_ms on all, path@clock on a shared path."""
    times = StepTimes(
        7,
        (
            ("a", "cuda:0", 1, 2.0, 0.5),
            ("a/b", "host", 2, None, 0.25),
            ("a/b", "cuda:1", 1, 1.0, 0.1),
        ),
    )
    assert times.regions[1] == cudatimer.StepStats(7, "a/b", "host", 2, None, 0.25)
    assert times.scalars("t/") == {
        "t/a/gpu_ms": 2.0,
        "t/a/cpu_ms": 0.5,
        "t/a/b@host/cpu_ms": 0.25,
        "t/a/b@cuda:1/gpu_ms": 1.0,
        "t/a/b@cuda:1/cpu_ms": 0.1,
    }


def test_bad_arguments_name_what_was_expected() -> None:
    """Bad sinks, timers, match and keep_steps=0 raise errors naming the argument."""
    with pytest.raises(TypeError, match="each sink must be a callable"):
        StepFeed("print")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"timer must be a cudatimer\.Timer"):
        StepFeed(timer="default")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="match must be a glob"):
        StepFeed(match=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="keep_steps=0"):
        StepFeed(timer=Timer(name="nokeep", keep_steps=0))
    with pytest.raises(ValueError, match="timeout_s"):
        StepFeed().close(timeout_s=float("nan"))
    with pytest.raises(TypeError, match="writer must be"):
        cudatimer.sinks.tensorboard(object())
    with pytest.raises(TypeError, match="run must be a wandb Run"):
        cudatimer.sinks.wandb(object())


def test_tensorboard_sink_writes_every_step_to_a_real_summary_writer(tmp_path: Path) -> None:
    """The TensorBoard adapter's scalars reach an event file, one point per step."""
    needs("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    timer = Timer(name="feed-tb")
    writer = SummaryWriter(str(tmp_path))
    feed = StepFeed(cudatimer.sinks.tensorboard(writer, prefix="ct/"), timer=timer)
    _loop(timer, feed, 3)
    feed.close()
    writer.close()
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    assert sorted(tags) == [
        "ct/train_step/backward/cpu_ms",
        "ct/train_step/cpu_ms",
        "ct/train_step/forward/cpu_ms",
    ]
    assert [e.step for e in acc.Scalars("ct/train_step/cpu_ms")] == [0, 1, 2]


def test_tensorboard_sink_writes_one_event_per_step(tmp_path: Path) -> None:
    """A real SummaryWriter gets each step's scalars as one event, with the values sent."""
    needs("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp_path))
    calls: list[str] = []
    writer.add_scalar = lambda *a, **k: calls.append("add_scalar")  # type: ignore[method-assign]
    sink = cudatimer.sinks.tensorboard(writer, prefix="ct/")
    rows = (("a", "host", 1, None, 1.5), ("a/b", "host", 2, None, 0.25))
    for step in (4, 5):
        sink(cudatimer.StepTimes(step, rows))
    writer.close()
    assert calls == []  # never one call per value
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    assert sorted(acc.Tags()["scalars"]) == ["ct/a/b/cpu_ms", "ct/a/cpu_ms"]
    assert [(e.step, e.value) for e in acc.Scalars("ct/a/b/cpu_ms")] == [(4, 0.25), (5, 0.25)]


class _WandbRun:
    """A stand-in with wandb.Run's define_metric and log signatures."""

    def __init__(self) -> None:
        self.defined: list[tuple[str, str | None]] = []
        self.logged: list[dict[str, Any]] = []

    def define_metric(self, name: str, step_metric: str | None = None, **kw: Any) -> None:
        self.defined.append((name, step_metric))

    def log(
        self, data: dict[str, Any], step: int | None = None, commit: bool | None = None
    ) -> None:
        assert step is None, "a lagging step must not be logged with step="
        self.logged.append(dict(data))


def test_wandb_sink_logs_against_its_own_step_axis() -> None:
    """The wandb adapter declares its step metric once and logs every step with it."""
    run = _WandbRun()
    timer = Timer(name="feed-wandb")
    feed = StepFeed(cudatimer.sinks.wandb(run), timer=timer)
    _loop(timer, feed, 3)
    assert run.defined == [("cudatimer/step", None), ("cudatimer/*", "cudatimer/step")]
    assert [d["cudatimer/step"] for d in run.logged] == [0, 1, 2]
    assert set(run.logged[0]) == {
        "cudatimer/step",
        "cudatimer/train_step/cpu_ms",
        "cudatimer/train_step/forward/cpu_ms",
        "cudatimer/train_step/backward/cpu_ms",
    }


def test_wandb_sink_in_offline_mode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With wandb installed, the adapter logs to the current offline run."""
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    run = wandb.init(project="cudatimer-test", mode="offline")
    try:
        timer = Timer(name="feed-wandb-offline")
        feed = StepFeed(cudatimer.sinks.wandb(), timer=timer)
        _loop(timer, feed, 2)
        assert feed.failures == 0 and feed.sent == 2
        assert run.summary["cudatimer/step"] == 1
    finally:
        run.finish()


def test_importing_cudatimer_imports_no_framework() -> None:
    """import cudatimer (and cudatimer.sinks) loads no lightning, transformers, tensorboard
    or wandb; the integration modules load their own framework only."""
    code = (
        "import sys, cudatimer, cudatimer.sinks\n"
        "bad = [m for m in ('lightning', 'pytorch_lightning', 'transformers', 'tensorboard',"
        " 'wandb', 'torch.utils.tensorboard') if m in sys.modules]\n"
        "print(bad)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
    )
    assert out.stdout.strip() == "[]"
