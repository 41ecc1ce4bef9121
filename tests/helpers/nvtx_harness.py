"""Run Python code under a logging NVTX injection library and read back every NVTX call.

NVTX looks for a tool (``NVTX_INJECTION64_PATH``) only at the first NVTX call of a process, so
each run is a fresh subprocess. The tool is ``tests/helpers/nvtx_inject/inject.c``, built once
per test session with gcc against NVIDIA's NVTX headers (from the ``nvidia-nvtx`` wheel or a CUDA
toolkit; never vendored here).
"""

from __future__ import annotations

import atexit
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
INJECT_SOURCE = Path(__file__).resolve().parent / "nvtx_inject" / "inject.c"

# Variables that would change what the child emits; a test passes them explicitly when it means to.
_SCRUBBED_ENV = ("NVTX_DISABLE", "CUDATIMER_DISABLE", "CUDATIMER_NVTX", "NVTX_INJECTION32_PATH")


class HarnessUnavailable(RuntimeError):
    """gcc or the NVTX headers are missing: the caller should skip, not fail."""


@dataclass(frozen=True)
class Record:
    """One NVTX call as the injection library logged it."""

    seq: int
    pid: int
    tid: int
    kind: str  # init, domain_create, name_category, push, pop, start, end, mark
    domain: str  # "" for the default domain and for the domain-less (CORE) API
    msg: str
    category: int
    color: int | None  # 0xAARRGGBB when the call gave an ARGB color
    payload_type: str  # none, int64, uint64, double, int32, uint32, float, other
    payload: int | float | str | None
    id: int  # range id for start/end; NVTX API version for init

    @property
    def rgb(self) -> int | None:
        """The color without its alpha byte."""
        return None if self.color is None else self.color & 0xFFFFFF


def find_nvtx_include() -> Path | None:
    """Directory holding ``nvtx3/nvToolsExt.h``, or None."""
    candidates: list[Path] = []
    try:
        import nvidia  # the nvidia-nvtx wheel; a namespace package

        for root in nvidia.__path__:
            # cu13 first, then older layouts (cu12, or the headers at the top of the package).
            for pattern in ("cu*/include", "nvtx/include", "*/include"):
                candidates += sorted(Path(p) for p in glob.glob(os.path.join(root, pattern)))[::-1]
    except ImportError:
        pass
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            candidates.append(Path(os.environ[var]) / "include")
    candidates += [Path(p) for p in sorted(glob.glob("/usr/local/cuda*/include"))]
    for inc in candidates:
        if (inc / "nvtx3" / "nvToolsExt.h").is_file():
            return inc
    return None


_build_dir: Path | None = None
_built: Path | None = None


def compile_shared(source: Path, name: str) -> Path:
    """Compile one C file against the NVTX headers into a shared library (per-session tmp dir).

    Raises HarnessUnavailable when gcc or the headers cannot be found.
    """
    global _build_dir
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        raise HarnessUnavailable("no C compiler (gcc/cc) on PATH to build the NVTX test tools")
    include = find_nvtx_include()
    if include is None:
        raise HarnessUnavailable(
            "NVTX v3 headers not found: install the nvidia-nvtx wheel (test extra) or a CUDA "
            "toolkit"
        )
    if _build_dir is None:
        _build_dir = Path(tempfile.mkdtemp(prefix="cudatimer-nvtx-"))
        atexit.register(shutil.rmtree, _build_dir, True)
    lib = _build_dir / name
    # -ldl: the NVTX headers dlopen the tool; glibc < 2.34 keeps dlopen in libdl.
    cmd = [
        cc,
        "-shared",
        "-fPIC",
        "-O2",
        "-std=c11",
        "-Wall",
        "-Wextra",
        f"-I{include}",
        "-o",
        str(lib),
        str(source),
        "-lpthread",
        "-ldl",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        # The compiler and headers exist, so a failure here is a bug to see, not a skip.
        raise RuntimeError(f"building {source.name} failed:\n{' '.join(cmd)}\n{proc.stderr}")
    return lib


def injection_library() -> Path:
    """The logging NVTX tool, built once per process (i.e. per test session)."""
    global _built
    if _built is None:
        _built = compile_shared(INJECT_SOURCE, "libnvtx_log.so")
    return _built


def parse_log(text: str) -> list[Record]:
    """Parse the JSON lines the injection library wrote."""
    return [Record(**json.loads(line)) for line in text.splitlines() if line.strip()]


def run_with_injection(
    code: str,
    *,
    env: Mapping[str, str] | None = None,
    argv: Iterable[str] | None = None,
    timeout: float = 120.0,
    check_balance: bool = True,
) -> list[Record]:
    """Run ``code`` in a fresh ``python -c`` under the tool; return every NVTX call it made.

    ``code`` is dedented. The child runs in the repository root with it on ``sys.path`` and with
    the NVTX/cudatimer switches cleared unless ``env`` sets them. By default the records must be
    balanced (see assert_balanced): every test then checks push/pop pairing for free.
    """
    lib = injection_library()
    with tempfile.TemporaryDirectory(prefix="cudatimer-nvtx-log-") as tmp:
        log = Path(tmp) / "nvtx.jsonl"
        child_env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED_ENV}
        child_env["PYTHONPATH"] = os.pathsep.join(
            [str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
        )
        child_env["NVTX_INJECTION64_PATH"] = str(lib)
        child_env["CUDATIMER_NVTX_LOG"] = str(log)
        child_env.update(env or {})
        cmd = [sys.executable, "-c", textwrap.dedent(code), *(argv or [])]
        proc = subprocess.run(
            cmd, cwd=REPO_ROOT, env=child_env, capture_output=True, text=True, timeout=timeout
        )
        if proc.returncode != 0:
            raise AssertionError(
                f"child exited {proc.returncode}\n--- stdout\n{proc.stdout}"
                f"\n--- stderr\n{proc.stderr}"
            )
        records = parse_log(log.read_text(encoding="utf-8")) if log.exists() else []
    if check_balance:
        assert_balanced(records)
    return records


def assert_balanced(records: Iterable[Record]) -> None:
    """Fail unless, per process, thread and domain, every push has its pop (and no stray pop),
    and every started range id ends exactly once. Checked over the whole log, i.e. at exit."""
    stacks: dict[tuple[int, int, str], list[str]] = defaultdict(list)
    open_ranges: dict[tuple[int, int], str] = {}
    problems: list[str] = []
    for r in records:
        key = (r.pid, r.tid, r.domain)
        if r.kind == "push":
            stacks[key].append(r.msg)
        elif r.kind == "pop":
            if not stacks[key]:
                problems.append(f"pop without push: pid {r.pid} tid {r.tid} domain {r.domain!r}")
            else:
                stacks[key].pop()
        elif r.kind == "start":
            open_ranges[(r.pid, r.id)] = r.msg
        elif r.kind == "end" and open_ranges.pop((r.pid, r.id), None) is None:
            problems.append(f"end of unknown range id {r.id} (pid {r.pid})")
    for (pid, tid, domain), stack in stacks.items():
        if stack:
            problems.append(f"never popped: pid {pid} tid {tid} domain {domain!r}: {stack}")
    problems += [f"never ended: pid {pid} range {msg!r}" for (pid, _), msg in open_ranges.items()]
    assert not problems, "unbalanced NVTX ranges:\n" + "\n".join(problems)


def trace(
    records: Iterable[Record], domain: str | None = "cudatimer", tid: int | None = None
) -> list[str]:
    """Range events as short strings, in call order: ``+name``/``-name`` for push/pop (the pop
    named after the range it closes, per thread), ``[name``/``]name`` for start/end, ``!name``
    for marks. ``domain=None`` keeps all domains; ``tid`` keeps one thread."""
    stacks: dict[tuple[int, int, str], list[str]] = defaultdict(list)
    started: dict[tuple[int, int], str] = {}
    out: list[str] = []
    for r in records:
        if tid is not None and r.tid != tid:
            continue
        if domain is not None and r.domain != domain:
            continue
        key = (r.pid, r.tid, r.domain)
        if r.kind == "push":
            stacks[key].append(r.msg)
            out.append("+" + r.msg)
        elif r.kind == "pop":
            out.append("-" + (stacks[key].pop() if stacks[key] else "?"))
        elif r.kind == "start":
            started[(r.pid, r.id)] = r.msg
            out.append("[" + r.msg)
        elif r.kind == "end":
            out.append("]" + started.pop((r.pid, r.id), "?"))
        elif r.kind == "mark":
            out.append("!" + r.msg)
    return out


def ranges(records: Iterable[Record], domain: str | None = "cudatimer") -> list[Record]:
    """The records that open a range or mark an instant (push, start, mark) in ``domain``."""
    return [
        r
        for r in records
        if r.kind in ("push", "start", "mark") and (domain is None or r.domain == domain)
    ]
