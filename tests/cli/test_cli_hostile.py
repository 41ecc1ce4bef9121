"""The cudatimer command on hostile input: every command on a malformed file exits 1 with a
message naming it (no traceback), and a closed standard output ends it quietly with 141."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cudatimer._cli import EXIT_BROKEN_PIPE, main
from cudatimer.render._export import dumps, save
from cudatimer.render._report import render
from tests.helpers.report_fixtures import gpu_run, gpu_run_after
from tests.reports.test_hostile_files import DEEP, deep_run

ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=str(ROOT))


def _calls(literal: str) -> str:
    return re.sub(r'"calls": \d+', '"calls": ' + literal, dumps(gpu_run()), count=1)


def _with(*keys: object, value: object) -> str:
    doc = json.loads(dumps(gpu_run()))
    node = doc
    for key in keys[:-1]:
        node = node[key]
    node[keys[-1]] = value
    return json.dumps(doc)


HOSTILE = {
    "infinity-calls": _calls("Infinity"),
    "1e400-calls": _calls("1e400"),
    "negative-calls": _calls("-3"),
    "5000-digits": _calls("9" * 5000),
    "bucket-100000": _with("regions", 0, "gpu", "buckets", 0, 0, value=100000),
    "nan-total": _with("regions", 0, "cpu", "total", value=math.nan),
    "nested-5000": '{"format": "cudatimer.summary", "meta": ' + "[" * 5000 + "]" * 5000 + "}",
}


def test_hostile_fixtures_are_what_they_say() -> None:
    """Each hostile file above differs from the saved run (the substitutions matched)."""
    assert all(text != dumps(gpu_run()) for text in HOSTILE.values())


@pytest.mark.parametrize("name", list(HOSTILE))
@pytest.mark.parametrize("command", ["show", "trace", "plot", "csv", "html", "compare"])
def test_hostile_file_exits_1_with_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, name: str
) -> None:
    """A hostile file gives 'cudatimer CMD: error: FILE: ...' and exit 1, never a traceback."""
    bad = tmp_path / "hostile.json"
    bad.write_text(HOSTILE[name])
    good = tmp_path / "good.json"
    save(gpu_run(), good)
    argv = [command, str(good), str(bad)] if command == "compare" else [command, str(bad)]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"cudatimer {command}: error: {bad}: "), err
    assert not list(tmp_path.glob("hostile.*.*")) and not list(tmp_path.glob("*.tmp*"))


def _closed_pipe_run(argv: list[str]) -> subprocess.CompletedProcess[bytes]:
    read_end, write_end = os.pipe()
    os.close(read_end)  # nobody will read: the first write to it fails with EPIPE
    try:
        return subprocess.run(
            [sys.executable, "-m", "cudatimer", *argv],
            stdout=write_end,
            stderr=subprocess.PIPE,
            env=ENV,
            timeout=120,
            check=False,
        )
    finally:
        os.close(write_end)


@pytest.fixture
def runs(tmp_path: Path) -> dict[str, str]:
    paths = {"gpu": tmp_path / "gpu.json", "after": tmp_path / "after.json"}
    save(gpu_run(), paths["gpu"])
    save(gpu_run_after(), paths["after"])
    return {k: str(v) for k, v in paths.items()}


@pytest.mark.parametrize(
    "argv",
    [
        ["show", "{gpu}"],
        ["compare", "{gpu}", "{after}"],
        ["csv", "{gpu}", "--what", "trace"],
        ["trace", "{gpu}"],
    ],
    ids=["show", "compare", "csv", "trace"],
)
def test_closed_stdout_exits_quietly(runs: dict[str, str], argv: list[str]) -> None:
    """With standard output closed, a command exits 141 and writes nothing to stderr."""
    done = _closed_pipe_run([a.format(**runs) for a in argv])
    assert done.returncode == EXIT_BROKEN_PIPE
    assert done.stderr == b""


def test_show_into_head(tmp_path: Path) -> None:
    """`cudatimer show RUN | head -1`: head gets the first line, cudatimer exits 141 quietly."""
    path = tmp_path / "deep.json"
    save(deep_run(2000), path)  # a report of over 200 kilobytes: more than a pipe holds
    proc = subprocess.Popen(
        [sys.executable, "-m", "cudatimer", "show", str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=ENV,
    )
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == EXIT_BROKEN_PIPE
    assert first.split()[:2] == [b"region", b"clock"] and err == b""


class _ClosedPipe:
    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self) -> None:
        raise BrokenPipeError(32, "Broken pipe")


def test_broken_pipe_in_process(
    runs: dict[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """main() returns EXIT_BROKEN_PIPE, and prints no error, when stdout's pipe is closed."""
    for argv in (["show", runs["gpu"]], ["csv", runs["gpu"]]):
        monkeypatch.setattr(sys, "stdout", _ClosedPipe())
        assert main(argv) == EXIT_BROKEN_PIPE
        monkeypatch.undo()
        assert capsys.readouterr().err == ""


def test_help_mentions_exit_statuses(capsys: pytest.CaptureFixture[str]) -> None:
    """--help documents the exit statuses, 141 for a closed standard output included."""
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "141 standard output closed early" in " ".join(capsys.readouterr().out.split())


def test_deep_recursion_run_flat_and_csv(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A saved run of regions nested 2000 deep shows (flat view) and exports as CSV."""
    path = tmp_path / "deep.json"
    save(deep_run(), path)
    assert main(["show", str(path)]) == 0
    assert capsys.readouterr().out == render(deep_run()) + "\n"
    assert main(["csv", str(path)]) == 0
    assert len(capsys.readouterr().out.splitlines()) == DEEP + 1


def test_deep_recursion_run_tree_view(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`show --view tree` renders a run of regions nested 2000 deep."""
    path = tmp_path / "deep.json"
    save(deep_run(), path)
    assert main(["show", str(path), "--view", "tree"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == DEEP + 2 and lines[2].split()[0] == "f"
    # The indent stops at 24 levels; deeper rows say their level.
    assert lines[-1].split()[24:28] == ["+-", "[level", f"{DEEP - 1}]", "f"]
