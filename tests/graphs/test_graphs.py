"""Regions captured into CUDA graphs, on the fake GPU: timestamps at capture, one sample per
captured call on every replay, nested under the region open around the replay; the ring's
wrap-around, overflow accounting and the report's notes. The real kernels run in
tests/graphs/test_gpu_graphs.py."""

from __future__ import annotations

import gc
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import cudatimer
from cudatimer.sources import _capture
from tests.helpers.fake_cuda import FakeGPU, FakeGraph, install
from tests.helpers.subproc import run_python


@pytest.fixture
def gpu() -> Iterator[FakeGPU]:
    with install() as fake:
        yield fake


def _capture_two(gpu: FakeGPU, timer: cudatimer.Timer | None = None) -> FakeGraph:
    """A graph of ``graph`` > (``attn`` 2 ms, ``mlp`` 3 ms), captured on a side stream."""
    t = timer or cudatimer.default_timer()
    g = FakeGraph(gpu)
    with g.capture(gpu.new_stream()), t.region("graph"):
        with t.region("attn"):
            gpu.run(2.0)
        with t.region("mlp"):
            gpu.run(3.0)
    return g


def _row(summary: cudatimer.Summary, name: str) -> cudatimer.RegionStats:
    return next(r for r in summary.regions if r.name == name)


def test_captured_regions_are_timed_on_every_replay(gpu: FakeGPU) -> None:
    """Each replay gives one sample per captured region, with the GPU time between its stamps."""
    g = _capture_two(gpu)
    for _ in range(5):
        g.replay()
    s = cudatimer.summary()
    assert {r.name: r.calls for r in s.regions} == {"graph": 5, "graph/attn": 5, "graph/mlp": 5}
    assert _row(s, "graph/attn").gpu_mean_ms == pytest.approx(2.0)
    assert _row(s, "graph/mlp").gpu_mean_ms == pytest.approx(3.0)
    assert _row(s, "graph").gpu_mean_ms == pytest.approx(5.0)
    assert all(r.skipped == 0 and r.clock == "cuda:0" for r in s.regions)
    assert _row(s, "graph").cpu_total_ms == 0.0  # no host work per region at replay


def test_capture_itself_records_no_sample(gpu: FakeGPU) -> None:
    """The capture runs nothing on the GPU: it adds no row and no skipped call."""
    _capture_two(gpu)
    s = cudatimer.summary()
    assert s.regions == ()
    assert "graph capture" not in cudatimer.report()


def test_replay_nests_under_the_region_open_around_it(gpu: FakeGPU) -> None:
    """A captured path goes under the region open at replay time, whichever it is."""
    g = _capture_two(gpu)
    with cudatimer.cuda_region("decode"):
        g.replay()
    with cudatimer.cuda_region("prefill"), cudatimer.cuda_region("inner"):
        g.replay()
    names = {r.name for r in cudatimer.summary().regions}
    assert {"decode/graph/attn", "prefill/inner/graph/mlp"} <= names
    assert "graph/attn" not in names


def test_captured_under_an_eager_region_keeps_only_the_path_inside_the_capture(
    gpu: FakeGPU,
) -> None:
    """The region open around the capture is not part of a replay's path."""
    g = FakeGraph(gpu)
    with (
        cudatimer.cuda_region("warmup"),
        g.capture(gpu.new_stream()),
        cudatimer.cuda_region("layer"),
    ):
        gpu.run(1.0)
    cudatimer.reset()
    with cudatimer.cuda_region("serve"):
        g.replay()
    assert [r.name for r in cudatimer.summary().regions] == ["serve", "serve/layer"]


def test_boundaries_with_no_work_between_them_share_a_timestamp(gpu: FakeGPU) -> None:
    """graph>attn>mlp needs 3 timestamps (enter, attn|mlp, exit), not 6."""
    stamps = gpu.stamps(0)
    before = stamps.stamped
    g = _capture_two(gpu)
    assert stamps.stamped - before == 3
    assert sum(1 for op in g.ops if op[0] == "stamp") == 3
    g.replay()
    assert _row(cudatimer.summary(), "graph/attn").gpu_mean_ms == pytest.approx(2.0)


def test_work_between_boundaries_gets_its_own_timestamp(gpu: FakeGPU) -> None:
    """Work between two regions is outside both: their times exclude it."""
    g = FakeGraph(gpu)
    with g.capture(gpu.new_stream()):
        with cudatimer.cuda_region("a"):
            gpu.run(1.0)
        gpu.run(7.0)
        with cudatimer.cuda_region("b"):
            gpu.run(2.0)
    g.replay()
    s = cudatimer.summary()
    assert _row(s, "a").gpu_mean_ms == pytest.approx(1.0)
    assert _row(s, "b").gpu_mean_ms == pytest.approx(2.0)


def test_replays_count_in_the_step_they_were_launched_in(gpu: FakeGPU) -> None:
    """The step of a replay's samples is the step at replay, not at capture or report."""
    g = _capture_two(gpu)
    for n in (1, 3, 2):
        for _ in range(n):
            g.replay()
        cudatimer.step()
    series = cudatimer.step_series()
    per_step = {s.step: s.calls for s in series if s.name == "graph/attn"}
    assert per_step == {0: 1, 1: 3, 2: 2}


def test_ring_wraps_without_loss_when_copies_keep_up(
    gpu: FakeGPU, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1000 replays through a ring of 4 replays: periodic copies read every one of them."""
    monkeypatch.setattr(_capture, "cap_words", 12)  # 3 timestamps a replay: 4 replays
    g = _capture_two(gpu)
    for i in range(1000):
        gpu.run(0.5)  # eager work between replays moves the clock
        g.replay()
        if i == 0:
            assert gpu.copies == 0  # no copy per replay
    assert 400 <= gpu.copies <= 600  # one every half ring
    s = cudatimer.summary()
    assert _row(s, "graph/attn").calls == 1000
    assert _row(s, "graph/attn").gpu_max_ms == pytest.approx(2.0)
    assert "lost" not in cudatimer.report()


def test_ring_overflow_is_counted_and_reported(
    gpu: FakeGPU, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Copies held back while the ring wraps: the lost replays are counted, the rest timed."""
    monkeypatch.setattr(_capture, "cap_words", 12)
    g = _capture_two(gpu)
    gpu.copies_held = True
    for _ in range(10):
        g.replay()
    gpu.copies_held = False
    s = cudatimer.summary()
    kept = _row(s, "graph/attn").calls
    # The ring holds 4 replays; the oldest of them may be under a replay in flight during the
    # copy, so it is not trusted: the last 3 are kept, 7 replays x 3 regions are lost.
    assert kept == 3
    text = cudatimer.report()
    assert "21 region call(s) in CUDA graph replays were lost" in text
    assert _row(s, "graph").calls == 3


def test_report_waits_no_longer_than_its_timeout(gpu: FakeGPU) -> None:
    """GPU not done: summary(timeout_s=0) counts the replays as pending, then reads them."""
    g = _capture_two(gpu)
    gpu.copies_held = True
    g.replay()
    g.replay()
    s = cudatimer.summary(timeout_s=0)
    assert s.pending == 6 and s.regions == ()
    gpu.copies_held = False
    s = cudatimer.summary(timeout_s=0)
    assert s.pending == 0 and _row(s, "graph").calls == 2


def test_reading_twice_counts_each_replay_once(gpu: FakeGPU) -> None:
    """A report reads each replay once; the next report sees only new replays added."""
    g = _capture_two(gpu)
    g.replay()
    assert _row(cudatimer.summary(), "graph").calls == 1
    assert _row(cudatimer.summary(), "graph").calls == 1
    g.replay()
    assert _row(cudatimer.summary(), "graph").calls == 2


def test_timer_off_at_replay_records_nothing(gpu: FakeGPU) -> None:
    """A replay while the Timer is disabled adds no sample."""
    g = _capture_two(gpu)
    cudatimer.disable()
    g.replay()
    cudatimer.enable()
    g.replay()
    assert _row(cudatimer.summary(), "graph").calls == 1


def test_graph_captured_while_disabled_replays_untouched(gpu: FakeGPU) -> None:
    """Captured with the Timer off, a graph has no timestamp and its replays are not noted."""
    cudatimer.disable()
    g = _capture_two(gpu)
    cudatimer.enable()
    assert not any(op[0] in ("stamp", "advance") for op in g.ops)
    g.replay()
    assert cudatimer.summary().regions == ()
    assert cudatimer.default_timer().recorder.graphs.pending() == 0


def test_reset_drops_replays_launched_before_it(gpu: FakeGPU) -> None:
    """reset() forgets replays launched before it, even those not read yet."""
    g = _capture_two(gpu)
    gpu.copies_held = True
    g.replay()
    cudatimer.reset()
    gpu.copies_held = False
    g.replay()
    assert _row(cudatimer.summary(), "graph").calls == 1


def test_two_timers_in_one_graph(gpu: FakeGPU) -> None:
    """Regions of two Timers captured together: each Timer gets its own samples."""
    other = cudatimer.Timer(name="other")
    g = FakeGraph(gpu)
    with g.capture(gpu.new_stream()):
        with cudatimer.cuda_region("mine"):
            gpu.run(1.0)
        with other.region("theirs"):
            gpu.run(4.0)
    with other.region("outer"):
        g.replay()
    assert [r.name for r in cudatimer.summary().regions] == ["mine"]
    theirs = {r.name: r.gpu_mean_ms for r in other.summary().regions}
    assert theirs["outer/theirs"] == pytest.approx(4.0)


def test_region_open_across_capture_end_is_left_out(gpu: FakeGPU) -> None:
    """A region entered in capture and exited after it has no end timestamp: no sample."""
    g = FakeGraph(gpu)
    region = cudatimer.default_timer().region("straddle")
    with g.capture(gpu.new_stream()):
        with cudatimer.cuda_region("inside"):
            gpu.run(1.0)
        region.__enter__()
    region.__exit__(None, None, None)
    g.replay()
    assert [r.name for r in cudatimer.summary().regions] == ["inside"]


def test_capture_outside_torch_graphs_still_counts_skipped(gpu: FakeGPU) -> None:
    """A capture begun without CUDAGraph (no ring): host time, counted as skipped."""
    with gpu.capture(gpu.new_stream()), cudatimer.cuda_region("raw"):
        pass
    row = _row(cudatimer.summary(), "raw")
    assert row.skipped == 1 and row.clock == "host"


def test_graph_collected_with_replays_unread_is_still_reported(gpu: FakeGPU) -> None:
    """A graph garbage-collected before the report: its replays are read all the same."""
    g = _capture_two(gpu)
    gpu.copies_held = True
    g.replay()
    del g
    gc.collect()
    gpu.copies_held = False
    assert _row(cudatimer.summary(), "graph").calls == 1
    assert cudatimer.default_timer().recorder.graphs.pending() == 0


def test_graph_reset_and_recapture(gpu: FakeGPU) -> None:
    """A graph reset and captured again: old replays kept, new ones timed with the new regions."""
    g = _capture_two(gpu)
    g.replay()
    g.reset()
    with g.capture(gpu.new_stream()), cudatimer.cuda_region("new"):
        gpu.run(1.5)
    g.replay()
    s = cudatimer.summary()
    assert _row(s, "graph").calls == 1
    assert _row(s, "new").gpu_mean_ms == pytest.approx(1.5)


def test_captured_regions_reach_the_trace_and_exports(gpu: FakeGPU, tmp_path: Path) -> None:
    """Replayed samples are placed on the GPU track of the trace, like eager ones."""
    g = _capture_two(gpu)
    for _ in range(3):
        g.replay()
    s = cudatimer.summary(trace=True)
    spans = [t for t in s.trace if t.name == "graph/attn"]
    assert len(spans) == 3
    assert all(t.gpu_ms == pytest.approx(2.0) for t in spans)
    starts = [t.gpu_start_ms for t in spans]
    assert all(x is not None and x >= 0 for x in starts)
    assert starts == sorted(starts) and len(set(starts)) == 3
    path = tmp_path / "trace.json"
    cudatimer.export_trace(path)
    events = json.loads(path.read_text())["traceEvents"]
    attn = [e for e in events if e.get("args", {}).get("region") == "graph/attn"]
    assert [e["cat"] for e in attn] == ["gpu"] * 3  # no empty host span at replay


def test_replay_that_raises_is_not_counted(gpu: FakeGPU) -> None:
    """A replay whose launch raised adds nothing and leaves no pending replay."""
    g = _capture_two(gpu)

    def fail(graph: FakeGraph) -> None:
        raise RuntimeError("launch failed")

    with pytest.raises(RuntimeError):
        _capture.replay(g, fail)
    assert cudatimer.default_timer().recorder.graphs.pending() == 0
    g.replay()
    assert _row(cudatimer.summary(), "graph").calls == 1


def test_torch_cuda_graph_methods_are_wrapped() -> None:
    """torch.cuda.CUDAGraph's capture and replay go through cudatimer's hooks."""
    cls = torch.cuda.CUDAGraph
    for name in ("capture_begin", "capture_end", "replay", "reset"):
        method = getattr(cls, name)
        assert method.__module__ == "cudatimer.sources._capture", name
        assert callable(method.__wrapped__)


def test_env_disable_leaves_torch_cuda_graph_alone() -> None:
    """CUDATIMER_DISABLE=1: torch.cuda.CUDAGraph's methods are torch's own."""
    code = """
        import torch, cudatimer
        names = ("capture_begin", "capture_end", "replay", "reset")
        print(sorted({getattr(torch.cuda.CUDAGraph, n).__module__ for n in names}))
    """
    off = run_python(code, {"CUDATIMER_DISABLE": "1"})
    on = run_python(code, {"CUDATIMER_DISABLE": "0"})
    assert off.returncode == 0 and on.returncode == 0, off.stderr + on.stderr
    assert off.stdout.strip() == "['torch.cuda.graphs']"
    assert on.stdout.strip() == "['cudatimer.sources._capture']"


def test_reports_on_another_thread_while_replays_run_lose_nothing(
    gpu: FakeGPU, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reports read on one thread while another replays: every replay is counted once."""
    monkeypatch.setattr(_capture, "cap_words", 30)  # 3 timestamps a replay: 10 replays a ring
    g = _capture_two(gpu)
    done = threading.Event()
    seen: list[int] = []

    def report() -> None:
        while not done.is_set():
            seen.append(_row_calls(cudatimer.summary(timeout_s=0), "graph"))

    reader = threading.Thread(target=report)
    reader.start()
    try:
        for _ in range(3000):
            g.replay()
    finally:
        done.set()
        reader.join()
    assert seen and seen == sorted(seen)  # counts only grow
    s = cudatimer.summary()
    assert _row(s, "graph/attn").calls == 3000 and _row(s, "graph").calls == 3000
    assert "lost" not in cudatimer.report()


def _row_calls(summary: cudatimer.Summary, name: str) -> int:
    return next((r.calls for r in summary.regions if r.name == name), 0)
