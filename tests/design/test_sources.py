"""The seam of the boundary sources: the Recorder reads every source through one protocol
(drain, pending, notes, reset), each source keeps its per-Timer state on the Timer's recorder,
``reset()`` clears all of it, and one registry holds the live Timers."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

import cudatimer
from cudatimer import Timer
from cudatimer.regions._timer import live_timers
from cudatimer.sources import _backward, _capture, _compile
from cudatimer.sources._source import TIMERS
from tests.helpers.fake_cuda import FakeGPU, FakeGraph, install


@pytest.fixture
def gpu() -> Iterator[FakeGPU]:
    with install() as fake:
        yield fake


class _Counted:
    """A source of its own: holds 3 region calls until drained, notes what it did."""

    def __init__(self) -> None:
        self.held = 3
        self.drains: list[float] = []
        self.resets = 0

    def drain(self, timeout_s: float) -> None:
        self.drains.append(timeout_s)

    def pending(self) -> int:
        return self.held

    def notes(self) -> tuple[tuple[str, str], ...]:
        return (("counted_note", f"{self.held} held"),)

    def reset(self) -> None:
        self.resets += 1
        self.held = 0


def test_a_new_source_plugs_in_as_one_more_entry() -> None:
    """A source in Recorder.sources is drained by a report, its pending calls and notes reach
    the summary, and reset() resets it: no other change."""
    t = Timer(name="seam-source")
    src = _Counted()
    t.recorder.sources += (src,)
    s = t.summary(timeout_s=2.0)
    assert s.pending == 3 and dict(s.meta)["counted_note"] == "3 held"
    assert len(src.drains) == 1 and 0.0 <= src.drains[0] <= 2.0
    t.reset()
    assert src.resets == 1
    assert t.summary().pending == 0


def test_reset_clears_the_note_of_regions_traced_untimed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Regions traced into compiled code without the marks are noted; reset() forgets the
    note with the results."""
    t = Timer(name="left-out")
    monkeypatch.setattr(_compile, "SUPPORTED", False)
    _compile.block(t.compile_key, "inner", {})  # what Dynamo's trace of timer.region() runs
    _compile.block(t.compile_key, "inner", {})
    assert dict(t.summary().meta)["compile_note"].startswith("2 region(s) traced")
    t.reset()
    assert "compile_note" not in dict(t.summary().meta)
    _compile.block(t.compile_key, "again", {})
    assert dict(t.summary().meta)["compile_note"].startswith("1 region(s) traced")


def test_the_note_is_the_traced_timer_s_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Another Timer's regions traced untimed leave this Timer's report alone."""
    mine, other = Timer(name="mine"), Timer(name="other")
    monkeypatch.setattr(_compile, "SUPPORTED", False)
    _compile.block(other.compile_key, "x", {})
    assert "compile_note" not in dict(mine.summary().meta)
    assert "compile_note" in dict(other.summary().meta)


def _capture_two(gpu: FakeGPU, t: Timer) -> FakeGraph:
    g = FakeGraph(gpu)
    with g.capture(gpu.new_stream()), t.region("graph"):
        with t.region("attn"):
            gpu.run(2.0)
        with t.region("mlp"):
            gpu.run(3.0)
    return g


def test_reset_clears_the_note_of_lost_graph_replays(
    gpu: FakeGPU, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replays the ring lost are noted until reset(); replays lost before a reset but read
    after it are not noted (their results went with it)."""
    monkeypatch.setattr(_capture, "cap_words", 12)  # 3 timestamps a replay: 4 replays a ring
    t = Timer(name="lost")
    g = _capture_two(gpu, t)
    gpu.copies_held = True
    for _ in range(10):
        g.replay()
    gpu.copies_held = False
    assert "21 region call(s) in CUDA graph replays were lost" in dict(t.summary().meta).get(
        "graph_note", ""
    )
    t.reset()
    assert "graph_note" not in dict(t.summary().meta)
    gpu.copies_held = True
    for _ in range(10):
        g.replay()
    t.reset()
    gpu.copies_held = False
    assert "graph_note" not in dict(t.summary().meta)


def test_reset_clears_the_note_of_calls_the_ring_had_no_room_for(
    gpu: FakeGPU, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A capture with more boundaries than the ring holds notes the calls left untimed, for
    the Timer that captured them, until reset()."""
    monkeypatch.setattr(_capture, "cap_words", 2)  # room for 2 timestamps: one call
    t, other = Timer(name="full"), Timer(name="bystander")
    _capture_two(gpu, t)
    assert "2 region call(s) captured into a CUDA graph are not timed" in dict(
        t.summary().meta
    ).get("graph_note", "")
    assert "graph_note" not in dict(other.summary().meta)
    t.reset()
    assert "graph_note" not in dict(t.summary().meta)


def test_reset_clears_the_sync_counts_and_backward_paths() -> None:
    """Sync counts and the cached slots of backward paths go with reset()."""
    t = Timer(name="counts")
    with t.region("r"):
        assert t.recorder.syncs.note("item", "x.py:1")
    site = _backward.Site(t.region("r.backward"), ("r.backward",))
    site.close(site.open())
    assert t.summary()["r"].syncs == 1 and t.summary()["r.backward"].calls == 1
    t.reset()
    assert t.summary().sync_sites == () and t.recorder.syncs.per_slot == {}
    site.close(site.open())  # its cached slot was of the old generation: taken again
    assert [r.name for r in t.summary().regions] == ["r.backward"]


def test_one_registry_holds_every_live_timer_and_lets_dead_ones_go() -> None:
    """live_timers() and compiled code's Timer numbers read one registry; a collected Timer
    leaves it, and its number is never given to another."""
    t = Timer(name="registered")
    key = t.compile_key
    assert TIMERS.get(key) is t and t in live_timers()
    assert live_timers()[0] is cudatimer.default_timer()  # oldest first
    del t
    gc.collect()
    assert TIMERS.get(key) is None
    assert all(x.name != "registered" for x in live_timers())
    assert Timer(name="next").compile_key > key
    assert not hasattr(_compile, "_TIMERS")  # no second registry


def test_each_timer_numbers_its_own_backward_sites() -> None:
    """Backward sites are kept by the recorder of their Timer, not in a process list."""
    torch = pytest.importorskip("torch")
    t, other = Timer(name="sites"), Timer(name="no-sites")
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    with cudatimer.instrument(model, backward=True, timer=t):
        model(torch.ones(1, 2, requires_grad=True)).sum().backward()
    assert other.recorder.backward.sites == []
    if _compile.SUPPORTED:
        assert t.recorder.backward.sites and all(
            s.rec is t.recorder for s in t.recorder.backward.sites
        )
    assert t.summary()["Sequential.backward"].calls == 1
