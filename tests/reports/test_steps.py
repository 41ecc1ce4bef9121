"""Steps: step() boundaries, windows (last=, steps=, warmup=) and per-step series."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

import cudatimer
from cudatimer import Histogram, StepStats, Summary, Timer
from cudatimer.recorder import _recorder
from cudatimer.recorder import _steps as steps_module
from cudatimer.render._report import render
from tests.helpers.report_fixtures import gpu_run


class _Clock:
    """A host clock the test moves by hand, so every duration is known exactly."""

    def __init__(self) -> None:
        self.ns = 10**9

    def __call__(self) -> int:
        return self.ns

    def advance(self, ms: float) -> None:
        self.ns += round(ms * 1e6)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Clock]:
    fake = _Clock()
    monkeypatch.setattr(_recorder, "_now", fake)  # the general path's host clock
    yield fake


def _ms(ms: float) -> float:
    """What the recorder stores for a duration of ``ms`` on the fake clock."""
    return round(ms * 1e6) * 1e-6


def _run(t: Timer, clock: _Clock, steps: Sequence[Sequence[float]], *, finish: bool = True) -> None:
    """One step per list: a call of outer/work per duration; step() after each but the last
    when ``finish`` is False (that step stays in progress)."""
    for i, durations in enumerate(steps):
        for ms in durations:
            with t.region("outer"), t.region("work"):
                clock.advance(ms)
        if finish or i < len(steps) - 1:
            t.step()


def test_step_returns_increasing_numbers() -> None:
    """step() returns 1, 2, 3...; a whole-run summary counts the steps marked."""
    assert [cudatimer.step() for _ in range(3)] == [1, 2, 3]
    assert cudatimer.summary().steps == 3


def test_step_series_per_step_sums(clock: _Clock) -> None:
    """step_series() gives, per step and region, the calls and the summed times."""
    t = Timer(name="series", clock="host")
    _run(t, clock, [[1.0], [2.0, 3.0], [4.0]])
    series = t.step_series()
    work = [s for s in series if s.name == "outer/work"]
    assert [(s.step, s.calls, s.gpu_ms) for s in work] == [(0, 1, None), (1, 2, None), (2, 1, None)]
    assert work[1].cpu_ms == pytest.approx(_ms(2.0) + _ms(3.0), rel=1e-12)
    assert all(isinstance(s, StepStats) for s in series)
    # Tree order inside a step: the parent before its child.
    assert [s.name for s in series if s.step == 1] == ["outer", "outer/work"]


def test_last_covers_finished_steps_only(clock: _Clock) -> None:
    """last=N covers the N steps before the current one (step i here has i+1 calls)."""
    t = Timer(name="last", clock="host")
    _run(t, clock, [[1.0] * (i + 1) for i in range(5)], finish=False)  # step 4 in progress
    s = t.summary(last=2)
    assert s["outer/work"].calls == 3 + 4  # steps 2 and 3
    assert s.steps == 2
    assert dict(s.meta)["window"] == "steps 2-3"
    assert t.summary(last=100)["outer/work"].calls == 1 + 2 + 3 + 4  # all finished steps
    assert t.summary()["outer/work"].calls == 15  # the whole run includes step 4


def test_warmup_skips_first_steps(clock: _Clock) -> None:
    """warmup=K drops steps 0..K-1, alone or with last=."""
    t = Timer(name="warm", clock="host")
    _run(t, clock, [[1.0] * (i + 1) for i in range(5)])
    assert t.summary(warmup=3)["outer/work"].calls == 4 + 5
    assert t.summary(warmup=3, last=4)["outer/work"].calls == 4 + 5  # warm-up wins
    assert t.summary(warmup=1, last=1)["outer/work"].calls == 5
    assert [s.step for s in t.step_series(warmup=4) if s.name == "outer"] == [4]


def test_steps_range_and_iterable(clock: _Clock) -> None:
    """steps= takes a range or step numbers, the step in progress included when named."""
    t = Timer(name="range", clock="host")
    _run(t, clock, [[1.0] * (i + 1) for i in range(4)], finish=False)  # step 3 in progress
    assert t.summary(steps=range(1, 3))["outer/work"].calls == 2 + 3
    assert t.summary(steps=[0, 3])["outer/work"].calls == 1 + 4
    assert t.summary(steps=range(0, 4, 2))["outer/work"].calls == 1 + 3
    assert t.summary(steps=range(2, 10)).steps == 2  # steps 2 and 3 exist
    assert t.summary(steps=range(1, 3), warmup=2)["outer/work"].calls == 3


def test_window_statistics_are_exact(clock: _Clock) -> None:
    """A window's percentiles and extremes come from its own samples, not the whole run's."""
    t = Timer(name="exact", clock="host")
    window = [1.0, 2.0, 3.0, 4.0, 100.0]
    _run(t, clock, [[1000.0], window[:2], window[2:]])
    s = t.summary(warmup=1)["outer/work"]
    expected = Histogram.of([_ms(v) for v in window])
    assert s.cpu == expected
    assert s.cpu_max_ms == _ms(100.0)
    assert t.summary()["outer/work"].cpu_max_ms == _ms(1000.0)


def test_window_keeps_tree_order_and_depth(clock: _Clock) -> None:
    """Window regions come parents first, with their depth, like a whole-run summary."""
    t = Timer(name="order", clock="host")
    _run(t, clock, [[1.0], [1.0]])
    regions = t.summary(last=1).regions
    assert [(r.name, r.depth) for r in regions] == [("outer", 0), ("outer/work", 1)]


def test_empty_window(clock: _Clock) -> None:
    """A summary of a window with no finished step is empty, and rendering it says why."""
    t = Timer(name="empty", clock="host")
    _run(t, clock, [[1.0]], finish=False)
    s = t.summary(last=3)
    assert s.regions == () and s.steps == 0
    assert dict(s.meta)["window"] == "no steps"
    assert "no regions recorded" in render(s)
    assert "this summary's window holds no step, so it has no regions" in render(s)


def _calls_by_step(n: int) -> None:
    """``n`` finished steps of the default Timer; step k makes k + 1 calls of "it"."""
    for k in range(n):
        for _ in range(k + 1):
            with cudatimer.cuda_region("it"):
                pass
        cudatimer.step()


def _plotted(monkeypatch: pytest.MonkeyPatch, window: dict[str, object]) -> Summary:
    """The Summary ``cudatimer.plot`` renders for ``window`` (its PNG renderer replaced)."""
    from cudatimer.render import _plot

    seen: list[Summary] = []
    monkeypatch.setattr(_plot, "render_png", lambda s, **_: seen.append(s) or b"png")
    cudatimer.plot(io.BytesIO(), **window)  # type: ignore[arg-type]
    return seen[0]


def test_every_output_covers_the_window_it_is_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every output, given steps=[1] (2 calls) and last=1 (step 2: 3 calls), covers it."""
    pytest.importorskip("pandas")
    _calls_by_step(3)
    for window, calls, label in (({"steps": [1]}, 2, "step 1"), ({"last": 1}, 3, "step 2")):
        out = io.StringIO()
        text = cudatimer.report(file=out, fmt="plain", columns=["region", "calls"], **window)
        assert text.splitlines()[1].split() == ["it", str(calls)]
        saved = cudatimer.save(tmp_path / "run.json", **window)
        assert cudatimer.load(tmp_path / "run.json") == saved and saved["it"].calls == calls
        assert [(s.step, s.calls) for s in cudatimer.step_series(**window)] == [
            (int(label.split()[1]), calls)
        ]
        trace = io.StringIO()
        cudatimer.export_trace(trace, **window)
        doc = json.loads(trace.getvalue())
        assert doc["otherData"]["window"] == label
        assert sum(e["name"] == "it" and e["ph"] == "X" for e in doc["traceEvents"]) == calls
        table = io.StringIO()
        cudatimer.to_csv(table, **window)
        assert [row["calls"] for row in csv.DictReader(io.StringIO(table.getvalue()))] == [
            str(calls)
        ]
        assert cudatimer.to_dataframe(**window)["calls"].tolist() == [calls]
        page = io.StringIO()
        cudatimer.html(page, **window)
        assert f'["steps","1 ({label})"]' in page.getvalue()
        assert _plotted(monkeypatch, window)["it"].calls == calls


@pytest.mark.parametrize(
    "verb",
    ["report", "save", "step_series", "export_trace", "to_csv", "to_dataframe", "plot", "html"],
)
def test_every_output_takes_the_same_window_options(tmp_path: Path, verb: str) -> None:
    """Each output's options hold the window's, and an unknown one is refused listing them."""
    from cudatimer.regions import _output

    window = tuple(_output.Window.__annotations__)
    assert window == ("timeout_s", "last", "steps", "warmup")
    timer = Timer(name="opts")
    with timer.region("it"):
        pass
    timer.step()
    method = getattr(timer, verb)
    needs_path = verb in ("save", "export_trace", "to_csv", "plot", "html")
    target: tuple[object, ...] = (
        (tmp_path / ("out.png" if verb == "plot" else f"out.{verb}"),) if needs_path else ()
    )
    if verb == "report":
        target, extra = (), {"file": io.StringIO()}
    else:
        extra = {}
    with pytest.raises(TypeError) as info:
        method(*target, warm_up=1, **extra)
    message = str(info.value)
    assert message.startswith(f"{verb}() got unknown option(s) warm_up; its options are ")
    assert message.split("its options are ")[1].startswith(", ".join(window))
    optional = {"plot": "matplotlib", "to_dataframe": "pandas"}
    if verb in optional:
        pytest.importorskip(optional[verb])
    method(*target, timeout_s=5.0, last=1, steps=None, warmup=0, **extra)


def test_dropped_steps_are_noted(clock: _Clock) -> None:
    """Steps older than keep_steps are gone: the window says so and covers what is kept."""
    t = Timer(name="drop", clock="host", keep_steps=3)
    _run(t, clock, [[1.0] * (i + 1) for i in range(6)])
    s = t.summary(steps=range(0, 6))
    assert s["outer/work"].calls == 4 + 5 + 6
    assert dict(s.meta)["window_note"] == "steps before 3 are no longer kept (keep_steps=3)"
    assert "steps before 3 are no longer kept" in render(s)


def test_step_over_the_sample_cap_is_left_out(
    clock: _Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step past STEP_SAMPLE_CAP raw samples drops them: windows leave it out and say so;
    whole-run statistics still count every call."""
    monkeypatch.setattr(steps_module, "STEP_SAMPLE_CAP", 8)
    t = Timer(name="cap", clock="host")
    _run(t, clock, [[1.0] * 7, [2.0] * 3])  # 14 samples (outer and outer/work), then 6
    s = t.summary(steps=range(0, 2))
    assert s["outer/work"].calls == 3 and s["outer/work"].cpu_total_ms == pytest.approx(6.0)
    note = dict(s.meta)["window_note"]
    assert note.startswith("step 0 left out: regions ran more than 8 times in one step")
    assert {x.step for x in t.step_series()} == {1}
    assert t.summary()["outer/work"].calls == 10


def test_dropped_step_still_ages_out_on_time(
    clock: _Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dropped step keeps its place among the last keep_steps steps: older steps still age
    out, and a window over them says they are no longer kept."""
    monkeypatch.setattr(steps_module, "STEP_SAMPLE_CAP", 8)
    t = Timer(name="age", clock="host", keep_steps=3)
    _run(t, clock, [[1.0], [1.0], [1.0], [1.0], [1.0] * 5, [1.0]])  # step 4 is dropped
    s = t.summary(steps=range(0, 6))
    assert s["outer/work"].calls == 2  # steps 3 and 5
    note = dict(s.meta)["window_note"]
    assert "step 4 left out" in note and "steps before 3 are no longer kept" in note


def test_raw_samples_stay_bounded_without_step_calls() -> None:
    """A run that never calls step() keeps at most STEP_SAMPLE_CAP raw samples."""
    t = Timer(name="no-steps", clock="host")
    r = t.region("hot")
    for _ in range(steps_module.STEP_SAMPLE_CAP + 100):
        with r:
            pass
    snap = t.recorder.store.snapshot(series=True)
    kept = sum(len(row.cpu_ms) // 8 for row in snap.series)
    assert kept == 0 and snap.dropped == (0,)
    assert t.summary()["hot"].calls == steps_module.STEP_SAMPLE_CAP + 100


def test_window_report_note(clock: _Clock) -> None:
    """A window report says which steps it covers."""
    t = Timer(name="note", clock="host")
    _run(t, clock, [[1.0]] * 4)
    out = io.StringIO()
    text = t.report(last=2, file=out)
    assert "note: statistics cover steps 2-3 (2 step(s))" in text


def test_window_note_mentions_whole_run_syncs() -> None:
    """Sync counts are not kept per step, and a window report says they cover the whole run."""
    s = dataclasses.replace(gpu_run(), meta=(("window", "steps 1-2"),), steps=2)
    assert "statistics cover steps 1-2 (2 step(s)); sync counts cover the whole run" in render(s)


def test_module_level_windows(clock: _Clock) -> None:
    """cudatimer.summary/report/step_series take the same window options."""
    for i in range(3):
        for _ in range(i + 1):
            with cudatimer.cuda_region("m", clock="host"):
                clock.advance(1.0)
        cudatimer.step()
    assert cudatimer.summary(last=1)["m"].calls == 3
    assert [s.calls for s in cudatimer.step_series(warmup=1)] == [2, 3]
    assert "steps 1-2" in cudatimer.report(warmup=1, file=io.StringIO())


@pytest.mark.parametrize(
    ("options", "error", "text"),
    [
        ({"last": 0}, ValueError, "last must be >= 1"),
        ({"last": -1}, ValueError, "last must be >= 0"),
        ({"last": 1.5}, TypeError, "last must be an int"),
        ({"warmup": -2}, ValueError, "warmup must be >= 0"),
        ({"warmup": True}, TypeError, "warmup must be an int"),
        ({"last": 2, "steps": range(3)}, ValueError, "either last= or steps="),
        ({"steps": "12"}, TypeError, "steps must be a range or an iterable"),
        ({"steps": [1, -1]}, ValueError, "each step in steps must be >= 0"),
        ({"steps": range(5, 0, -1)}, ValueError, "ascending range"),
    ],
)
def test_window_options_checked(options: dict[str, object], error: type, text: str) -> None:
    """Bad window options raise, naming the argument and what is expected."""
    with pytest.raises(error, match=text):
        cudatimer.summary(**options)  # type: ignore[call-overload]


def test_window_needs_kept_steps() -> None:
    """A Timer that keeps no per-step samples refuses windows, saying why."""
    t = Timer(name="nokeep", keep_steps=0)
    with pytest.raises(ValueError, match="keep_steps=0"):
        t.summary(last=1)
    assert t.summary().regions == ()  # the whole run still works


def test_whole_run_series_includes_every_kept_step(clock: _Clock) -> None:
    """summary(step_stats=True) without a window lists every kept step, current one too."""
    t = Timer(name="all", clock="host")
    _run(t, clock, [[1.0], [1.0], [1.0]], finish=False)
    steps = sorted({s.step for s in t.summary(step_stats=True).step_stats})
    assert steps == [0, 1, 2]
    assert not math.isnan(t.summary(step_stats=True).step_stats[0].cpu_ms)
