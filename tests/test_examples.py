"""The examples run as documented and write only where the user says."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_report_demo_writes_into_the_current_directory(tmp_path: Path) -> None:
    """report_demo.py writes its files into the current directory, never into the checkout."""
    picture = ROOT / "examples" / "report.png"
    before = _digest(picture)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "report_demo.py"), "--steps", "7"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    written = {p.name for p in tmp_path.iterdir()}
    assert {"run.json", "run_small.json", "trace.json"} <= written
    assert _digest(picture) == before
    compare = subprocess.run(
        [sys.executable, "-m", "cudatimer", "compare", "run.json", "run_small.json"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert compare.returncode == 0, compare.stderr
    assert "train_step/forward" in compare.stdout


def test_report_demo_takes_out(tmp_path: Path) -> None:
    """--out names the folder (created if missing)."""
    out = tmp_path / "new" / "demo"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "report_demo.py"),
            "--steps",
            "7",
            "--out",
            str(out),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert (out / "run.json").is_file() and (out / "run_small.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new"]
