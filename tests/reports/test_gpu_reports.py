"""Reports, windows and exports on a CUDA device: the trace's GPU timeline, the
host-bound flag, per-step GPU series, and saved runs through the CLI."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from cudatimer import Timer, load
from cudatimer._cli import main
from cudatimer.render._report import render
from tests.hard_cases.test_gpu_core import SYNC_CALLS, count_runtime_calls, sleep_ms

pytestmark = pytest.mark.gpu


def _warm() -> None:
    torch.cuda.init()
    sleep_ms(1)  # load the sleep kernel's module before anything is timed
    torch.cuda.synchronize()


def _spans(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in doc["traceEvents"] if e["ph"] == "X"]


def _track_names(doc: dict[str, Any]) -> dict[tuple[int, int], str]:
    return {
        (e["pid"], e["tid"]): e["args"]["name"]
        for e in doc["traceEvents"]
        if e["ph"] == "M" and e["name"] == "thread_name"
    }


def test_trace_places_gpu_spans_on_the_gpu_timeline() -> None:
    """GPU spans nest on their stream's track, last as long as the events say, and start no
    earlier than the host entered the region (the GPU cannot run work not yet issued)."""
    _warm()
    t = Timer(name="trace-gpu")
    stream = torch.cuda.Stream()  # first seen while idle: its reference event aligns well
    with torch.cuda.stream(stream):
        for _ in range(3):
            with t.region("outer"):
                sleep_ms(5)
                with t.region("inner"):
                    sleep_ms(10)
                sleep_ms(5)
    buf = io.StringIO()
    t.export_trace(buf)
    doc = json.loads(buf.getvalue())
    summary = t.summary()
    gpu = [e for e in _spans(doc) if e["cat"] == "gpu"]
    host = [e for e in _spans(doc) if e["cat"] == "host"]
    assert len(gpu) == len(host) == 6
    assert {_track_names(doc)[(e["pid"], e["tid"])] for e in gpu} == {f"stream {stream.stream_id}"}
    outers = sorted((e for e in gpu if e["name"] == "outer"), key=lambda e: e["ts"])
    inners = sorted((e for e in gpu if e["name"] == "inner"), key=lambda e: e["ts"])
    for outer, inner in zip(outers, inners, strict=True):
        assert (
            outer["ts"] <= inner["ts"] and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"]
        )
        assert inner["dur"] == pytest.approx(10_000, rel=0.15)
    # Trace durations agree with the summary's event timing to a microsecond per call.
    assert sum(e["dur"] for e in outers) / 1e3 == pytest.approx(
        summary["outer"].gpu_total_ms, abs=3 * 0.002
    )
    host_inners = sorted((e for e in host if e["name"] == "inner"), key=lambda e: e["ts"])
    for g, h in zip(inners, host_inners, strict=True):
        assert g["ts"] >= h["ts"] - 50.0  # alignment error of the reference: tens of us at most


def test_two_streams_two_tracks() -> None:
    """Regions on two streams of one device go to two tracks of the "GPU 0" process."""
    _warm()
    t = Timer(name="two-streams")
    side = torch.cuda.Stream()
    with t.region("main"):
        sleep_ms(1)
    with torch.cuda.stream(side), t.region("side"):
        sleep_ms(1)
    doc = json.loads(_export(t))
    names = _track_names(doc)
    process = {
        e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"
    }
    gpu_tracks = {names[(e["pid"], e["tid"])] for e in _spans(doc) if e["cat"] == "gpu"}
    assert len(gpu_tracks) == 2 and f"stream {side.stream_id}" in gpu_tracks
    assert {process[e["pid"]] for e in _spans(doc) if e["cat"] == "gpu"} == {"GPU 0"}


def _export(t: Timer) -> str:
    buf = io.StringIO()
    t.export_trace(buf)
    return buf.getvalue()


def test_export_never_synchronizes() -> None:
    """Placing samples for the trace (at harvest), exporting it and saving a run: no sync calls."""
    _warm()
    t = Timer(name="no-sync-export")
    torch.cuda.synchronize()

    def body() -> None:
        for _ in range(5):
            with t.region("r"):
                sleep_ms(1)
        s = t.summary(trace=True)  # waits by polling, then places each start event
        assert [x.gpu_start_ms is not None for x in s.trace] == [True] * 5
        _export(t)
        t.to_csv(io.StringIO(), what="trace")

    base = count_runtime_calls(lambda: None)  # what the profiler itself calls
    counts = count_runtime_calls(body)
    for name in SYNC_CALLS:
        assert counts.get(name, 0) == base.get(name, 0), (name, counts, base)


def test_host_bound_flag_on_gpu() -> None:
    """Host work behind a GPU backlog is flagged host-bound; a GPU-heavy region is not."""
    _warm()
    t = Timer(name="bound")
    sleep_ms(200)  # a backlog: both events of the next region wait behind it
    with t.region("host_heavy"):
        time.sleep(0.03)
        torch.ones(1, device="cuda").add_(1)
    with t.region("gpu_heavy"):
        sleep_ms(50)
    s = t.summary()
    text = render(s, fmt="tsv", columns=["region", "bound", "cpu_gpu"])
    rows = {
        line.split("\t")[0].strip(): line.split("\t")[1].strip() for line in text.splitlines()[1:3]
    }
    assert rows == {"host_heavy": "host", "gpu_heavy": ""}, text


def test_step_series_and_windows_on_gpu() -> None:
    """Per-step GPU times follow the work of each step; warmup= drops the first steps."""
    _warm()
    t = Timer(name="steps-gpu")
    for i in range(5):
        with t.region("it"):
            sleep_ms(2 * (i + 1))
        t.step()
    series = t.step_series()
    assert [s.step for s in series] == [0, 1, 2, 3, 4]
    # torch.cuda._sleep spins for clock cycles, so its duration follows the SM clock: compare
    # each step with the first, not with nominal milliseconds.
    unit = series[0].gpu_ms
    for s in series:
        assert s.clock == "cuda:0" and s.gpu_ms == pytest.approx(unit * (s.step + 1), rel=0.15)
    window = t.summary(warmup=2)["it"]
    assert window.calls == 3 and window.gpu_total_ms == pytest.approx(unit * (3 + 4 + 5), rel=0.15)
    assert window.gpu_min_ms == pytest.approx(unit * 3, rel=0.15)


def test_saved_gpu_run_through_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A saved GPU run loads back equal and the CLI shows, traces and compares it."""
    _warm()
    t = Timer(name="cli-gpu")
    for _ in range(3):
        with t.region("step"):
            with t.region("fwd"):
                sleep_ms(2)
            with t.region("bwd"):
                sleep_ms(4)
        t.step()
    path = tmp_path / "run.json"
    saved = t.save(path)
    assert load(path) == saved and saved.trace and saved.trace[0].gpu_ms is not None
    assert main(["show", str(path), "--view", "tree"]) == 0
    assert "+- bwd" in capsys.readouterr().out
    assert main(["trace", str(path), "-o", str(tmp_path / "t.json")]) == 0
    doc = json.loads((tmp_path / "t.json").read_text())
    assert len([e for e in _spans(doc) if e["cat"] == "gpu"]) == 9
    assert main(["compare", str(path), str(path)]) == 0
    assert "same" in capsys.readouterr().out
