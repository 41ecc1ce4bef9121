"""Messages that point at the cause: an empty window (the same for every output), a missing
folder, a disabled cudatimer, the Python core."""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import cudatimer
from tests.helpers.subproc import run_python


def _steps_never_marked() -> None:
    for _ in range(3):
        with cudatimer.cuda_region("train_step"):
            pass


def _finished_steps(n: int, timer: cudatimer.Timer | None = None) -> None:
    """``n`` finished steps of the default Timer (or ``timer``), step k making k + 1 calls."""
    t = cudatimer.default_timer() if timer is None else timer
    for k in range(n):
        for _ in range(k + 1):
            with t.region("train_step"):
                pass
        t.step()


#: Every output of the default Timer, called with a window (and the options it needs).
OUTPUTS: dict[str, Callable[[Path, dict[str, Any]], object]] = {
    "report": lambda p, w: cudatimer.report(file=io.StringIO(), **w),
    "save": lambda p, w: cudatimer.save(p / "run.json", **w),
    "step_series": lambda p, w: cudatimer.step_series(**w),
    "export_trace": lambda p, w: cudatimer.export_trace(p / "trace.json", **w),
    "to_csv": lambda p, w: cudatimer.to_csv(p / "r.csv", **w),
    "to_dataframe": lambda p, w: cudatimer.to_dataframe(**w),
    "plot": lambda p, w: cudatimer.plot(p / "r.png", **w),
    "html": lambda p, w: cudatimer.html(p / "r.html", **w),
}


@pytest.mark.parametrize("verb", sorted(OUTPUTS))
def test_every_output_refuses_a_window_past_the_finished_steps(tmp_path: Path, verb: str) -> None:
    """warmup=100 after 3 finished steps: every output says so, naming both, and writes nothing."""
    _finished_steps(3)
    with pytest.raises(ValueError) as info:
        OUTPUTS[verb](tmp_path, {"warmup": 100})
    assert str(info.value) == (
        f"{verb}(warmup=100): the window holds no step: it asks for the finished steps from "
        "step 100 on, but 3 steps finished (steps 0-2; step 3 is in progress). Ask for steps "
        "that ran, or leave out last/steps/warmup to use the whole run"
    )
    assert not list(tmp_path.iterdir())  # nothing written: not an empty run


@pytest.mark.parametrize("verb", sorted(OUTPUTS))
def test_every_output_refuses_a_window_without_step(tmp_path: Path, verb: str) -> None:
    """warmup=5 with no step() at all: every output says no step was marked and how to mark one."""
    _steps_never_marked()
    with pytest.raises(ValueError) as info:
        OUTPUTS[verb](tmp_path, {"warmup": 5})
    assert str(info.value) == (
        f"{verb}(warmup=5): the window holds no step: it asks for the finished steps from step "
        "5 on, but no step has finished: step() was never called, so every call so far is in "
        "step 0, which is still in progress. Call cudatimer.step() (or timer.step()) once "
        "after each iteration, or leave out last/steps/warmup to use the whole run"
    )
    assert not list(tmp_path.iterdir())


def test_report_past_the_steps_says_what_happened_not_no_regions() -> None:
    """report(warmup=100) after 3 steps names the 3 steps and the window, not "no regions"."""
    _finished_steps(3)
    timer = cudatimer.Timer(name="own")
    _finished_steps(3, timer)
    for call in (lambda: cudatimer.report(warmup=100), lambda: timer.report(warmup=100)):
        with pytest.raises(ValueError, match="from step 100 on, but 3 steps finished") as info:
            call()
        assert "no regions" not in str(info.value) and "step() was never" not in str(info.value)


@pytest.mark.parametrize(
    ("window", "asked"),
    [
        ({"steps": [7, 9]}, "steps=[7, 9]): the window holds no step: it asks for steps 7, 9, "),
        ({"steps": range(10, 20)}, "it asks for steps 10-19, but"),
        ({"steps": range(10, 20, 2)}, "it asks for the steps of range(10, 20, 2), but"),
        ({"steps": [12]}, "it asks for step 12, but"),
        ({"steps": []}, "it asks for no step (steps is empty), but"),
        ({"last": 2, "warmup": 9}, "it asks for the last 2 finished steps from step 9 on, but"),
        ({"last": 1, "warmup": 4}, "it asks for the last finished step from step 4 on, but"),
    ],
)
def test_an_empty_window_is_named_as_it_was_asked(
    tmp_path: Path, window: dict[str, Any], asked: str
) -> None:
    """The message says which steps the window asked for, however it asked."""
    _finished_steps(1)
    with pytest.raises(ValueError) as info:
        cudatimer.save(tmp_path / "run.json", **window)
    message = str(info.value)
    assert asked in message
    assert "1 step finished (step 0; step 1 is in progress)" in message


def test_an_empty_window_of_steps_no_longer_kept_says_so() -> None:
    """Steps dropped past keep_steps are named as the reason the window is empty."""
    timer = cudatimer.Timer(name="kept", keep_steps=2)
    _finished_steps(5, timer)
    with pytest.raises(ValueError) as info:
        timer.report(steps=range(0, 2), file=io.StringIO())
    message = str(info.value)
    assert "5 steps finished (steps 0-4; step 5 is in progress); steps before 3 are no longer " in (
        message
    )
    assert "kept (keep_steps=2). Ask for steps that ran and are still kept" in message


def test_window_with_steps_still_saves(tmp_path: Path) -> None:
    """A window that holds steps is saved as before."""
    for _ in range(7):
        _steps_never_marked()
        cudatimer.step()
    saved = cudatimer.save(tmp_path / "run.json", warmup=5)
    assert saved.steps == 2 and saved["train_step"].calls == 6


def test_save_creates_a_missing_folder(tmp_path: Path) -> None:
    """save() into a missing folder creates it, as mkdir -p would."""
    _steps_never_marked()
    target = tmp_path / "timings" / "deep" / "rank0.json"
    cudatimer.save(target)
    assert cudatimer.load(target)["train_step"].calls == 3
    assert sorted(p.name for p in target.parent.iterdir()) == ["rank0.json"]


def test_write_errors_name_the_users_path(tmp_path: Path) -> None:
    """A file that cannot be written is named as the user gave it, never as a temporary file."""
    _steps_never_marked()
    (tmp_path / "afile").write_text("")
    target = tmp_path / "afile" / "rank0.json"
    with pytest.raises(NotADirectoryError) as info:
        cudatimer.save(target)
    assert info.value.filename == str(target) and ".tmp" not in str(info.value)
    (tmp_path / "adir").mkdir()
    with pytest.raises(IsADirectoryError) as onto:
        cudatimer.save(tmp_path / "adir")
    assert onto.value.filename == str(tmp_path / "adir") and ".tmp" not in str(onto.value)
    assert onto.value.filename2 is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir", "afile"]  # no temporary left
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        with pytest.raises(PermissionError) as denied:
            cudatimer.save(locked / "run.json")
        assert denied.value.filename == str(locked / "run.json")


def _report_with(env: dict[str, str]) -> str:
    """What the default Timer's report prints in a fresh process with ``env``."""
    done = run_python(
        """
        import cudatimer
        with cudatimer.cuda_region("a"):
            pass
        cudatimer.report()
        """,
        env,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_report_says_cudatimer_is_disabled_and_by_what() -> None:
    """Under CUDATIMER_DISABLE=1 the report names the variable, not only "no regions"."""
    out = _report_with({"CUDATIMER_DISABLE": "1"})
    assert "no regions recorded" in out
    assert "cudatimer is disabled: CUDATIMER_DISABLE was set" in out


def test_report_says_a_timer_is_disabled() -> None:
    """A Timer switched off says so in its report, and how to switch it back on."""
    timer = cudatimer.Timer(name="off", enabled=False)
    with timer.region("a"):
        pass
    text = timer.report(file=io.StringIO())
    assert "this Timer is disabled" in text and "enable()" in text
    assert "disabled" not in cudatimer.Timer(name="on").report(file=io.StringIO())


def test_report_notes_the_python_core() -> None:
    """Where the Python core runs, the report says so, why, and what it costs."""
    out = _report_with({"CUDATIMER_PURE_PYTHON": "1"})
    assert "the recorder runs its Python core, about 2.4x the C core" in out
    assert "CUDATIMER_PURE_PYTHON is set" in out


def test_report_has_no_core_note_on_the_c_core() -> None:
    """With the C core running, no note about the core is added."""
    if not cudatimer.compiled():
        pytest.skip("the C core was not built here")
    with cudatimer.cuda_region("a"):
        pass
    assert "Python core" not in cudatimer.report(file=io.StringIO())


def test_report_names_an_unknown_option_and_lists_the_options() -> None:
    """report(warm_up=5) says which option is unknown, the one meant, and every option, not
    the renderer's internal name."""
    _steps_never_marked()
    with pytest.raises(TypeError) as info:
        cudatimer.report(warm_up=5)
    message = str(info.value)
    assert message.startswith("report() got unknown option(s) warm_up; its options are ")
    assert message.endswith(" (did you mean warmup=?)")
    options = message.split("its options are ")[1].split(" (did")[0].split(", ")
    assert {"view", "sort", "fmt", "columns", "warmup", "last", "file", "summary"} <= set(options)
    assert "render" not in message


def test_report_of_a_positional_run_hints_at_summary() -> None:
    """report(run) refuses the positional argument and says to pass it as summary=."""
    _steps_never_marked()
    run = cudatimer.summary()
    with pytest.raises(TypeError, match=r"pass it as report\(summary=cudatimer.load\(path\)\)"):
        cudatimer.report(run)
    assert "train_step" in cudatimer.report(summary=run, file=io.StringIO())
