"""Messages that point at the cause: an empty window, a missing folder, a disabled cudatimer,
the Python core."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

import cudatimer
from tests.subproc import run_python


def _steps_never_marked() -> None:
    for _ in range(3):
        with cudatimer.cuda_region("train_step"):
            pass


@pytest.mark.parametrize(
    ("verb", "call"),
    [
        ("save", lambda p: cudatimer.save(p / "run.json", warmup=5)),
        ("export_trace", lambda p: cudatimer.export_trace(p / "trace.json", last=10)),
        ("plot", lambda p: cudatimer.plot(p / "report.png", warmup=5)),
    ],
)
def test_window_without_steps_says_no_step_was_marked(
    tmp_path: Path, verb: str, call: object
) -> None:
    """save/export_trace/plot with a window but no step() say so and how to mark one."""
    _steps_never_marked()
    with pytest.raises(ValueError, match="no step was marked") as info:
        call(tmp_path)  # type: ignore[operator]
    message = str(info.value)
    assert message.startswith(f"{verb}(")
    assert "cudatimer.step()" in message and "once after each iteration" in message
    assert not list(tmp_path.iterdir())  # nothing written: not an empty run


def test_window_past_the_marked_steps_says_how_many(tmp_path: Path) -> None:
    """A window beyond the marked steps names how many there are."""
    for _ in range(2):
        _steps_never_marked()
        cudatimer.step()
    with pytest.raises(ValueError, match=r"2 step\(s\) were marked.*finished steps 0-1"):
        cudatimer.save(tmp_path / "run.json", warmup=5)


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
    assert message.startswith("report() got an unknown option warm_up=5 (did you mean warmup=?)")
    options = message.split("its options are: ")[1].split(", ")
    assert {"view", "sort", "fmt", "columns", "warmup", "last", "file", "summary"} <= set(options)
    assert "render" not in message


def test_report_of_a_positional_run_hints_at_summary() -> None:
    """report(run) refuses the positional argument and says to pass it as summary=."""
    _steps_never_marked()
    run = cudatimer.summary()
    with pytest.raises(TypeError, match=r"pass it as report\(summary=cudatimer.load\(path\)\)"):
        cudatimer.report(run)
    assert "train_step" in cudatimer.report(summary=run, file=io.StringIO())
