"""Ctrl-C never leaves cudatimer stuck: the interrupt stress (tests/helpers/interrupt_stress.py)
in a fresh process with a timeout, on both cores, a hang failing the test."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers.subproc import REPO_ROOT


@pytest.mark.parametrize("pure", ["0", "1"])
@pytest.mark.parametrize("seed", [1, 2])
def test_interrupt_stress(pure: str, seed: int) -> None:
    """1,000 interrupted enter/exit trials, 300 in reports, decorated and instrumented calls."""
    env = {**os.environ, "CUDATIMER_PURE_PYTHON": pure}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    proc = subprocess.run(
        [sys.executable, "-m", "tests.helpers.interrupt_stress", str(seed)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    stats = json.loads(proc.stdout.strip().splitlines()[-1])
    assert stats["trials"] + stats["exit_window"] == 1700
    if pure == "0":
        assert stats["exit_window"] == 0
