"""Check an installed wheel against the checkout: every module of ``cudatimer/`` (and the pytest
plugin) imports from the wheel, with the C core built and the stubs shipped.

    python3 .ci/check_wheel.py VENV_PYTHON

Run from the checkout; the wheel's Python is started in an empty folder, so the checkout's own
``cudatimer/`` cannot be imported instead. Exits non-zero on any failure.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import importlib, json, pathlib, sys
import cudatimer
base = pathlib.Path(cudatimer.__file__).parent
out = {"file": cudatimer.__file__, "compiled": cudatimer.compiled(), "missing": []}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except Exception as exc:
        out["missing"].append(f"{name}: {exc}")
out["stubs"] = sorted(str(p.relative_to(base)) for p in base.rglob("*.pyi"))
print(json.dumps(out))
"""


def modules() -> list[str]:
    """The checkout's modules, as dotted names (the C core by its name)."""
    names = []
    for root in ("cudatimer", "cudatimer_pytest"):
        for path in sorted((ROOT / root).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            if parts[-1] != "__main__":
                names.append(".".join(parts))
    return [*names, "cudatimer.core._speedups"]


def main() -> int:
    import json

    python = sys.argv[1]
    expected = modules()
    with tempfile.TemporaryDirectory() as empty:
        done = subprocess.run(
            [python, "-c", PROBE, *expected], cwd=empty, capture_output=True, text=True
        )
    if done.returncode != 0:
        print(done.stdout, done.stderr, sep="\n")
        return 1
    got = json.loads(done.stdout)
    stubs = {
        p.relative_to(ROOT / "cudatimer").as_posix() for p in (ROOT / "cudatimer").rglob("*.pyi")
    }
    problems = list(got["missing"])
    if str(ROOT) in got["file"]:
        problems.append(f"the checkout was imported, not the wheel: {got['file']}")
    if not got["compiled"]:
        problems.append("the wheel has no C core")
    if set(got["stubs"]) != stubs:
        problems.append(f"stubs in the wheel {got['stubs']} != the checkout's {sorted(stubs)}")
    for line in problems:
        print(f"wheel check: {line}")
    if not problems:
        print(f"wheel check: {len(expected)} modules import from {got['file']}")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
