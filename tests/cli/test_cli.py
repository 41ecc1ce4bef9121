"""The cudatimer command: show, compare, trace, plot and csv on saved runs; clear errors."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cudatimer._cli import main
from cudatimer.render._export import save
from cudatimer.render._report import render, render_compare
from tests.helpers.report_fixtures import gpu_run, gpu_run_after, host_run
from tests.helpers.subproc import run_python

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def runs(tmp_path: Path) -> dict[str, Path]:
    paths = {"gpu": tmp_path / "gpu.json", "after": tmp_path / "after.json"}
    save(gpu_run(), paths["gpu"])
    save(gpu_run_after(), paths["after"])
    paths["host"] = tmp_path / "host.json"
    save(host_run(), paths["host"])
    return paths


def test_show_prints_the_report(runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """show prints the same report as render(), with its view, format and filters."""
    assert main(["show", str(runs["gpu"])]) == 0
    assert capsys.readouterr().out == render(gpu_run()) + "\n"
    args = ["show", str(runs["gpu"]), "--view", "tree", "--fmt", "github", "--match", "forward"]
    assert main(args) == 0
    expected = render(gpu_run(), view="tree", fmt="github", match="forward")
    assert capsys.readouterr().out == expected + "\n"
    assert main(["show", str(runs["gpu"]), "--columns", "region, calls", "--sort", "calls"]) == 0
    assert capsys.readouterr().out.splitlines()[0].split() == ["region", "calls"]


def test_compare_prints_verdicts(runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """compare prints per-region ratios with a faster/slower column."""
    assert main(["compare", str(runs["gpu"]), str(runs["after"])]) == 0
    out = capsys.readouterr().out
    assert out == render_compare(gpu_run(), gpu_run_after()) + "\n"
    assert "2.00x faster" in out and "1.50x slower" in out
    assert main(["compare", str(runs["gpu"]), str(runs["after"]), "--stat", "total"]) == 0
    assert "base total ms" in capsys.readouterr().out


def test_trace_writes_chrome_json(runs: dict[str, Path], tmp_path: Path) -> None:
    """trace writes a trace document next to the run (or to -o) with every call in it."""
    assert main(["trace", str(runs["gpu"])]) == 0
    default = tmp_path / "gpu.trace.json"
    doc = json.loads(default.read_text())
    assert len([e for e in doc["traceEvents"] if e["ph"] == "X"]) == 6 + 4  # host + GPU spans
    out = tmp_path / "t.json"
    assert main(["trace", str(runs["gpu"]), "-o", str(out)]) == 0
    assert json.loads(out.read_text()) == doc


def test_plot_writes_png(runs: dict[str, Path], tmp_path: Path) -> None:
    """plot writes a PNG (default name: the run's, with .png)."""
    pytest.importorskip("matplotlib")
    assert main(["plot", str(runs["gpu"]), "--top", "3"]) == 0
    assert (tmp_path / "gpu.png").read_bytes()[:4] == b"\x89PNG"


def test_csv_to_stdout_and_file(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """csv prints a table to stdout, or writes it with -o."""
    assert main(["csv", str(runs["gpu"]), "--what", "steps"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "step,name,clock,calls,gpu_ms,cpu_ms" and len(lines) == 6
    assert main(["csv", str(runs["gpu"]), "-o", str(tmp_path / "r.csv")]) == 0
    assert (tmp_path / "r.csv").read_text().startswith("name,clock,")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "No such file or directory"),
        ("{not json", "not JSON"),
        ('{"hello": 1}', "not a cudatimer summary"),
        ('{"format": "cudatimer.summary", "schema": 99}', "schema 99 is not supported"),
    ],
)
@pytest.mark.parametrize("command", ["show", "trace", "plot", "csv", "html"])
def test_bad_files_exit_1_with_message(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    command: str,
    content: str | None,
    message: str,
) -> None:
    """A missing or foreign file gives 'cudatimer CMD: error: ...' naming it, and exit 1."""
    path = tmp_path / "run.json"
    if content is not None:
        path.write_text(content)
    assert main([command, str(path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"cudatimer {command}: error:")
    assert message in err and str(path) in err


def test_compare_with_a_bad_file(runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """compare names the file it could not read."""
    assert main(["compare", str(runs["gpu"]), str(runs["gpu"]) + ".missing"]) == 1
    assert ".missing" in capsys.readouterr().err


def test_trace_of_run_without_samples(
    runs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """trace on a run saved without trace samples fails with a reason, exit 1."""
    assert main(["trace", str(runs["host"])]) == 1
    assert "nothing to trace" in capsys.readouterr().err


def test_bad_option_values_exit_2(
    runs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """Values argparse cannot check (format, columns, fractions) are a bad command line: 2."""
    cases = [
        (["show", str(runs["gpu"]), "--fmt", "nope"], "fmt must be a tabulate format"),
        (["show", str(runs["gpu"]), "--columns", "speed"], "columns must name some of"),
        (["show", str(runs["gpu"]), "--min-share", "2"], "min_share must be between 0 and 1"),
        (["compare", str(runs["gpu"]), str(runs["gpu"]), "--tolerance", "-1"], "tolerance"),
        (["plot", str(runs["gpu"]), "--top", "0"], "must be >= 1"),
    ]
    for argv, message in cases:
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 2, argv
        assert message in capsys.readouterr().err


def test_bad_option_values_print_the_commands_usage(
    runs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """A bad option value prints the usage of its command, not the top level's."""
    cases = [
        (["show", str(runs["gpu"]), "--fmt", "nope"], "show"),
        (["compare", str(runs["gpu"]), str(runs["gpu"]), "--tolerance", "-1"], "compare"),
        (["html", str(runs["gpu"]), "--top", "0"], "html"),
        (["plot", str(runs["gpu"]), "-o", "out.jpg"], "plot"),
    ]
    for argv, command in cases:
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 2, argv
        err = capsys.readouterr().err
        assert err.startswith(f"usage: cudatimer {command} "), err
        assert f"\ncudatimer {command}: error: " in err


def test_plot_output_names_its_format(runs: dict[str, Path], tmp_path: Path) -> None:
    """plot -o writes the format its suffix names; another suffix is a bad command line,
    refused before the run is read."""
    pytest.importorskip("matplotlib")
    heads = {"svg": b"<?xml", "pdf": b"%PDF-", "PNG": b"\x89PNG"}
    for suffix, head in heads.items():
        out = tmp_path / f"picture.{suffix}"
        assert main(["plot", str(runs["gpu"]), "-o", str(out)]) == 0
        assert out.read_bytes()[:5].startswith(head), suffix
    with pytest.raises(SystemExit) as info:
        main(["plot", str(tmp_path / "absent.json"), "-o", str(tmp_path / "picture.jpg")])
    assert info.value.code == 2
    assert not (tmp_path / "picture.jpg").exists()


def test_show_help_lists_only_options_it_takes(capsys: pytest.CaptureFixture[str]) -> None:
    """show --help does not offer --last/--steps/--warmup, which show refuses."""
    with pytest.raises(SystemExit):
        main(["show", "--help"])
    out = capsys.readouterr().out
    assert "--match" in out
    assert not {"--last", "--steps", "--warmup"} & set(out.replace("[", " ").split())


def test_option_values_are_checked_before_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bad option value exits 2 even when the file is missing: the command line is wrong."""
    with pytest.raises(SystemExit) as info:
        main(["show", str(tmp_path / "absent.json"), "--columns", "speed"])
    assert info.value.code == 2
    assert "absent.json" not in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--last", "--steps", "--warmup"])
def test_show_refuses_windows_with_the_reason(
    runs: dict[str, Path], capsys: pytest.CaptureFixture[str], flag: str
) -> None:
    """show --last/--steps/--warmup exits 2: a saved run holds the window it was saved with."""
    with pytest.raises(SystemExit) as info:
        main(["show", str(runs["gpu"]), flag, "5"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"{flag}: a saved run holds the window it was saved with" in err
    assert "save(path, warmup=5)" in err


def test_version_names_torch_and_the_core(capsys: pytest.CaptureFixture[str]) -> None:
    """--version prints cudatimer's version, torch's, and which recorder core runs."""
    import torch

    import cudatimer

    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    # The installed metadata may drop the local label that torch.__version__ carries ("+cu130").
    public = torch.__version__.split("+")[0]
    assert out.startswith(f"cudatimer {cudatimer.__version__} (torch {public}")
    assert ("core: C" if cudatimer.compiled() else "core: Python") in out


def test_version_says_why_the_python_core_runs() -> None:
    """Under CUDATIMER_PURE_PYTHON=1, --version says the Python core runs, and why."""
    done = run_python(
        "from cudatimer._cli import main; main(['--version'])",
        {"CUDATIMER_PURE_PYTHON": "1"},
    )
    assert "core: Python (CUDATIMER_PURE_PYTHON is set)" in done.stdout, done.stderr


def test_show_on_a_cross_rank_file_names_its_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """show on a merged cross-rank file says what it is and which command reads it (exit 1)."""
    from cudatimer import distributed

    for rank in (0, 1):
        save(host_run(), tmp_path / f"rank{rank}.json")
    merged = tmp_path / "run.json"
    files = [str(tmp_path / "rank0.json"), str(tmp_path / "rank1.json")]
    assert distributed.main(["merge", *files, "-o", str(merged)]) == 0
    capsys.readouterr()
    assert main(["show", str(merged)]) == 1
    err = capsys.readouterr().err
    assert "a cross-rank file" in err and str(merged) in err
    assert "python -m cudatimer.distributed show" in err


@pytest.mark.parametrize("command", ["trace", "show", "csv", "plot", "compare"])
def test_a_cross_rank_file_gets_command_line_advice(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    """Each command given a merged cross-rank file names the commands that read it, with
    the file's path, and no Python call."""
    from cudatimer import distributed

    for rank in (0, 1):
        save(host_run(), tmp_path / f"rank{rank}.json")
    merged = tmp_path / "merged.json"
    distributed.main(
        ["merge", *(str(tmp_path / f"rank{r}.json") for r in (0, 1)), "-o", str(merged)]
    )
    capsys.readouterr()
    argv = [command, str(merged)] + ([str(merged)] if command == "compare" else [])
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert f"`python -m cudatimer.distributed show {merged}`" in err
    assert f"`cudatimer html {merged}`" in err
    if command == "trace":
        assert "give `cudatimer trace` one of the per-rank files that were merged" in err
    else:
        fold = f"`python -m cudatimer.distributed merge {merged} --flat -o all.json`"
        assert fold in err and f"then `cudatimer {command} all.json`" in err
    assert "(" not in err.split("not one run:")[1]  # no save(...), merged(), load(...) advice


def test_documented_exit_codes_match(runs: dict[str, Path], tmp_path: Path) -> None:
    """The exit codes docs/cli.md lists are the ones the command returns."""
    doc = " ".join((ROOT / "docs" / "cli.md").read_text().split())
    assert "0 on success, 1 when a file cannot be read or written" in doc
    assert "2 for a bad command line" in doc
    assert main(["show", str(runs["gpu"])]) == 0
    assert main(["show", str(tmp_path / "absent.json")]) == 1
    with pytest.raises(SystemExit) as info:
        main(["show", str(runs["gpu"]), "--columns", "speed"])
    assert info.value.code == 2


def test_bad_command_line_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    """An unknown command or a missing argument is a usage error (exit 2)."""
    for argv in ([], ["frobnicate"], ["show"], ["show", "x.json", "--view", "graph"]):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 2
    assert "usage: cudatimer" in capsys.readouterr().err


def test_python_dash_m(runs: dict[str, Path]) -> None:
    """`python -m cudatimer` runs the same command, with the same exit codes."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    ok = subprocess.run(
        [sys.executable, "-m", "cudatimer", "show", str(runs["gpu"]), "--view", "tree"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout == render(gpu_run(), view="tree") + "\n"
    bad = subprocess.run(
        [sys.executable, "-m", "cudatimer", "show", str(runs["gpu"]) + ".nope"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert bad.returncode == 1 and "error" in bad.stderr


def test_console_script_declared() -> None:
    """pyproject's `cudatimer` console script points at a callable main()."""
    tomllib = pytest.importorskip("tomllib")
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, attr = scripts["cudatimer"].partition(":")
    assert getattr(importlib.import_module(module), attr) is main
