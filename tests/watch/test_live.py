"""Watching a running job: ``cudatimer.live`` (and ``sinks.live``, ``CUDATIMER_LIVE``) publish
one file per rank from a daemon thread; ``cudatimer watch`` shows it full screen (driven here
in a real terminal, tmux) or as one frame (``--once``), and says when the run has not
started, has finished, has gone quiet (and where it is stuck) or was killed."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import cudatimer
import cudatimer.sinks
from cudatimer._cli import main
from cudatimer.core import _core_py
from cudatimer.render import _livefile, _watch
from tests.helpers.fake_cuda import FakeGPU, install

ROOT = Path(__file__).resolve().parents[2]

# A training loop in a subprocess: argv = path steps step_s mode [libspin]. Modes: run
# (publish, then exit), env-raise (CUDATIMER_LIVE publishes, no call; then an uncaught
# exception), block (then stay inside train_step/backward/allreduce), hang (the same, the
# main thread stuck in C code), handler (block, with a SIGTERM handler of its own).
WRITER = r"""
import os, signal, sys, time
import cudatimer

path, steps, step_s, mode = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
if mode == "handler":
    def own(signum, frame):
        print("OWN-HANDLER", flush=True)
        sys.exit(3)
    signal.signal(signal.SIGTERM, own)
if not mode.startswith("env"):
    cudatimer.live(path, every_s=0.25)
slow = float(os.environ.get("WRITER_SLOW", "1"))
stop = os.environ.get("WRITER_STOP")  # a file whose creation ends the loop early
for i in range(steps):
    if stop and os.path.exists(stop):
        break
    with cudatimer.cuda_region("train_step"):
        with cudatimer.cuda_region("forward"):
            time.sleep(step_s * 0.3)
        with cudatimer.cuda_region("backward"):
            time.sleep(step_s * 0.6 * slow)
    cudatimer.step()
print("STEPS-DONE", flush=True)
if mode in ("block", "hang", "handler"):
    with cudatimer.cuda_region("train_step"):
        with cudatimer.cuda_region("backward"):
            with cudatimer.cuda_region("allreduce"):
                print("BLOCKED", flush=True)
                if mode == "hang":
                    import ctypes
                    ctypes.CDLL(sys.argv[5]).spin()  # never returns to Python
                time.sleep(600)
if mode.endswith("raise"):
    with cudatimer.cuda_region("train_step"):
        raise RuntimeError("boom in step")
"""


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDATIMER_LIVE")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env.update(extra)
    return env


def _writer(
    tmp: Path, path: Path, steps: int, step_s: float, mode: str, *args: str, **env: str
) -> subprocess.Popen[str]:
    script = tmp / "writer.py"
    script.write_text(WRITER)
    return subprocess.Popen(
        [sys.executable, str(script), str(path), str(steps), str(step_s), mode, *args],
        env=_env(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _cli(*args: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "cudatimer", *args],
        env=_env(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )


def _until(
    what: Callable[[], Any],
    timeout: float = 45.0,
    every: float = 0.1,
    show: Callable[[], str] | None = None,
) -> Any:
    """Poll ``what()`` until it returns something true (generous: a loaded 2-core machine);
    ``show()`` says what was there when it gave up."""
    deadline = time.monotonic() + timeout
    while True:
        got = what()
        if got:
            return got
        if time.monotonic() > deadline:
            seen = f"; last seen:\n{show()}" if show is not None else ""
            raise AssertionError(f"gave up after {timeout} s waiting for {what}{seen}")
        time.sleep(every)


def _read(path: Path) -> _livefile.LiveFile | None:
    try:
        return _livefile.read_live(path)
    except (OSError, ValueError):
        return None


def _frame(pattern: str | Path, **options: Any) -> str:
    files, problems = _watch.load(str(pattern))
    model = _watch.build(files, str(pattern), problems=tuple(problems))
    return _watch.frame(model, _watch.Options(**options), width=100)


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.communicate(timeout=30)


def _run(timer: cudatimer.Timer, steps: int, slow: float = 1.0) -> None:
    """A loop of ``steps`` steps: forward ~1 ms, backward ~2 ms (x ``slow``)."""
    for _ in range(steps):
        with timer.region("train_step"):
            with timer.region("forward"):
                time.sleep(0.001)
            with timer.region("backward"):
                time.sleep(0.002 * slow)
        timer.step()


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The final live file of a run of 80 steps that ended normally (closed)."""
    path = tmp_path_factory.mktemp("finished") / "live.json"
    timer = cudatimer.Timer(name="finished-run")
    with cudatimer.live(path, timer=timer, every_s=0.1):
        _run(timer, 80)
    return path


# -- the full-screen view, in a real terminal ----------------------------------------------------
needs_tmux = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")


class Tmux:
    """One detached tmux session running ``command`` in a pane of a given size."""

    def __init__(self, name: str, command: str, width: int, height: int, **env: str) -> None:
        self.name = name
        exports = " ".join(f"{k}={v!r}" for k, v in _env(**env).items() if k in _KEEP or k in env)
        subprocess.run(
            [
                "tmux",
                "new-session",
                "-d",
                "-s",
                name,
                "-x",
                str(width),
                "-y",
                str(height),
                f"env {exports} {command}; echo WATCH-EXIT-$?; sleep 120",
            ],
            check=True,
        )

    def screen(self, history: bool = False) -> str:
        args = ["tmux", "capture-pane", "-p", "-t", self.name]
        if history:
            args += ["-S", "-200"]
        return subprocess.run(args, capture_output=True, text=True, check=True).stdout

    def keys(self, *keys: str) -> None:
        subprocess.run(["tmux", "send-keys", "-t", self.name, *keys], check=True)

    def resize(self, width: int, height: int) -> None:
        subprocess.run(
            ["tmux", "resize-window", "-t", self.name, "-x", str(width), "-y", str(height)],
            check=True,
        )

    def close(self) -> None:
        subprocess.run(["tmux", "kill-session", "-t", self.name], capture_output=True)


_KEEP = {"PATH", "HOME", "PYTHONPATH", "TMPDIR"}


@pytest.fixture
def tmux() -> Iterator[Callable[..., Tmux]]:
    made: list[Tmux] = []

    def make(command: str, width: int = 80, height: int = 24, **env: str) -> Tmux:
        t = Tmux(f"cudatimer-test-{os.getpid()}-{len(made)}", command, width, height, **env)
        made.append(t)
        return t

    yield make
    for t in made:
        t.close()


def _watch_cmd(path: Path) -> str:
    return f"{sys.executable} -m cudatimer watch {path}"


@needs_tmux
def test_watch_in_a_terminal_shows_updates_reacts_to_keys_and_ends_with_the_run(
    tmp_path: Path, tmux: Callable[..., Tmux]
) -> None:
    """In an 80x24 tmux pane, watch shows the regions, updates, obeys keys, resizes, ends."""
    path = tmp_path / "live.json"
    term = tmux(_watch_cmd(path), TERM="xterm-256color", LANG="C.UTF-8")
    # Before the writer starts, the view says so plainly.
    _until(lambda: "not started" in term.screen(), show=term.screen)
    stop = tmp_path / "stop"
    writer = _writer(tmp_path, path, 100_000, 0.04, "run", WRITER_STOP=str(stop))
    try:

        def drawn() -> str:  # a whole frame (a capture may catch one being drawn)
            s = term.screen()
            lines = s.splitlines()
            whole = len(lines) >= 6 and "steps/s" in lines[1] and lines[3].startswith("region")
            return s if whole and lines[4].startswith("train_step") else ""

        first = _until(drawn, show=term.screen)
        assert "forward" in first and "backward" in first and "ms/step" in first
        assert all(len(line) <= 80 for line in first.splitlines())
        term.resize(110, 30)
        wide = lambda: any(len(line) > 85 for line in term.screen().splitlines())  # noqa: E731
        _until(wide, show=term.screen)
        term.resize(80, 24)
        _until(
            lambda: all(len(line) <= 80 for line in term.screen().splitlines()), show=term.screen
        )

        def step_of(screen: str) -> int:
            rest = screen.partition("running: step ")[2]
            number = rest.split(",")[0]
            return int(number) if number.isdigit() else -1

        seen = step_of(first)
        assert seen >= 0
        _until(lambda: step_of(term.screen()) > seen, show=term.screen)
        term.keys("t")
        _until(
            lambda: (
                "view: flat" in (s := term.screen())
                and any(line.startswith("train_step/backward") for line in s.splitlines())
            ),
            show=term.screen,
        )
        term.keys("s")
        _until(lambda: "sort: change" in term.screen(), show=term.screen)
        term.keys("t", "-")
        _until(
            lambda: (
                "depth: 1" in (s := term.screen())
                and "train_step" in s
                and "forward" not in s.split("region", 1)[-1]
            ),
            show=term.screen,
        )
        term.keys("+")
        _until(
            lambda: "depth: all" in term.screen() and "forward" in term.screen(), show=term.screen
        )
        # The run ends: so does the view, leaving its last frame in the scrollback.
        stop.touch()
        writer.communicate(timeout=120)
        assert writer.returncode == 0
        done = _until(
            lambda: "WATCH-EXIT-0" in (s := term.screen(history=True)) and s, show=term.screen
        )
        assert "finished at" in done and "train_step" in done
    finally:
        _stop(writer)


@needs_tmux
def test_a_writer_stuck_in_a_region_is_named_and_once_killed_reads_as_gone(
    tmp_path: Path, tmux: Callable[..., Tmux]
) -> None:
    """A writer blocking in a region: the view (LANG=C, NO_COLOR) names it; after SIGKILL the
    file stays readable and reads as gone."""
    path = tmp_path / "live.json"
    writer = _writer(tmp_path, path, 5, 0.02, "block")
    try:
        assert writer.stdout is not None
        _until(lambda: "BLOCKED" in writer.stdout.readline())
        # 7 lines: two of the three rows fit, so the arrows scroll.
        term = tmux(_watch_cmd(path), height=7, LANG="C", NO_COLOR="1", TERM="xterm")
        text = _until(
            lambda: "quiet:" in (s := term.screen()) and "rows 1-2 of 3" in s and s,
            60,
            show=term.screen,
        )
        status = next(line for line in text.splitlines() if line.startswith("quiet:"))
        assert "no step for" in status and "open: train_step/backward/allreduce (" in status
        assert text.isascii()
        term.keys("Down")
        _until(lambda: "rows 2-3 of 3" in term.screen(), show=term.screen)
        term.keys("Up")
        _until(lambda: "rows 1-2 of 3" in term.screen(), show=term.screen)
        term.keys("q")
        _until(lambda: "WATCH-EXIT-0" in term.screen(), show=term.screen)
        once = _frame(path)
        assert "quiet: no step for" in once and "train_step/backward/allreduce" in once
        writer.kill()
        writer.communicate(timeout=30)
        left = _livefile.read_live(path)  # the last file is whole
        assert left.state == "running" and left.open[0].regions[-1][0].endswith("allreduce")
        model = _watch.build([left], str(path), now_unix_s=time.time() + 60)
        assert model.status == "gone"
        assert f"writer (pid {left.pid}) is not running" in model.message
        assert "train_step/backward/allreduce" in model.message
    finally:
        _stop(writer)


# -- one frame, and the final state as a run ------------------------------------------------------
def test_once_prints_one_frame_and_show_reads_the_final_state(
    finished_run: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``watch --once`` prints one plain frame of the finished run (ASCII under LANG=C);
    ``show`` reads the final state as a run."""
    for name in ("LC_ALL", "LC_CTYPE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LANG", "C")
    assert main(["watch", str(finished_run), "--once", "--width", "80"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith("cudatimer watch  ") and "live.json (rank 0, pid" in lines[0]
    assert lines[1].startswith("finished at") and "last 50 steps (30-79)" in lines[2]
    assert "change against steps 5-54" in lines[2]
    assert [line.split()[0] for line in lines[4:]] == ["train_step", "backward", "forward"]
    assert out.isascii() and all(len(line) <= 80 for line in lines)
    assert main(["show", str(finished_run)]) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[2:]}
    assert rows["train_step"][2] == "80" and rows["train_step/backward"][2] == "80"


def test_frame_fits_its_size_and_follows_view_sort_and_depth(finished_run: Path) -> None:
    """A frame never passes its width or height; tree, flat, sorts and depth order the rows."""
    files, _ = _watch.load(str(finished_run))
    model = _watch.build(files, str(finished_run))
    small = _watch.frame(model, width=40, height=8, keys=True)
    assert len(small.splitlines()) <= 8 and all(len(x) <= 40 for x in small.splitlines())
    assert small.splitlines()[-1].startswith("q quit")

    def names(**options: Any) -> list[str]:
        text = _watch.frame(model, _watch.Options(**options), width=100, ascii_only=True)
        return [line.split()[0] for line in text.splitlines()[4:]]

    assert names(view="flat") == ["train_step", "train_step/backward", "train_step/forward"]
    assert names(view="tree", depth=1) == ["train_step"]
    ms = {r.path: r.ms for r in model.rows}
    assert ms["train_step/backward"] > ms["train_step/forward"]  # 0.6 against 0.3 of a step
    share = {r.path: r.share for r in model.rows}
    assert share["train_step"] == pytest.approx(1.0)
    assert 0.5 < share["train_step/backward"] / (1 - share["train_step/forward"]) <= 1.0
    utf8 = _watch.frame(model, width=100)
    assert not utf8.isascii()  # the trend's bars
    assert _watch.ascii_terminal({"LANG": "C"}) and not _watch.ascii_terminal(
        {"LANG": "en_US.UTF-8"}
    )


def test_a_missing_file_says_not_started() -> None:
    """Before the run writes, the view says the run has not started, and where it waits."""
    text = _frame("/nonexistent/live/rank{rank}.json")
    assert "not started: no file at /nonexistent/live/rank{rank}.json yet" in text


def test_half_written_or_foreign_files_give_one_line_and_no_traceback(
    tmp_path: Path, finished_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Cut, foreign, saved-run, empty, newer and malformed files: one line each, exit 1."""
    whole = finished_run.read_text()
    saved = tmp_path / "run.json"
    timer = cudatimer.Timer(name="saved-run")
    with timer.region("x"):
        pass
    timer.step()
    timer.save(saved)
    files = {
        "cut": (whole[: len(whole) // 2], "not a complete cudatimer live file"),
        "foreign": (json.dumps({"hello": [1, 2]}), "not a cudatimer live file (no 'format'"),
        "empty": ("", "empty, not a cudatimer live file"),
        "newer": (whole.replace('"schema":1', '"schema":2', 1), "live file schema 2 is not"),
        "bad": (whole.replace('"pid":', '"pid":-', 1), "pid must be an integer >= 0"),
        "run": (saved.read_text(), "a saved run (format 'cudatimer.summary'), not a live file"),
    }
    for name, (text, what) in files.items():
        path = tmp_path / f"{name}.json"
        path.write_text(text)
        assert main(["watch", str(path), "--once"]) == 1, name
        out, err = capsys.readouterr()
        assert out == "" and err.count("\n") == 1 and "Traceback" not in err, err
        assert err.startswith(f"cudatimer watch: error: {path}: ") and what in err, err
    running = tmp_path / "running.json"
    state = whole.replace('"state":"finished"', '"state":"running"', 1)
    running.write_text(state.replace('"summary":{', '"unread":{', 1))
    with pytest.raises(ValueError, match=r"state 'running'.*only once the run has ended"):
        cudatimer.load(running)


# -- ranks, the environment variable, the end of a process ----------------------------------------
def test_several_ranks_show_the_slowest_rank_per_region(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two ranks' files in a folder (a glob, a {rank} path): one table, the slower rank
    named per region."""
    folder = tmp_path / "live"
    pattern = folder / "rank{rank}.json"
    monkeypatch.setenv("WORLD_SIZE", "2")
    for rank, slow in ((0, 1.0), (1, 4.0)):
        monkeypatch.setenv("RANK", str(rank))
        timer = cudatimer.Timer(name=f"rank-{rank}")
        with cudatimer.live(pattern, timer=timer) as pub:
            _run(timer, 20, slow)
        assert pub.path == str(folder / f"rank{rank}.json")
    for given in (str(folder), str(folder / "rank*.json"), str(pattern)):
        files, problems = _watch.load(given)
        assert [f.rank for f in files] == [0, 1] and problems == [], given
    model = _watch.build(_watch.load(str(folder))[0], str(folder))
    rows = {r.path: r for r in model.rows}
    assert rows["train_step/backward"].slowest is not None
    assert rows["train_step/backward"].slowest[0] == 1
    text = _watch.frame(model, width=100)
    assert "(2 ranks)" in text.splitlines()[0] and "slowest" in text.splitlines()[3]
    backward = next(line for line in text.splitlines() if line.lstrip().startswith("backward"))
    assert " r1 " in backward
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ValueError, match=r"has no \{rank\} and this job has 2 ranks"):
        cudatimer.live(tmp_path / "one.json", timer=cudatimer.Timer(name="no-rank"))


def test_cudatimer_live_publishes_the_default_timer_with_no_code_change(tmp_path: Path) -> None:
    """CUDATIMER_LIVE=path publishes a plain loop (here ended by an uncaught exception: the
    final state says so); a process that enters no region writes nothing."""
    path = tmp_path / "env.json"
    quiet = tmp_path / "cli.json"
    writer = _writer(tmp_path, path, 30, 0.01, "env-raise", CUDATIMER_LIVE=str(path))
    cli = _cli("--version", CUDATIMER_LIVE=str(quiet))
    _, err = writer.communicate(timeout=120)
    assert writer.returncode == 1 and "RuntimeError: boom in step" in err  # the hook chains
    cli.communicate(timeout=120)
    data = _livefile.read_live(path)
    assert (data.state, data.reason) == ("failed", "RuntimeError: boom in step")
    assert data.finished == 30 and data.has_summary
    assert data.open == ()  # the exception closed its regions on its way out
    assert {name for name, _ in data.regions} == {
        "train_step",
        "train_step/forward",
        "train_step/backward",
    }
    assert not quiet.exists()


def _spin_library(tmp: Path) -> Path | None:
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        return None
    source = tmp / "spin.c"
    source.write_text("#include <unistd.h>\nvoid spin(void) { for (;;) pause(); }\n")
    lib = tmp / "libspin.so"
    subprocess.run([gcc, "-shared", "-fPIC", "-o", str(lib), str(source)], check=True)
    return lib


def test_final_states_at_sigterm_chain_the_handler_that_was_there(tmp_path: Path) -> None:
    """SIGTERM with the main thread stuck in C code (the default action still ends the
    process) and with a handler of its own (called after): a final state naming the signal
    and the open region."""
    lib = _spin_library(tmp_path)
    if lib is None:
        pytest.skip("no C compiler to build a call that never returns to Python")
    paths = {m: tmp_path / f"{m}.json" for m in ("hang", "handler")}
    procs = {
        "hang": _writer(tmp_path, paths["hang"], 3, 0.01, "hang", str(lib)),
        "handler": _writer(tmp_path, paths["handler"], 3, 0.01, "handler"),
    }
    try:
        for proc in procs.values():
            stdout = proc.stdout
            assert stdout is not None
            _until(lambda: "BLOCKED" in stdout.readline())  # noqa: B023
            proc.send_signal(signal.SIGTERM)
        out = {m: p.communicate(timeout=60) for m, p in procs.items()}
        assert procs["hang"].returncode == -signal.SIGTERM, out["hang"]  # as without us
        assert procs["handler"].returncode == 3 and "OWN-HANDLER" in out["handler"][0]
        for mode, path in paths.items():
            data = _livefile.read_live(path)
            assert (data.state, data.reason) == ("terminated", "SIGTERM"), mode
            assert data.open[0].regions[-1][0] == "train_step/backward/allreduce"
            assert data.finished == 3 and data.has_summary
        text = _frame(paths["hang"])
        assert "was terminated at" in text and "SIGTERM" in text and "allreduce" in text
    finally:
        for p in procs.values():
            _stop(p)


# -- in this process -------------------------------------------------------------------------------
def _c_core() -> ModuleType | None:
    try:
        return importlib.import_module("cudatimer.core._speedups")
    except ImportError:
        return None


CORES = [pytest.param(_core_py, id="python")] + (
    [pytest.param(_c_core(), id="c")] if _c_core() is not None else []
)


@pytest.mark.parametrize("core", CORES)
def test_open_frames_read_every_threads_stack_without_changing_it(core: ModuleType) -> None:
    """``Store.open_frames`` lists each thread's open frames, outermost first, on both cores."""
    names: dict[tuple[int, str], int] = {}
    store = core.Store(4, 16, 64, lambda parent, name: names.setdefault((parent, name), len(names)))
    ready, done = threading.Event(), threading.Event()

    def other() -> None:
        stack = store.stack()
        stack.push(core.Frame("a", 0, 0, core.HOST, t0_ns=11))
        stack.push(core.Frame("b", 1, 0, core.NVTX))
        ready.set()
        done.wait(30)
        stack.clear()

    thread = threading.Thread(target=other)
    thread.start()
    ready.wait(30)
    mine = store.stack()
    mine.push(core.Frame("c", 2, 0, core.HOST, t0_ns=33))
    try:
        got = store.open_frames()
        again = store.open_frames()
        by_thread: dict[int, list[tuple[int, int, int]]] = {}
        for _, tid, slot, kind, t0 in got:
            by_thread.setdefault(tid, []).append((slot, kind, t0))
        assert by_thread == {
            thread.ident: [(0, core.HOST, 11), (1, core.NVTX, 0)],
            threading.get_ident(): [(2, core.HOST, 33)],
        }
        assert again == got and len(mine) == 1
    finally:
        mine.clear()
        done.set()
        thread.join(30)
    assert store.open_frames() == []


def test_open_regions_name_paths_and_ages_of_other_threads() -> None:
    """``Recorder.open_regions`` gives another thread's open paths and start times, and
    reading them leaves the results as they were."""
    timer = cudatimer.Timer(name="open-regions")
    inside, leave = threading.Event(), threading.Event()

    def work() -> None:
        with timer.region("outer"), timer.region("inner"):
            inside.set()
            leave.wait(30)

    thread = threading.Thread(target=work, name="worker")
    thread.start()
    inside.wait(30)
    before = timer.summary(timeout_s=1)
    try:
        held = dict(timer.recorder.open_regions())
        paths = [p for p, _ in held[thread.ident]]
        assert paths == ["outer", "outer/inner"]
        t0s = [t0 for _, t0 in held[thread.ident]]
        assert 0 < t0s[0] <= t0s[1]
    finally:
        leave.set()
        thread.join(30)
    assert before.regions == () and timer.summary(timeout_s=1)["outer/inner"].calls == 1


def test_sink_publishes_the_steps_a_feed_gives_it(tmp_path: Path) -> None:
    """``sinks.live`` under a StepFeed: the file holds the last steps and the reference."""
    timer = cudatimer.Timer(name="live-sink")
    sink = cudatimer.sinks.live(tmp_path / "rank{rank}.json", timer=timer, steps=10, warmup=2)
    feed = cudatimer.StepFeed(sink, timer=timer)
    assert not (tmp_path / "rank0.json").exists()  # written from the first step on
    for _ in range(25):
        with timer.region("train_step"), timer.region("forward"):
            pass
        feed.step()
    sink.close()
    data = _livefile.read_live(tmp_path / "rank0.json")
    assert data.state == "finished" and [s.step for s in data.steps] == list(range(15, 25))
    assert data.reference is not None
    assert (data.reference.first, data.reference.stop, data.reference.steps) == (2, 12, 10)
    with pytest.raises(TypeError, match="StepTimes"):
        sink("not a step")  # type: ignore[arg-type]


@pytest.fixture
def gpu() -> Iterator[FakeGPU]:
    with install() as fake:
        yield fake


def test_steps_are_published_once_the_gpu_finished_them_never_waiting(
    tmp_path: Path, gpu: FakeGPU
) -> None:
    """With the GPU behind, the file shows the marked steps as not finished; once the GPU
    catches up, the next write has them, with GPU times, and the loop never waited."""
    timer = cudatimer.Timer(name="live-gpu")
    pub = cudatimer.live(tmp_path / "gpu.json", timer=timer, every_s=0.05)
    try:
        gpu.hold()  # nothing recorded from now on finishes
        for _ in range(4):
            with timer.region("train_step"):
                gpu.run(5.0)
            timer.step()
        held = _until(lambda: (f := _read(tmp_path / "gpu.json")) and f.step == 4 and f, 30)
        time.sleep(0.3)
        held = _read(tmp_path / "gpu.json")
        assert held is not None and held.finished == 0 and held.steps == ()
        gpu.release()
        done = _until(lambda: (f := _read(tmp_path / "gpu.json")) and f.finished == 4 and f, 30)
        assert [s.step for s in done.steps] == [0, 1, 2, 3]
        assert done.regions == (("train_step", "cuda:0"),)
        assert done.steps[-1].rows[0][2] == pytest.approx(5.0)
    finally:
        pub.close()


def test_the_thread_keeps_to_its_duty_when_its_checks_are_costly(
    tmp_path: Path, gpu: FakeGPU
) -> None:
    """Event queries that burn 2 ms of CPU each: the publisher still stays under 1% of wall."""
    timer = cudatimer.Timer(name="live-duty")
    gpu.hold()  # the steps never finish: every check queries the oldest step's event
    for _ in range(3):
        with timer.region("train_step"):
            gpu.run(1.0)
        timer.step()
    gpu.query_cpu_s = 0.002
    start = time.monotonic()
    pub = cudatimer.live(tmp_path / "duty.json", timer=timer, every_s=0.04)
    try:
        time.sleep(2.0)
    finally:
        pub.close()
        gpu.query_cpu_s = 0.0
        gpu.release()
    # Budgeting only the writes, the checks (one every 10 ms, 2 ms each) took ~17% here.
    assert 0 < pub.busy_s / (time.monotonic() - start) < 0.01


def test_the_file_stays_bounded_keeping_the_newest_steps(tmp_path: Path) -> None:
    """2,500 regions a step: the file stays under 1 MiB, the newest steps kept."""
    timer = cudatimer.Timer(name="live-big", keep_steps=60)
    pub = cudatimer.live(tmp_path / "big.json", timer=timer, every_s=60)
    regions = [timer.region(f"layer{i}") for i in range(2500)]
    for _ in range(60):
        for r in regions:
            with r:
                pass
        timer.step()
    pub.close()
    size = os.path.getsize(tmp_path / "big.json")
    data = _livefile.read_live(tmp_path / "big.json")
    assert size <= _livefile.MAX_BYTES
    assert data.steps and data.steps[-1].step == 59 and len(data.steps) < 50
    assert len(data.steps[-1].rows) == 2500


def test_bad_arguments_name_what_was_expected(tmp_path: Path) -> None:
    """live() refuses bad paths, timers, intervals and counts with the argument's name."""
    with pytest.raises(TypeError, match="path must be a file path"):
        cudatimer.live(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"timer must be a cudatimer\.Timer"):
        cudatimer.live(tmp_path / "a.json", timer="default")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"every_s must be a finite number >= 0\.01"):
        cudatimer.live(tmp_path / "a.json", every_s=0)
    with pytest.raises(ValueError, match="steps must be >= 1"):
        cudatimer.live(tmp_path / "a.json", steps=0)
    with pytest.raises(ValueError, match="keep_steps=0"):
        cudatimer.live(tmp_path / "a.json", timer=cudatimer.Timer(name="nokeep", keep_steps=0))
    first = cudatimer.live(tmp_path / "same.json", timer=cudatimer.Timer(name="one"))
    try:
        with pytest.raises(ValueError, match="already published"):
            cudatimer.live(tmp_path / "same.json", timer=cudatimer.Timer(name="two"))
    finally:
        first.close()
    (tmp_path / "dir.json").mkdir()
    with pytest.raises(OSError):  # a folder where the file should go: raised here, not later
        cudatimer.live(tmp_path / "dir.json", timer=cudatimer.Timer(name="three"))


def _row(path: str, ms: float, change: float | None, calls: float) -> _watch.Row:
    return _watch.Row(path, "cuda:0", ms, None, change, calls, (1.0, 2.0, 3.0), None)


def test_sorts_cycle_orders_and_tree_keeps_children_under_parents() -> None:
    """time, change, calls and name order siblings; the tree keeps each under its parent."""
    rows = (
        _row("step", 10.0, 0.0, 1),
        _row("step/b", 2.0, 0.5, 4),
        _row("step/a", 7.0, -0.1, 2),
        _row("step/a/x", 1.0, None, 9),
        _row("eval", 3.0, 0.2, 1),
    )
    model = _watch.Model("m.json", "running", "running", (), rows, (0, 9), 10, {"cuda:0": 13.0})

    def order(view: str, sort: str) -> list[str]:
        text = _watch.frame(model, _watch.Options(view=view, sort=sort), ascii_only=True)
        return [line.split()[0] for line in text.splitlines()[4:]]

    assert order("tree", "time") == ["step", "a", "x", "b", "eval"]
    assert order("tree", "name") == ["eval", "step", "a", "x", "b"]
    assert order("flat", "time") == ["step", "step/a", "eval", "step/b", "step/a/x"]
    assert order("flat", "change") == ["step/b", "eval", "step", "step/a", "step/a/x"]
    assert order("flat", "calls") == ["step/a/x", "step/b", "step/a", "eval", "step"]
    assert _watch.SORTS == ("time", "change", "calls", "name")
