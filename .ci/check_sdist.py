"""Build the sdist, unpack it, and collect its tests: every test module of the checkout must be
in it and collect there (an sdist that ships tests without their helpers fails here).

    python3 .ci/check_sdist.py

Builds with ``python -m build --sdist`` where the ``build`` package is installed, else with
setuptools' own backend in this process (no network, no isolated environment: CI machines
without a package index still check the sdist). Exits non-zero on any failure.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def build(out: Path) -> Path:
    if importlib.util.find_spec("build") is not None:
        cmd = [sys.executable, "-m", "build", "--sdist", "--outdir", str(out), str(ROOT)]
        subprocess.run(cmd, check=True)
    else:
        code = "from setuptools import build_meta as b; b.build_sdist(sys.argv[1])"
        subprocess.run(
            [sys.executable, "-c", f"import sys; {code}", str(out)], cwd=ROOT, check=True
        )
    (archive,) = out.glob("*.tar.gz")
    return archive


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        archive = build(Path(tmp) / "dist")
        with tarfile.open(archive) as tar:
            # filter= (refuse links and absolute paths) exists from 3.10.12 and 3.11.4 on.
            safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            tar.extractall(Path(tmp) / "src", **safe)
        (tree,) = (Path(tmp) / "src").iterdir()
        shipped = {p.relative_to(tree).as_posix() for p in (tree / "tests").rglob("test_*.py")}
        expected = {p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").rglob("test_*.py")}
        if shipped != expected:
            print(f"sdist check: test modules missing: {sorted(expected - shipped)}")
            return 1
        for needed in ("LICENSE", "CHANGELOG.md", "README.md", "docs/README.md"):
            if not (tree / needed).is_file():
                print(f"sdist check: {needed} is not in the sdist")
                return 1
        # The unpacked tree's own cudatimer (its Python core: nothing is built here).
        env = {**os.environ, "PYTHONPATH": str(tree)}
        collect = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
        done = subprocess.run(collect, cwd=tree, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            print(done.stdout[-4000:], done.stderr[-4000:], sep="\n")
            print(
                f"sdist check: collecting the sdist's tests failed (pytest exit {done.returncode})"
            )
            return 1
        print(
            f"sdist check: {archive.name} ships {len(shipped)} test modules; "
            f"{done.stdout.strip().splitlines()[-1]}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
