"""A command line that starts at once: the package face, the records, the renderers and the
``cudatimer`` commands that read saved runs import no torch (2-4 s on a CPU machine); the
names that need it load on first use and work as before."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from importlib import metadata
from pathlib import Path

import pytest

import cudatimer
from cudatimer.render._export import save
from tests.helpers.report_fixtures import gpu_run, gpu_run_after
from tests.helpers.subproc import REPO_ROOT, run_python

#: Prints, after the snippet ran, whether torch was imported, as the last line of stdout.
_TORCH_IMPORTED = "\nimport sys\nprint('torch' in sys.modules)\n"


def _imports_torch(code: str) -> bool:
    done = run_python(textwrap.dedent(code) + _TORCH_IMPORTED, {})
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()[-1] == "True"


def test_import_cudatimer_imports_no_torch() -> None:
    """``import cudatimer`` leaves torch unimported; the records, load() and the face's
    functions are there."""
    assert not _imports_torch(
        "import cudatimer\n"
        "assert cudatimer.Summary and cudatimer.load and cudatimer.report\n"
        "assert isinstance(cudatimer.compiled(), bool)\n"
    )


def test_records_and_renderers_import_no_torch() -> None:
    """Every module of ``cudatimer.records`` and ``cudatimer.render`` imports without torch."""
    modules = sorted(
        f"cudatimer.{folder}.{p.stem}"
        for folder in ("records", "render")
        for p in (REPO_ROOT / "cudatimer" / folder).glob("_*.py")
        if p.stem != "__init__"
    )
    assert len(modules) >= 8
    assert not _imports_torch("".join(f"import {m}\n" for m in modules))


def test_a_lazy_name_imports_torch_and_works() -> None:
    """The first use of a name that needs torch loads it; the default Timer times as before
    and ``cuda_region`` is then a plain attribute (the Timer's bound method)."""
    code = """
        import cudatimer
        assert "cuda_region" not in vars(cudatimer)
        with cudatimer.cuda_region("step"):
            pass
        assert vars(cudatimer)["cuda_region"] == cudatimer.default_timer().region
        assert cudatimer.summary()["step"].calls == 1
        from cudatimer import Timer, instrument
        assert isinstance(cudatimer.default_timer(), Timer) and callable(instrument)
    """
    assert _imports_torch(code)


def test_the_face_lists_the_same_names() -> None:
    """``__all__`` names what the face gives (lazy names included), and ``dir()`` shows them."""
    for name in cudatimer.__all__:
        assert getattr(cudatimer, name) is not None, name
    assert set(cudatimer.__all__) <= set(dir(cudatimer))
    with pytest.raises(AttributeError, match="no attribute 'cuda_regoin'"):
        cudatimer.cuda_regoin  # noqa: B018


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("runs")
    paths = {"run": folder / "run.json", "after": folder / "after.json"}
    save(gpu_run(), paths["run"])
    save(gpu_run_after(), paths["after"])
    return paths


def _cli(args: list[str]) -> subprocess.CompletedProcess[str]:
    """``python -m cudatimer ARGS`` with a line after it that says whether torch was imported
    (the command's own exit is replaced by a print: ``main`` is called, not ``sys.exit``)."""
    code = (
        "import sys\nfrom cudatimer._cli import main\n"
        f"try:\n    status = main({args!r})\nexcept SystemExit as stop:\n    status = stop.code\n"
        "print('torch' in sys.modules, status)\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, timeout=120
    )


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["--version"],
        ["show", "{run}"],
        ["show", "{run}", "--view", "tree"],
        ["compare", "{run}", "{after}"],
        ["csv", "{run}", "--what", "steps"],
        ["trace", "{run}", "-o", "{folder}/t.json"],
        ["html", "{run}", "-o", "{folder}/r.html"],
    ],
)
def test_commands_import_no_torch(args: list[str], runs: dict[str, Path]) -> None:
    """--help, --version, show, compare, csv, trace and html of saved runs run without torch."""
    names = {"run": runs["run"], "after": runs["after"], "folder": runs["run"].parent}
    done = _cli([a.format(**names) for a in args])
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "False 0", done.stdout[-500:]


def test_version_without_torch_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where torch's metadata is absent, --version says so instead of failing."""
    from cudatimer import _cli

    def missing(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", missing)
    assert "(torch not installed; core: " in _cli._version()


def test_report_at_exit_of_a_program_that_only_read_runs(runs: dict[str, Path]) -> None:
    """With CUDATIMER_REPORT_AT_EXIT=1, a program that only loads a run exits without
    importing torch for the report."""
    code = f"""
        import atexit, sys
        atexit.register(lambda: print("torch" in sys.modules))  # runs after cudatimer's
        import cudatimer
        cudatimer.load({str(runs["run"])!r})
    """
    done = run_python(code, {"CUDATIMER_REPORT_AT_EXIT": "1"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False"] and "Traceback" not in done.stderr


def test_a_fork_while_a_thread_loads_the_lazy_names_waits_for_it() -> None:
    """A fork while another thread's first region is importing torch waits for the import:
    the child then times its own region (it hung, its import locks held by a thread it does
    not have), and no fork hook complains of a lock released without being taken."""
    code = """
        import os, threading, time, warnings
        import cudatimer
        warnings.simplefilter("ignore", DeprecationWarning)  # fork in a threaded process
        def first_region():
            with cudatimer.cuda_region("bg"):
                pass
        threading.Thread(target=first_region).start()
        time.sleep(0.05)  # torch's import takes seconds: the fork lands inside it
        pid = os.fork()
        if pid == 0:
            with cudatimer.cuda_region("child"):
                pass
            os._exit(0 if cudatimer.summary(timeout_s=1.0)["child"].calls == 1 else 3)
        deadline = time.monotonic() + 30
        while not os.waitpid(pid, os.WNOHANG)[0]:
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                raise SystemExit("the child hung")
            time.sleep(0.01)
        print("child done")
    """
    done = run_python(code, {})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["child", "done"]
    assert "Exception ignored" not in done.stderr, done.stderr
