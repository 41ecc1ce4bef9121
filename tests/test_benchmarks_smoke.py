"""The benchmark suite's smoke mode runs end to end and writes well-formed outputs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "benchmarks" / "run.py"
WORKLOADS = ("launch", "compute", "gpt2")  # resnet50 needs torchvision: may be skipped
TIMERS = (
    "none",
    "wrap-only",
    "floor",
    "cudatimer",
    "cudatimer-timed",
    "cudatimer-nvtx",
    "cudatimer-off",
    "nvtx-annotate",
    "torch-profiler",
    "record-function",
    "sync-timer",
    "event-pair",
    "lightning-simple",
    "torchtnt",
    "proton",
)
CUDA_ONLY = ("floor", "sync-timer", "event-pair", "proton")
MAIN_COLUMNS = [
    "workload",
    "timer",
    "ms/iter (median)",
    "ms/iter [min, max]",
    "slowdown vs none",
    "added us/region (median [IQR])",
    "vs floor",
    "rounds",
    "status",
]


def _table(md: str, first_header: str) -> tuple[list[str], list[list[str]]]:
    """The Markdown table whose header row starts with ``first_header``."""
    lines = md.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(f"| {first_header} "))
    cells = [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in lines[start:]]
    header, body = cells[0], []
    for ln, row in zip(lines[start + 2 :], cells[2:], strict=False):
        if not ln.startswith("|"):
            break
        body.append(row)
    return header, body


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("bench")
    proc = subprocess.run(
        [sys.executable, str(RUN), "--smoke", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
    )
    return {"proc": proc, "out": out}


def test_smoke_run_succeeds(smoke: dict[str, Any]) -> None:
    """`run.py --smoke` exits 0 and prints the table."""
    proc = smoke["proc"]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "| workload " in proc.stdout


def test_outputs_exist(smoke: dict[str, Any]) -> None:
    """results.md and results.json are written (the chart too where matplotlib exists)."""
    out: Path = smoke["out"]
    assert (out / "results.md").stat().st_size > 0
    assert (out / "results.json").stat().st_size > 0
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return
    assert (out / "overhead.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_main_table_has_expected_columns_and_rows(smoke: dict[str, Any]) -> None:
    """The overhead table has its columns and one row per (workload, timer)."""
    md = (smoke["out"] / "results.md").read_text()
    header, rows = _table(md, "workload")
    assert header == MAIN_COLUMNS
    assert all(len(r) == len(MAIN_COLUMNS) for r in rows)
    pairs = {(r[0], r[1]) for r in rows}
    for w in WORKLOADS:
        for t in TIMERS:
            assert (w, t) in pairs, f"missing row {w} / {t}"


def test_baseline_and_cudatimer_rows_are_measured(smoke: dict[str, Any]) -> None:
    """The baseline and cudatimer rows carry numbers, not a skip."""
    md = (smoke["out"] / "results.md").read_text()
    _, rows = _table(md, "workload")
    for r in rows:
        if r[1] in ("none", "cudatimer", "cudatimer-off"):
            assert r[-1] == "ok", r
            assert float(r[2]) > 0
            assert r[7] == "2"


def test_cuda_only_timers_are_skipped_with_a_reason(smoke: dict[str, Any]) -> None:
    """Without CUDA, the floor, synchronizing and event timers are skipped and say why."""
    if torch.cuda.is_available():
        pytest.skip("CUDA is available: these timers run")
    md = (smoke["out"] / "results.md").read_text()
    _, rows = _table(md, "workload")
    for r in rows:
        if r[1] in CUDA_ONLY:
            assert r[-1].startswith("skipped: needs CUDA"), r


def test_per_timer_table_lists_every_timer(smoke: dict[str, Any]) -> None:
    """The per-timer table (syncs, memory, report time) has a row per timer."""
    md = (smoke["out"] / "results.md").read_text()
    header, rows = _table(md, "timer")
    assert header[0] == "timer"
    assert "RSS growth (bytes/region)" in header
    assert {r[0] for r in rows} == set(TIMERS)


def test_json_holds_raw_rounds(smoke: dict[str, Any]) -> None:
    """results.json holds every round's per-iteration times and the table rows."""
    data = json.loads((smoke["out"] / "results.json").read_text())
    assert data["schema"] == 1
    assert data["table_columns"] == MAIN_COLUMNS
    for w in WORKLOADS:
        run = data["workloads"][w]
        assert run["regions_per_iter"] > 0
        assert len(run["rounds"]) == 2
        for row in run["rounds"]:
            assert row["none"] > 0
            assert all(isinstance(v, float) for v in row.values())
        assert set(run["timers"]) == set(TIMERS)
        assert run["stats"]["none"]["rounds"] == 2
    assert set(data["checks"]) >= {"syncs", "memory", "report", "accuracy"}


def test_unknown_timer_is_rejected() -> None:
    """An unknown --timers name is a usage error, not a silent skip."""
    proc = subprocess.run(
        [sys.executable, str(RUN), "--smoke", "--timers", "nope", "--out", "unused"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 2
    assert "unknown timer" in proc.stderr


def test_kernel_spans_matches_launches_to_kernels_by_correlation() -> None:
    """The accuracy check's trace parser spans first kernel start to last kernel end."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from _measure import kernel_spans
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    trace = {
        "traceEvents": [
            {"cat": "user_annotation", "name": "acc0", "ts": 100.0, "dur": 50.0},
            {
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "ts": 110.0,
                "args": {"correlation": 1},
            },
            {
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "ts": 140.0,
                "args": {"correlation": 2},
            },
            {
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "ts": 200.0,
                "args": {"correlation": 3},
            },
            {
                "cat": "kernel",
                "name": "gemm",
                "ts": 1000.0,
                "dur": 400.0,
                "args": {"correlation": 1},
            },
            {
                "cat": "kernel",
                "name": "gemm",
                "ts": 1400.0,
                "dur": 600.0,
                "args": {"correlation": 2},
            },
            {
                "cat": "kernel",
                "name": "gemm",
                "ts": 2000.0,
                "dur": 900.0,
                "args": {"correlation": 3},
            },
        ]
    }
    spans = kernel_spans(trace, ["acc0"])
    assert spans["acc0"] == pytest.approx(1.0)  # 1000 -> 2000 us, the third kernel is outside
    assert spans["acc0#kernels"] == 2
