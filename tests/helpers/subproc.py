"""Run a snippet in a fresh interpreter: for what is decided once at import (environment)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def run_python(
    code: str, env_extra: dict[str, str], *, cwd: Path | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``python -c code`` (dedented) from the repository root (or ``cwd``, with this checkout
    first on the import path), with ``env_extra`` set on top of this process's environment;
    output captured as text, ``timeout`` seconds at most."""
    env = {**os.environ, **env_extra}
    if cwd is not None:  # elsewhere the checkout is not on sys.path by itself
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        cwd=REPO_ROOT if cwd is None else cwd,
    )
