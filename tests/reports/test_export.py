"""Exports: JSON round-trip, CSV, pandas DataFrames, the Chrome/Perfetto trace and the PNG."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import cudatimer
from cudatimer import Summary, Timer
from cudatimer.core import _core, _device
from cudatimer.records._hist import INV_LOG_GAMMA
from cudatimer.render._export import (
    REGION_COLUMNS,
    STEP_COLUMNS,
    TRACE_COLUMNS,
    dumps,
    save,
    to_csv,
)
from cudatimer.render._trace import to_chrome
from tests.helpers.report_fixtures import assert_snapshot, gpu_run, host_run


def _host_timer(name: str) -> Timer:
    t = Timer(name=name, clock="host")
    for _ in range(3):
        with t.region("step"):
            with t.region("fwd"):
                pass
            with t.region("bwd"):
                pass
        t.step()
    return t


# -- JSON --------------------------------------------------------------------------------------
def test_json_round_trip_is_exact(tmp_path: Path) -> None:
    """save then load gives an equal Summary: histograms, percentiles, steps and trace."""
    original = gpu_run()
    save(original, tmp_path / "run.json")
    loaded = cudatimer.load(tmp_path / "run.json")
    assert loaded == original
    r, o = loaded["train_step/forward/attention"], original["train_step/forward/attention"]
    assert (r.gpu_p50_ms, r.gpu_p99_ms, r.gpu) == (o.gpu_p50_ms, o.gpu_p99_ms, o.gpu)
    assert loaded.step_stats == original.step_stats and loaded.trace == original.trace


def test_json_round_trip_of_a_live_timer(tmp_path: Path) -> None:
    """Timer.save writes what summary(step_stats=True, trace=True) returns, and load reads it."""
    t = _host_timer("live-json")
    path = tmp_path / "live.json"
    saved = t.save(path)
    assert saved.step_stats and saved.trace
    assert cudatimer.load(path) == saved == t.summary(step_stats=True, trace=True)


def test_module_save_takes_a_window(tmp_path: Path) -> None:
    """cudatimer.save(path, last=N) saves that window (its label survives the round trip)."""
    for _ in range(3):
        with cudatimer.cuda_region("w", clock="host"):
            pass
        cudatimer.step()
    cudatimer.save(tmp_path / "w.json", last=2)
    loaded = cudatimer.load(tmp_path / "w.json")
    assert loaded["w"].calls == 2
    assert dict(loaded.meta)["window"] == "steps 1-2"
    assert {s.step for s in loaded.step_stats} == {1, 2}


def test_json_layout_one_row_per_line() -> None:
    """Step and trace rows take one line each (a long run stays compact and diffable)."""
    text = dumps(gpu_run())
    data = json.loads(text)
    assert data["format"] == "cudatimer.summary" and data["schema"] == cudatimer.SCHEMA_VERSION
    assert data["step_stats"]["columns"] == list(STEP_COLUMNS)
    assert data["trace"]["columns"] == list(TRACE_COLUMNS)
    row_lines = [line for line in text.splitlines() if line.startswith("  [")]
    assert len(row_lines) == len(gpu_run().step_stats) + len(gpu_run().trace)


def test_old_files_without_steps_or_trace_load(tmp_path: Path) -> None:
    """A file without the step_stats and trace sections loads with both empty."""
    data = json.loads(dumps(gpu_run()))
    del data["step_stats"], data["trace"]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(data))
    loaded = cudatimer.load(path)
    assert loaded.step_stats == () and loaded.trace == ()
    assert loaded.regions == gpu_run().regions


@pytest.mark.parametrize(
    ("change", "text"),
    [
        (lambda d: d.update(schema=99), "schema 99 is not supported"),
        (lambda d: d["trace"].update(columns=["name"]), "trace lacks column"),
        (lambda d: d["step_stats"]["rows"].append([1, 2]), "step_stats row"),
        (lambda d: d.update(trace=[1, 2]), "malformed cudatimer summary"),
    ],
)
def test_bad_json_names_the_file(tmp_path: Path, change: Any, text: str) -> None:
    """A file from a newer schema or with broken sections fails with the file's name."""
    data = json.loads(dumps(gpu_run()))
    change(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=text) as info:
        cudatimer.load(path)
    assert str(path) in str(info.value)


# -- CSV -----------------------------------------------------------------------------------------
def test_csv_snapshots() -> None:
    """Regions, steps and trace samples of a fixed run as CSV, exactly as reviewed."""
    for what in ("regions", "steps", "trace"):
        buf = io.StringIO()
        to_csv(gpu_run(), buf, what=what)
        assert_snapshot(f"export_{what}.csv", buf.getvalue())


def test_csv_values_round_trip(tmp_path: Path) -> None:
    """CSV floats read back to the record's values exactly; empty cells where none applies."""
    path = tmp_path / "regions.csv"
    to_csv(gpu_run(), path)
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == REGION_COLUMNS
    for row, r in zip(rows, gpu_run().regions, strict=True):
        assert row["name"] == r.name
        assert float(row["cpu_total_ms"]) == r.cpu_total_ms
        assert (row["gpu_p90_ms"] == "") == (r.gpu_p90_ms is None)
        if r.gpu_p90_ms is not None:
            assert float(row["gpu_p90_ms"]) == r.gpu_p90_ms


def test_module_to_csv_of_default_timer() -> None:
    """cudatimer.to_csv writes the default Timer's regions, or its steps with what="steps"."""
    for _ in range(2):
        with cudatimer.cuda_region("csv-region", clock="host"):
            pass
        cudatimer.step()
    buf = io.StringIO()
    cudatimer.to_csv(buf)
    assert buf.getvalue().splitlines()[1].startswith("csv-region,host,0,2,")
    steps = io.StringIO()
    cudatimer.to_csv(steps, what="steps", last=1)
    assert steps.getvalue().splitlines()[1:] == [
        line for line in steps.getvalue().splitlines()[1:] if line.startswith("1,csv-region,")
    ]
    with pytest.raises(ValueError, match="what must be one of"):
        cudatimer.to_csv(io.StringIO(), what="rows")


# -- DataFrame -----------------------------------------------------------------------------------
def test_dataframe_of_regions_steps_and_trace() -> None:
    """to_dataframe gives one row per record, columns as in CSV, NaN where nothing applies."""
    pd = pytest.importorskip("pandas")
    df = cudatimer.to_dataframe(summary=gpu_run())
    assert isinstance(df, pd.DataFrame)
    assert tuple(df.columns) == REGION_COLUMNS
    data = df.set_index("name")
    assert data.loc["train_step", "gpu_total_ms"] == 102.0
    assert np.isnan(data.loc["data", "gpu_total_ms"])
    steps = cudatimer.to_dataframe(summary=gpu_run(), what="steps")
    assert tuple(steps.columns) == STEP_COLUMNS and len(steps) == len(gpu_run().step_stats)
    trace = cudatimer.to_dataframe(summary=gpu_run(), what="trace")
    assert trace["gpu_ms"].notna().sum() == 4


def test_dataframe_of_a_live_timer() -> None:
    """Timer.to_dataframe reads the Timer (per-step rows with what="steps")."""
    pytest.importorskip("pandas")
    t = _host_timer("frame")
    df = t.to_dataframe(what="steps", warmup=1)
    assert sorted(set(df["step"])) == [1, 2]
    assert set(df["name"]) == {"step", "step/fwd", "step/bwd"}


def test_dataframe_without_pandas(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without pandas, to_dataframe raises ImportError naming pandas and how to get it."""
    monkeypatch.setitem(sys.modules, "pandas", None)  # makes `import pandas` fail
    with pytest.raises(ImportError, match=r"needs pandas.*pip install pandas"):
        cudatimer.to_dataframe(summary=gpu_run())


# -- plot ----------------------------------------------------------------------------------------
def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_plot_writes_png(tmp_path: Path) -> None:
    """plot writes a PNG; with two steps or more it adds the per-step panel (a taller image)."""
    pytest.importorskip("matplotlib")
    with_steps, without = tmp_path / "steps.png", tmp_path / "plain.png"
    cudatimer.plot(with_steps, summary=gpu_run())
    cudatimer.plot(without, summary=dataclasses.replace(gpu_run(), step_stats=()))
    (w1, h1), (w2, h2) = _png_size(with_steps.read_bytes()), _png_size(without.read_bytes())
    assert w1 == w2 and h1 > h2


@pytest.mark.parametrize(
    ("name", "head"),
    [("r.svg", b"<?xml"), ("r.pdf", b"%PDF-"), ("r.png", b"\x89PNG"), ("R.SVG", b"<?xml")],
)
def test_plot_writes_the_format_its_suffix_names(tmp_path: Path, name: str, head: bytes) -> None:
    """plot("r.svg") writes SVG, "r.pdf" PDF, "r.png" PNG (the suffix in any case)."""
    pytest.importorskip("matplotlib")
    cudatimer.plot(tmp_path / name, summary=gpu_run())
    assert (tmp_path / name).read_bytes().startswith(head)


@pytest.mark.parametrize("name", ["r.jpg", "report", "r.png.txt"])
def test_plot_refuses_a_suffix_it_cannot_write(tmp_path: Path, name: str) -> None:
    """Another suffix (or none) is refused naming the three it writes; nothing is written."""
    with pytest.raises(
        ValueError,
        match=r"its suffix names the picture's format, one of "
        r"\.png, \.svg, \.pdf; got ",
    ):
        cudatimer.plot(tmp_path / name, summary=gpu_run())
    assert list(tmp_path.iterdir()) == []


def test_plot_to_stream_and_checks() -> None:
    """plot accepts a binary stream; an empty summary or a bad top= is refused."""
    pytest.importorskip("matplotlib")
    buf = io.BytesIO()
    cudatimer.plot(buf, summary=host_run(), top=2)
    _png_size(buf.getvalue())
    with pytest.raises(ValueError, match="nothing to plot"):
        cudatimer.plot(io.BytesIO(), summary=Summary(regions=()))
    with pytest.raises(ValueError, match="top must be"):
        cudatimer.plot(io.BytesIO(), summary=host_run(), top=0)


def test_plot_without_matplotlib(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without matplotlib, plot raises ImportError naming it and how to get it."""
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError, match=r"needs matplotlib.*pip install matplotlib"):
        cudatimer.plot(io.BytesIO(), summary=gpu_run())


def test_plot_leaves_pyplot_alone(tmp_path: Path) -> None:
    """Plotting never imports pyplot (no backend switch, no window), checked in a fresh process."""
    pytest.importorskip("matplotlib")
    code = (
        "import sys, cudatimer\n"
        "with cudatimer.cuda_region('r', clock='host'):\n    pass\n"
        f"cudatimer.plot({str(tmp_path / 'p.png')!r})\n"
        "print('matplotlib.pyplot' in sys.modules, 'matplotlib.figure' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True"]


# -- trace ---------------------------------------------------------------------------------------
def _spans(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in doc["traceEvents"] if e["ph"] == "X"]


def _names(doc: dict[str, Any], kind: str) -> dict[tuple[int, int], str]:
    return {
        (e["pid"], e.get("tid", 0)): e["args"]["name"]
        for e in doc["traceEvents"]
        if e["ph"] == "M" and e["name"] == kind
    }


def _nested(spans: list[dict[str, Any]]) -> bool:
    """True when the spans of one track nest strictly (each starts and ends inside any open)."""
    open_ends: list[float] = []
    for s in sorted(spans, key=lambda e: (e["ts"], -e["dur"])):
        while open_ends and open_ends[-1] <= s["ts"]:
            open_ends.pop()
        end = s["ts"] + s["dur"]
        if open_ends and end > open_ends[-1] + 1e-9:
            return False
        open_ends.append(end)
    return True


def test_trace_snapshot() -> None:
    """The trace of a fixed GPU run, exactly as reviewed."""
    doc = to_chrome(gpu_run())
    assert_snapshot("trace_gpu.json", json.dumps(doc, indent=1, sort_keys=True))


def test_trace_structure_of_fixed_run() -> None:
    """GPU spans go to 'GPU 0' on a stream track, host spans to a track per thread, nested."""
    doc = to_chrome(gpu_run())
    processes = _names(doc, "process_name")
    assert sorted(processes.values()) == ["GPU 0", "host"]
    threads = _names(doc, "thread_name")
    assert sorted(threads.values()) == ["MainThread", "stream 7", "worker-1"]
    gpu_pid = next(pid for (pid, _), name in processes.items() if name == "GPU 0")
    gpu = [e for e in _spans(doc) if e["pid"] == gpu_pid]
    assert {e["name"] for e in gpu} == {"train_step", "forward", "attention", "backward"}
    step = next(e for e in gpu if e["name"] == "train_step")
    assert (step["ts"], step["dur"]) == (2500.0, 10000.0)  # from gpu_start_ms / gpu_ms
    assert step["args"]["region"] == "train_step" and step["cat"] == "gpu"
    tracks: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for e in _spans(doc):
        tracks.setdefault((e["pid"], e["tid"]), []).append(e)
    assert all(_nested(spans) for spans in tracks.values())
    host = [e for e in _spans(doc) if e["pid"] != gpu_pid]
    assert len(host) == len(gpu_run().trace)  # every call has a host span


def test_trace_of_host_regions_from_threads(tmp_path: Path) -> None:
    """A live host-clock trace: one track per thread, children inside parents, leaf names."""
    t = Timer(name="threads", clock="host")

    def work() -> None:
        with t.region("outer"):
            with t.region("inner"):
                pass
            with t.region("inner"):
                pass

    work()
    worker = threading.Thread(target=work, name="side")
    worker.start()
    worker.join()
    path = tmp_path / "trace.json"
    t.export_trace(path)
    doc = json.loads(path.read_text())
    threads = _names(doc, "thread_name")
    assert set(threads.values()) >= {"MainThread"}
    spans = _spans(doc)
    assert sorted(e["name"] for e in spans) == ["inner"] * 4 + ["outer"] * 2
    assert {e["args"]["region"] for e in spans} == {"outer", "outer/inner"}
    by_tid: dict[int, list[dict[str, Any]]] = {}
    for e in spans:
        by_tid.setdefault(e["tid"], []).append(e)
    assert len(by_tid) == 2  # main thread and "side" (which has ended: named by its id)
    for track in by_tid.values():
        outer = next(e for e in track if e["name"] == "outer")
        for inner in (e for e in track if e["name"] == "inner"):
            assert outer["ts"] <= inner["ts"]
            assert inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"]
    assert min(e["ts"] for e in spans) == 0.0


class _Clock:
    """The fake GPU's "now" in ms: what an event recorded next takes as its timestamp."""

    def __init__(self) -> None:
        self.now_ms = 0.0

    def event(self) -> _Event:
        return _Event(self)


class _Event:
    """A CUDA event stand-in, always complete: ``record`` takes the clock's "GPU now";
    elapsed_time like CUDA's, a float32 of milliseconds (so far-apart events lose precision as
    real ones do)."""

    def __init__(self, clock: _Clock) -> None:
        self.clock = clock
        self.t_ms = math.nan

    def record(self, stream: Any = None) -> None:
        self.t_ms = self.clock.now_ms

    def query(self) -> bool:
        return True

    def elapsed_time(self, other: _Event) -> float:
        return float(np.float32(other.t_ms - self.t_ms))


def _stream(sid: int, clock: _Clock) -> Any:
    """A real core StreamRec of fake stream ``sid`` (not registered), its reference event
    recorded at the clock's "GPU now"."""
    return _core.StreamRec((sid, 0, 1), object(), None, clock.event)


def _gpu_sample(
    rec: Any,
    clock: _Clock,
    store: Any,
    slot: int,
    start_ms: float,
    end_ms: float,
    t0_ns: int,
    cpu_ms: float,
    step: int,
    tid: int,
) -> None:
    """Record a start event at GPU time ``start_ms`` and an end event at ``end_ms`` on
    ``rec``, as a region would, and push the sample (the core harvests and places it)."""
    clock.now_ms = start_ms
    start = rec.take()
    clock.now_ms = end_ms
    end = rec.take()
    rec.push(store, slot, store.gen, start, end, (), t0_ns, t0_ns + int(cpu_ms * 1e6), step, tid)


def _host_sample(store: Any, slot: int, t0_ns: int, cpu_ms: float, step: int, tid: int) -> None:
    nan = math.nan
    store.record(slot, store.gen, -1, nan, cpu_ms, step, t0_ns, tid, nan, 0, False)


def _fake_gpu_timer() -> tuple[Timer, int, int]:
    """A Timer whose trace ring holds GPU samples of two fake streams, placed by the core's
    harvest, and a host sample; returns it with the two streams' reference host times."""
    t = Timer(name="fake-gpu")
    store, tree = t.recorder.store, t.recorder.tree
    tid = threading.get_ident()
    clock = _Clock()  # both references are recorded at GPU time 0 of their stream
    s7 = _stream(7, clock)
    s9 = _stream(9, clock)  # made later: its reference's host time is later
    h, ms = s7.ref_ns, 1_000_000  # host ns of stream 7's reference, ns per ms
    outer = tree.child(-1, "outer")
    _host_sample(store, tree.child(-1, "load"), h + ms // 10, 0.3, 0, tid)
    _gpu_sample(s7, clock, store, outer, 2.0, 10.0, h + ms // 2, 1.0, 0, tid)
    _gpu_sample(
        s7, clock, store, tree.child(outer, "inner"), 3.0, 5.0, h + 6 * ms // 10, 0.2, 0, tid
    )
    _gpu_sample(s9, clock, store, tree.child(-1, "side"), 1.0, 2.0, h + 7 * ms // 10, 0.1, 0, tid)
    # Two threads on stream 7 whose spans overlap without nesting.
    _gpu_sample(s7, clock, store, tree.child(-1, "a"), 20.0, 30.0, h + 15 * ms, 1.0, 1, tid)
    _gpu_sample(s7, clock, store, tree.child(-1, "b"), 25.0, 35.0, h + 16 * ms, 1.0, 1, 4242)
    for rec in (s7, s9):
        rec.harvest()
        assert rec.pending == 0
    store.step = 2  # as if step() had been called twice while these ran
    return t, s7.ref_ns, s9.ref_ns


# Host-clock instants are float64 ns (at_ns) near the monotonic clock's value (~1e14 ns after a
# day of uptime, where a float64 step is 0.016 ns): positions derived from them hold to 1e-6 ms.
_NS_EXACT = 1e-6


def test_trace_places_gpu_spans_by_reference_event() -> None:
    """GPU spans sit at ref host time + elapsed time from the stream's reference event."""
    t, ref7, ref9 = _fake_gpu_timer()
    assert ref9 >= ref7
    samples = {s.name: s for s in t.summary(trace=True).trace}
    # Origin: the earliest instant, the host start of "load" (0.1 ms after the reference).
    assert samples["load"].host_start_ms == 0.0 and samples["load"].gpu_start_ms is None
    assert samples["load"].stream is None and samples["load"].gpu_ms is None
    assert samples["outer"].gpu_start_ms == pytest.approx(1.9, abs=_NS_EXACT)
    assert samples["outer"].gpu_ms == pytest.approx(8.0, abs=1e-9)
    assert samples["outer/inner"].gpu_start_ms == pytest.approx(2.9, abs=_NS_EXACT)
    # Stream 9's span is placed from stream 9's own reference (made ref9 - ref7 ns later).
    side = (ref9 - ref7) * 1e-6 + 1.0 - 0.1
    assert samples["side"].gpu_start_ms == pytest.approx(side, abs=_NS_EXACT)
    assert (samples["outer"].stream, samples["side"].stream) == (7, 9)
    assert samples["outer"].host_start_ms == pytest.approx(0.4, abs=1e-9)
    assert samples["b"].thread_name == "thread 4242"


def test_trace_tracks_streams_and_lanes() -> None:
    """One track per stream; spans that overlap without nesting go to a second lane."""
    doc = to_chrome(_fake_gpu_timer()[0].summary(trace=True))
    threads = _names(doc, "thread_name")
    gpu_tracks = sorted(name for (pid, _), name in threads.items() if pid != 1)
    assert gpu_tracks == ["stream 7", "stream 7 (2)", "stream 9"]
    spans = _spans(doc)
    lane = {e["name"]: threads[(e["pid"], e["tid"])] for e in spans if e["cat"] == "gpu"}
    assert lane["a"] != lane["b"]
    assert lane["outer"] == lane["inner"] == "stream 7"
    tracks: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for e in spans:
        tracks.setdefault((e["pid"], e["tid"]), []).append(e)
    assert all(_nested(group) for group in tracks.values())


def _set_anchor_hop(hop_ms: float) -> None:
    """The core's constants as ``_device`` hands them, but for the anchor hop."""
    _core.configure(
        inv_log_gamma=INV_LOG_GAMMA,
        harvest_batch=_device.HARVEST_BATCH,
        anchor_hop_ms=hop_ms,
        prewarm=_device.PREWARM_EVENTS,
    )


def test_trace_keeps_precision_far_from_the_reference() -> None:
    """An hour after the reference, float32 elapsed times are 0.25 ms coarse; placement read
    against an anchor that moves forward keeps microseconds and the spans' nesting."""

    def run_for_an_hour(rec: Any, clock: _Clock) -> float:
        # Samples of a store that keeps a trace (only those are placed, moving the anchor).
        scratch = _core.Store(0, 1, 1, lambda parent, name: 0)
        ms = 0.0
        for k in range(36_000):  # ~100 ms apart, irregularly (roundings differ)
            ms += 100.0 + (k * 7919 % 1000) * 1e-4
            _gpu_sample(rec, clock, scratch, 0, ms, ms + 0.5, rec.ref_ns, 0.1, 0, 0)
        rec.harvest()
        assert rec.pending == 0 and len(scratch.snapshot(trace=True).trace) == 1
        return ms + 40.123456

    tid = threading.get_ident()
    coarse = Timer(name="coarse")
    _set_anchor_hop(float("inf"))  # the anchor never moves: one float32 read from the ref
    try:
        clock = _Clock()
        single = _stream(7, clock)
        at = run_for_an_hour(single, clock)
        assert single.anchor_is_ref and single.anchor_ms == 0.0
        store = coarse.recorder.store
        _gpu_sample(single, clock, store, 0, at, at + 0.008, single.ref_ns, 0.1, 0, tid)
        single.harvest()
    finally:
        _device.configure_core()
    (item,) = store.snapshot(trace=True).trace
    assert not math.isnan(item.at_ns)
    assert abs(item.at_ns - single.ref_ns - at * 1e6) > 10_000  # > 0.01 ms off

    t = Timer(name="far")
    store, tree = t.recorder.store, t.recorder.tree
    clock = _Clock()
    s7 = _stream(7, clock)
    far = run_for_an_hour(s7, clock)
    assert not s7.anchor_is_ref and 0 < far - s7.anchor_ms < 2 * _device.ANCHOR_HOP_MS
    host0 = s7.ref_ns + int(far * 1e6)
    p = tree.child(-1, "p")
    _gpu_sample(s7, clock, store, p, far, far + 0.008, host0, 0.1, 0, tid)
    _gpu_sample(s7, clock, store, tree.child(p, "c"), far + 0.001, far + 0.004, host0, 0.05, 0, tid)
    s7.harvest()
    samples = {s.name: s for s in t.summary(trace=True).trace}
    assert set(samples) == {"p", "p/c"}
    assert samples["p/c"].gpu_start_ms - samples["p"].gpu_start_ms == pytest.approx(0.001, abs=1e-5)
    assert samples["p/c"].gpu_ms == pytest.approx(0.003, abs=1e-5)
    assert samples["p"].gpu_ms == pytest.approx(0.008, abs=1e-5)
    # The absolute position: p's GPU start is `far` ms after the reference, whose host time
    # is host0 - far ms (the trace's origin is the earliest instant, here p's GPU start).
    assert samples["p"].gpu_start_ms - samples["p"].host_start_ms == pytest.approx(0, abs=1e-3)
    # On the host clock: the anchor chain's float32 roundings (~4 ns a hop, 36 000 hops) add
    # up to well under a microsecond, against > 10 us with the anchor left at the reference.
    (p_item,) = [i for i in store.snapshot(trace=True).trace if i.slot == p]
    assert p_item.at_ns - s7.ref_ns == pytest.approx(far * 1e6, abs=1_000)


def test_trace_window_and_empty_trace(tmp_path: Path) -> None:
    """export_trace takes a window; a summary without trace samples is refused clearly."""
    t, _, _ = _fake_gpu_timer()
    names = {s.name for s in t.summary(trace=True, steps=[1]).trace}
    assert names == {"a", "b"}
    with pytest.raises(ValueError, match="nothing to trace"):
        cudatimer.export_trace(tmp_path / "x.json", summary=host_run())
    assert not os.path.exists(tmp_path / "x.json")
