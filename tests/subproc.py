"""Run a snippet in a fresh interpreter: for what is decided once at import (environment)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def run_python(code: str, env_extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``python -c code`` (dedented) from the repository root, with ``env_extra`` set on top of
    this process's environment; output captured as text, 120 s at most."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env={**os.environ, **env_extra},
        timeout=120,
        cwd=REPO_ROOT,
    )
