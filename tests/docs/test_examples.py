"""The examples run as documented and write only where the user says."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEMO = str(ROOT / "examples" / "report_demo.py")


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _run(argv: list[str], cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    """``python argv...`` in ``cwd`` with this checkout importable; it must exit 0."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stderr
    return done


def test_report_demo_writes_into_the_current_directory(tmp_path: Path) -> None:
    """report_demo.py writes its files into the current directory, never into the checkout."""
    picture = ROOT / "examples" / "report.png"
    before = _digest(picture)
    _run([DEMO, "--steps", "7"], tmp_path)
    written = {p.name for p in tmp_path.iterdir()}
    assert {"run.json", "run_small.json", "trace.json"} <= written
    assert _digest(picture) == before
    compare = _run(["-m", "cudatimer", "compare", "run.json", "run_small.json"], tmp_path, 120)
    assert "train_step/forward" in compare.stdout


def test_report_demo_takes_out(tmp_path: Path) -> None:
    """--out names the folder (created if missing)."""
    out = tmp_path / "new" / "demo"
    _run([DEMO, "--steps", "7", "--out", str(out)], tmp_path)
    assert (out / "run.json").is_file() and (out / "run_small.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new"]
