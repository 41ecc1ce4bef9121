"""The recorder contract (``cudatimer/core/_core.pyi``): the C core and its Python reference, driven
side by side with the same fake events, give the same results; and the whole CPU suite runs on
the core that this process did not choose (a subprocess with the other setting)."""

from __future__ import annotations

import importlib
import io
import math
import os
import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import cudatimer
from cudatimer.core import _core, _core_py, _device
from cudatimer.records._hist import INV_LOG_GAMMA
from tests.helpers.fake_cuda import FakeEvent, FakeGPU

ROOT = Path(__file__).resolve().parents[2]


def _c_core() -> ModuleType | None:
    try:
        return importlib.import_module("cudatimer.core._speedups")
    except ImportError:
        return None


C_CORE = _c_core()
CORES = [pytest.param(_core_py, id="python")] + (
    [pytest.param(C_CORE, id="c")] if C_CORE is not None else []
)
needs_c = pytest.mark.skipif(C_CORE is None, reason="the C core was not built here")


def _configure(core: ModuleType) -> None:
    """The constants ``_device`` hands the chosen core, handed to ``core``."""
    core.configure(
        inv_log_gamma=INV_LOG_GAMMA,
        harvest_batch=_device.HARVEST_BATCH,
        anchor_hop_ms=_device.ANCHOR_HOP_MS,
        prewarm=_device.PREWARM_EVENTS,
    )


class _Bench:
    """One core wired to a fake GPU for the length of a test (its module state restored)."""

    def __init__(self, core: ModuleType) -> None:
        _configure(core)
        self.core = core
        self.gpu = FakeGPU()
        self.names: dict[tuple[int, str], int] = {}
        self.paths: dict[int, str] = {}

    def child(self, parent: int, name: str) -> int:
        key = (parent, name)
        if key not in self.names:
            self.names[key] = len(self.names)
            prefix = "" if parent < 0 else self.paths[parent] + "/"
            self.paths[self.names[key]] = prefix + name
        return self.names[key]

    def stream(self, key: tuple[int, int, int] = (0, 0, 1)) -> Any:
        gpu = self.gpu
        return self.core.new_stream(key, gpu.stream(key), None, lambda: FakeEvent(gpu, key[1]))

    def region(self, store: Any, name: str, fast: bool = True) -> Any:
        """A region of this core with general hooks that only count (fast=False: always), and
        NVTX ranges of detached calls that note ("start", attrs) and ("end", range id) in
        ``ranges``."""
        core = self.core

        class R(core.RegionBase):  # type: ignore[misc, name-defined]
            __slots__ = ("calls", "name", "ranges")

        r = R()
        r.name = name
        r.calls = []
        r.ranges = []

        def start(attrs: Any) -> int:
            r.ranges.append(("start", attrs))
            return len(r.ranges)

        r.bind(
            store,
            fast,
            name,
            None,
            name + ":attrs",
            None,
            lambda region: region.calls.append("enter"),
            lambda region, clean: region.calls.append("exit"),
            start,
            lambda rid: r.ranges.append(("end", rid)),
        )
        return r


@pytest.fixture(params=CORES)
def bench(request: pytest.FixtureRequest) -> Iterator[_Bench]:
    core: ModuleType = request.param
    b = _Bench(core)
    core.forget_streams()
    core.set_stream_getter(b.gpu.get_stream, False)
    core.set_usable(True)
    try:
        yield b
    finally:
        core.forget_streams()
        core.set_usable(False)
        core.set_stream_getter(None, False)
        _configure(core)
        if core is _core:  # the chosen core: give it back to the device seam as it was
            _device.use(_device.use(None))


def _canon(snap: Any, paths: dict[int, str], ref_ns: int) -> dict[str, Any]:
    """A snapshot as comparable plain data. Host times of the fast path come from the real
    clock (they differ between runs): only their counts are compared, and GPU placements are
    taken relative to the stream's reference. Totals are rounded: C sums one by one, the
    Python reference in batches with fsum."""

    def hist(h: Any, host_clock: bool) -> tuple[Any, ...]:
        if host_clock:
            return (h[0],)
        return (h[0], round(h[1], 9), h[2], h[3], h[4], tuple(h[5]))

    return {
        "stats": sorted(
            (
                paths[s.slot],
                s.dev,
                s.order,
                s.calls,
                s.skipped,
                hist(s.gpu, False),
                hist(s.cpu, s.dev >= 0),
            )
            for s in snap.stats
        ),
        "kept": tuple(snap.kept),
        "dropped": tuple(snap.dropped),
        "series": sorted(
            (
                r.step,
                paths[r.slot],
                r.dev,
                bytes(r.gpu_ms),
                len(r.cpu_ms) if r.dev >= 0 else bytes(r.cpu_ms),
            )
            for r in snap.series
        ),
        "trace": [
            (
                paths[t.slot],
                t.dev,
                t.stream,
                None if math.isnan(t.at_ns) else round((t.at_ns - ref_ns) / 1000),
                None if math.isnan(t.gpu_ms) else round(t.gpu_ms, 9),
                t.step,
            )
            for t in snap.trace
        ],
    }


def _scenario(b: _Bench) -> dict[str, Any]:
    """Every path of the contract that a fake GPU can drive, with fixed host times."""
    core, gpu = b.core, b.gpu
    rec = b.stream()
    side = b.stream((7, 0, 1))
    store = core.Store(3, 8, 5, b.child)
    outer, inner = b.region(store, "outer"), b.region(store, "inner")
    for _ in range(4):
        with outer:
            gpu.run(2.0)
            with inner:
                gpu.run(1.0)
            with inner:
                gpu.run(0.5)
        store.step += 1
    gpu.hold()
    with outer:
        gpu.run(4.0)
    held = core.drain(0.0)
    gpu.release()
    slot = b.child(-1, "host")
    for i in range(7):  # more than step_cap (5) in step 4: the step is dropped
        store.record(
            slot, store.gen, -1, math.nan, 0.25 * i, store.step, 1000 * i, 1, math.nan, 0, i == 3
        )
    store.count(slot, store.gen, -1)
    start, end = rec.take(), None
    gpu.run(3.0)
    gpu.busy[(7, 0, 1)] = gpu.busy[(0, 0, 1)] + 6.0  # stream 7 ends 9 ms after the start
    end = rec.take()
    far = side.take()
    rec.push(store, b.child(-1, "sides"), store.gen, start, end, (far,), 0, 10, store.step, 1)
    gpu.run(150.0)  # past the anchor hop: placement moves its anchor
    with outer:
        gpu.run(1.0)
    # Detached calls (backward rows): closed out of order, one of them on another thread.
    row = b.region(store, "row")
    first = row.open_at(b.child(-1, "rows"), store.gen)
    gpu.run(2.5)
    second = row.open_at(b.child(b.child(-1, "rows"), "inner"), store.gen)
    gpu.run(0.75)
    assert row.close(first) and not row.close(first)
    done: list[bool] = []
    thread = threading.Thread(target=lambda: done.append(row.close(second)))
    thread.start()
    thread.join()
    left = core.drain(1.0)
    out = _canon(store.snapshot(series=True, trace=True), b.paths, rec.ref_ns)
    out.update(held=held, left=left, pending=store.pending(), anchor_is_ref=rec.anchor_is_ref)
    out["general"] = (outer.calls, inner.calls, row.calls)
    out["detached"] = (done, row.ranges, first.kind, second.start)
    return out


def _on_both_cores(run: Callable[[_Bench], Any]) -> list[Any]:
    """``run`` on the Python reference, then on the C core, each wired to its own fake GPU."""
    results = []
    for core in (_core_py, C_CORE):
        b = _Bench(core)  # type: ignore[arg-type]
        core.forget_streams()
        core.set_stream_getter(b.gpu.get_stream, False)
        core.set_usable(True)
        try:
            results.append(run(b))
        finally:
            core.forget_streams()
            core.set_usable(False)
            core.set_stream_getter(None, False)
    _device.use(_device.use(None))
    return results


@needs_c
def test_both_cores_give_the_same_results() -> None:
    """The same calls on the C core and on the Python reference give equal snapshots."""
    results = _on_both_cores(_scenario)
    python, c = results
    assert python == c
    # held: the held region, and the last two ends recorded at the instant the GPU was held
    assert python["held"] == 3 and python["left"] == 0 and python["general"] == ([], [], [])
    assert python["anchor_is_ref"] is False
    assert python["dropped"] == (4,) and python["kept"] == (2, 3, 4)


def test_scenario_results_are_what_the_fake_gpu_ran(bench: _Bench) -> None:
    """Each core's own results match the work queued on the fake GPU."""
    got = _scenario(bench)
    stats = {(p, d): (calls, skipped, gpu) for p, d, _, calls, skipped, gpu, _ in got["stats"]}
    assert stats[("outer", 0)][0] == 6 and stats[("outer/inner", 0)][0] == 8
    assert stats[("outer/inner", 0)][2][2:4] == (0.5, 1.0)  # GPU min and max
    assert stats[("sides", 0)][2][3] == pytest.approx(9.0)  # the latest end, on stream 7
    assert stats[("host", -1)][:2] == (8, 1)  # 7 timed + 1 counted; one skipped
    assert [t[0] for t in got["trace"]][-4:] == ["sides", "outer", "rows", "rows/inner"]
    # detached calls: the first closed before the second, the second on another thread
    assert stats[("rows", 0)][2][3] == pytest.approx(3.25)
    assert stats[("rows/inner", 0)][2][3] == pytest.approx(0.75)
    assert got["detached"][0] == [True]


def test_fast_path_falls_back_to_the_general_hooks(bench: _Bench) -> None:
    """A region not fast, a disabled store, or a side stream go to the general hooks."""
    store = bench.core.Store(0, 0, 1, bench.child)
    bench.stream()
    slow = bench.region(store, "slow", fast=False)
    with slow:
        pass
    fast = bench.region(store, "fast")
    store.enabled = False
    with fast:
        pass
    store.enabled = True
    side = bench.gpu.new_stream()
    bench.stream(FakeGPU.key(side))
    with bench.gpu.use(side), fast:
        pass
    assert slow.calls == ["enter", "exit"] and fast.calls == ["enter", "exit"] * 2
    assert store.snapshot().stats == []


def test_detached_calls_are_timed_on_no_stack(bench: _Bench) -> None:
    """open_at/close time a call on no stack, with its NVTX range, in one core call each."""
    core, gpu = bench.core, bench.gpu
    bench.stream()
    store = core.Store(2, 8, 100, bench.child)
    row = bench.region(store, "row")
    slot = bench.child(-1, "row")
    gpu.run(1.0)
    frame = row.open_at(slot, store.gen)
    assert (frame.kind, frame.slot, frame.range_id) == (core.TIMED, slot, 1)
    assert len(store.stack()) == 0  # on no stack
    gpu.run(4.0)
    assert row.close(frame) is True
    assert frame.kind == core.OFF and not row.close(frame)  # a second close does nothing
    assert core.drain(1.0) == 0
    (stats,) = store.snapshot(trace=True).stats
    assert (stats.slot, stats.calls, stats.gpu.min) == (slot, 1, pytest.approx(4.0))
    assert row.ranges == [("start", "row:attrs"), ("end", 1)] and row.calls == []
    assert store.snapshot(trace=True).trace[0].tid == threading.get_ident()


def test_detached_calls_leave_the_uncommon_cases_to_the_caller(bench: _Bench) -> None:
    """open_at returns None and close False, doing nothing, where the general path must run."""
    core, gpu = bench.core, bench.gpu
    bench.stream()
    store = core.Store(0, 0, 100, bench.child)
    slow, row = bench.region(store, "slow", fast=False), bench.region(store, "row")
    assert slow.open_at(0, store.gen) is None
    store.enabled = False
    assert row.open_at(0, store.gen) is None
    store.enabled = True
    side = gpu.new_stream()
    bench.stream(FakeGPU.key(side))
    before = gpu.records
    with gpu.use(side):
        assert row.open_at(0, store.gen) is None  # a side stream: maybe capturing
    frame = row.open_at(0, store.gen)
    with gpu.use(side):
        assert row.close(frame) is False  # the stream changed: the general path's
    assert frame.kind == core.TIMED and not slow.close(frame)  # another region's frame
    assert not row.close(core.Frame(row, 0, store.gen, core.HOST))
    with pytest.raises(TypeError, match="Frame"):
        row.close("frame")
    assert row.close(frame) and slow.ranges == [] and gpu.records - before == 2
    assert [r[0] for r in row.ranges] == ["start", "end"] and row.calls == slow.calls == []


def test_stack_frames_have_named_fields(bench: _Bench) -> None:
    """Stacks hold Frames with named fields; take() finds a region's frame out of order."""
    core = bench.core
    store = core.Store(0, 0, 1, bench.child)
    stack = store.stack()
    a, b = object(), object()
    stack.push(core.Frame(a, 1, 0, core.HOST, t0_ns=5))
    stack.push(core.Frame(b, 2, 0, core.UNTIMED, dev=3))
    top = stack.top()
    assert (top.region, top.slot, top.kind, top.dev) == (b, 2, core.UNTIMED, 3)
    assert len(stack) == 2 and stack.tid == threading.get_ident()
    frame = stack.take(a)
    assert frame is not None and (frame.slot, frame.t0_ns) == (1, 5)
    assert stack.take(a) is None and [f.region for f in stack.frames()] == [b]
    assert stack.pop().region is b
    with pytest.raises(IndexError):
        stack.pop()


def test_stacks_are_per_thread(bench: _Bench) -> None:
    """Each thread sees its own stack of a store, with its own thread id."""
    core = bench.core
    store = core.Store(0, 0, 1, bench.child)
    store.stack().push(core.Frame(None, 0, 0, core.OFF))
    seen: list[tuple[int, int]] = []
    thread = threading.Thread(target=lambda: seen.append((len(store.stack()), store.stack().tid)))
    thread.start()
    thread.join()
    assert seen == [(0, thread.ident)] and len(store.stack()) == 1
    store.stack().clear()


def test_bury_turns_event_frames_into_host_frames(bench: _Bench) -> None:
    """A forked child's open event frames become host frames; their events go to the grave."""
    core = bench.core
    rec = bench.stream()
    store = core.Store(0, 0, 1, bench.child)
    start = rec.take()
    store.stack().push(core.Frame(None, 0, 0, core.TIMED, rec, start, 7))
    grave: list[Any] = []
    store.stack().bury(grave)
    frame = store.stack().pop()
    assert (frame.kind, frame.rec, frame.start, frame.t0_ns) == (core.HOST, None, None, 7)
    assert any(g is start for g in grave)
    core.forget_streams(grave)
    assert core.all_streams() == [] and len(grave) > 1


def test_reset_drops_samples_entered_before_it(bench: _Bench) -> None:
    """Samples still pending at reset() never appear; their events return to the pool."""
    store = bench.core.Store(4, 4, 10, bench.child)
    rec = bench.stream()
    r = bench.region(store, "r")
    with r:
        pass
    bench.core.drain(1.0)
    pooled = rec.pooled
    bench.gpu.hold()
    with r:
        bench.gpu.run(1.0)
    store.reset()
    bench.gpu.release()
    assert bench.core.drain(1.0) == 0 and store.snapshot().stats == [] and store.gen == 1
    assert rec.pooled == pooled and store.step == 0


def test_a_region_under_many_parents_asks_its_slot_once_per_parent(bench: _Bench) -> None:
    """A region entered under 12 parents in turn (instrument's "attn" in each block) asks the
    store's child() once per parent, not once a call; after reset() once per parent again."""
    asked: list[tuple[int, str]] = []

    def child(parent: int, name: str) -> int:
        asked.append((parent, name))
        return bench.child(parent, name)

    store = bench.core.Store(0, 0, 10_000, child)
    bench.stream()
    parents = [bench.region(store, f"h.{i}") for i in range(12)]
    attn = bench.region(store, "attn")
    for _ in range(5):
        for p in parents:
            with p, attn:
                pass
    assert len(asked) == 24 and sorted(set(asked)) == sorted(asked)
    bench.core.drain(1.0)
    calls = {bench.paths[s.slot]: s.calls for s in store.snapshot().stats}
    assert calls == {**{f"h.{i}": 5 for i in range(12)}, **{f"h.{i}/attn": 5 for i in range(12)}}
    store.reset()
    asked.clear()
    for p in parents:
        with p, attn:
            pass
    assert len(asked) == 24


def test_harvest_batch_is_the_one_handed_to_the_core(bench: _Bench) -> None:
    """Pending samples are harvested every ``harvest_batch`` exits, as configured (the C core
    keeps no copy of the constant)."""
    core = bench.core
    core.configure(
        inv_log_gamma=1.0 / math.log((1.01) / (0.99)),
        harvest_batch=4,
        anchor_hop_ms=100.0,
        prewarm=2,
    )
    rec = bench.stream()
    assert rec.pooled == 2
    store = core.Store(0, 0, 1, bench.child)
    r = bench.region(store, "r")
    for _ in range(3):
        with r:
            pass
    assert rec.pending == 3
    with r:
        pass
    assert rec.pending == 0 and store.snapshot().stats[0].calls == 4


@needs_c
def test_c_source_defines_no_constant_of_the_python_side() -> None:
    """The C core takes its constants from ``configure``; none is written into its source."""
    core = Path(cudatimer.__file__).resolve().parent / "core"
    parts = [core / "_speedups.c", *sorted((core / "_c").glob("*.c"))]
    assert len(parts) > 10
    source = "".join(p.read_text() for p in parts)
    for name in ("ANCHOR_HOP", "HARVEST_BATCH", "PREWARM", "STEP_SAMPLE_CAP"):
        assert not re.search(rf"#define\s+\w*{name}", source), name
    assert not re.search(r"\b(100\.0|65536)\b", source)


def test_chosen_core_is_reported() -> None:
    """``cudatimer.compiled()`` says which core this process chose, once, at import."""
    assert cudatimer.compiled() is (_core.IMPL == "c")
    assert (
        "python" if C_CORE is None or os.environ.get("CUDATIMER_PURE_PYTHON") == "1" else "c"
    ) == _core.IMPL


def test_another_boundary_source_feeds_the_same_records() -> None:
    """A source other than events and the host clock (a marker op, a device timestamp) only
    calls ``Store.record``: its samples reach the summary, windows, step records and trace."""
    t = cudatimer.Timer(name="source")
    store, tree = t.recorder.store, t.recorder.tree
    outer = tree.child(-1, "replay")
    inner = tree.child(outer, "attn")
    for step in range(3):
        base = 10**9 + step * 10**7
        store.record(outer, store.gen, 0, 4.0, 0.1, store.step, base, 1, base + 5e5, 7, False)
        store.record(inner, store.gen, 0, 1.5, 0.05, store.step, base, 1, base + 6e5, 7, False)
        t.step()
    s = t.summary(warmup=1, step_stats=True, trace=True)
    assert s.names == ("replay", "replay/attn")
    assert s["replay/attn"].clock == "cuda:0" and s["replay/attn"].depth == 1
    assert s["replay/attn"].calls == 2 and s["replay/attn"].gpu_total_ms == pytest.approx(3.0)
    assert [(x.step, x.name, x.gpu_ms) for x in s.step_stats][:2] == [
        (1, "replay", 4.0),
        (1, "replay/attn", 1.5),
    ]
    spans = [x for x in s.trace if x.name == "replay/attn"]
    assert [x.stream for x in spans] == [7, 7]
    assert spans[1].gpu_start_ms - spans[0].gpu_start_ms == pytest.approx(10.0)
    assert "+- attn" in t.report(view="tree", file=io.StringIO())


def test_orphan_marks_another_threads_frame(bench: _Bench) -> None:
    """orphan() marks the innermost frame of a region on another thread, never its own."""
    core = bench.core
    store = core.Store(0, 0, 1, bench.child)
    region = object()
    store.stack().push(core.Frame(region, 0, 0, core.HOST, t0_ns=1))
    assert store.orphan(region) is False  # this thread's own frame is not an orphan
    got: list[bool] = []
    thread = threading.Thread(target=lambda: got.append(store.orphan(region)))
    thread.start()
    thread.join()
    top = store.stack().top()
    assert got == [True] and (top.kind, top.dev) == (core.ORPHAN, core.HOST)
    thread = threading.Thread(target=lambda: got.append(store.orphan(region)))
    thread.start()
    thread.join()
    assert got == [True, False]  # already an orphan: nothing more to mark
    store.stack().clear()


def _step_rows_run(b: _Bench) -> list[list[tuple[int, str, int, bytes]]]:
    """Three steps on the fake GPU, one held; step_rows over several ranges."""
    core, gpu = b.core, b.gpu
    b.stream()
    store = core.Store(2, 0, 5, b.child)  # keeps 2 steps: step 0 is evicted by step 2
    outer, inner = b.region(store, "outer"), b.region(store, "inner")
    for ms in (1.0, 2.0, 3.0):
        with outer:
            gpu.run(ms)
            with inner:
                gpu.run(ms / 2)
        store.step += 1
    core.drain(1.0)
    ranges = ((0, 3), (1, 2), (2, 3), (2, 2), (5, 9), (-1, 10**12))
    return [
        sorted((r.step, b.paths[r.slot], r.dev, bytes(r.gpu_ms)) for r in store.step_rows(*ab))
        for ab in ranges
    ]


def test_step_rows_are_the_kept_rows_in_the_range(bench: _Bench) -> None:
    """step_rows(first, stop) gives the snapshot's series rows of the kept steps in range."""
    got = _step_rows_run(bench)
    whole, one, two, empty, later, everything = got
    assert sorted({s for s, *_ in whole}) == [1, 2]  # step 0 is no longer kept
    assert {s for s, *_ in one} == {1} and {s for s, *_ in two} == {2}
    assert empty == [] and later == [] and everything == whole
    assert {(s, p) for s, p, *_ in whole} == {
        (1, "outer"),
        (1, "outer/inner"),
        (2, "outer"),
        (2, "outer/inner"),
    }


@needs_c
def test_step_rows_agree_between_cores() -> None:
    """The C core's step_rows gives what the Python reference gives, byte for byte."""
    results = _on_both_cores(_step_rows_run)
    assert results[0] == results[1]
    assert len(results[0][0]) == 4


# A ring of 7 words holding 3 replays of 2 timestamps each, the third split by its end
# (replay i starts at word (first + 2 i) % 7, first = 2): replay 0 is words 2, 3; replay 1
# is 4, 5; replay 2 is 6 and 0. Column j runs from timestamp ENTER[j] to LEAVE[j].
_RING = [3_000_000, -1, 1_000_000, 2_500_000, 1_250_000, 1_500_000, 2_500_000]
_SLOTS, _ENTER, _LEAVE = [4, 7], [0, 0], [1, 0]
_STEP, _T0, _TID, _STREAM = [0, 0, 1], [400_000, 1_200_000, 2_000_000], [9] * 3, [3] * 3


def _ring_args(**change: Any) -> list[Any]:
    from array import array

    args = {
        "ring": _RING, "slots": _SLOTS, "enter": _ENTER, "leave": _LEAVE, "step": _STEP,
        "t0_ns": _T0, "tid": _TID, "stream": _STREAM,
    }  # fmt: skip
    args.update(change)
    q = {k: array("q", v) for k, v in args.items()}
    return [q["ring"], 2, 2, q["slots"], q["enter"], q["leave"], q["step"], q["t0_ns"],
            q["tid"], q["stream"]]  # fmt: skip


def _ring_run(core: ModuleType) -> tuple[Any, ...]:
    """The same 3 replays x 2 regions folded by record_ring and by record, one store each."""
    _configure(core)
    ring = core.Store(4, 16, 100, lambda parent, name: 0)
    offset = ring.record_ring(0, 0, *_ring_args(), float("inf"))
    one = core.Store(4, 16, 100, lambda parent, name: 0)
    first = [2, 4, 6]
    for i, base in enumerate(first):
        for j, slot in enumerate(_SLOTS):
            a, b = _RING[(base + _ENTER[j]) % 7], _RING[(base + _LEAVE[j]) % 7]
            one.record(slot, 0, 0, (b - a) * 1e-6, 0.0, _STEP[i], _T0[i], _TID[i],
                       a - offset, _STREAM[i], False)  # fmt: skip
    return offset, ring.snapshot(series=True, trace=True), one.snapshot(series=True, trace=True)


@pytest.mark.parametrize("core", CORES)
def test_record_ring_folds_as_record_does(core: ModuleType) -> None:
    """record_ring(m replays x c calls) leaves the store as m*c record() calls would."""
    offset, ring, one = _ring_run(core)
    assert ring == one
    assert offset == 50_000.0  # replay 1: its first stamp 1.25 ms, launched at 1.2 ms
    gpu = {s.slot: (s.gpu.n, s.gpu.total) for s in ring.stats}
    assert gpu[4] == (3, pytest.approx(1.5 + 0.25 + 0.5))  # the split replay read whole
    assert gpu[7] == (3, 0.0)  # a call whose two boundaries share one timestamp


@pytest.mark.parametrize("core", CORES)
def test_record_ring_lowers_only_a_larger_offset(core: ModuleType) -> None:
    """The offset passed in stays when the block's least lead is larger; a reset store's
    generation folds nothing and still says the offset."""
    store = core.Store(4, 16, 100, lambda parent, name: 0)
    assert store.record_ring(0, 0, *_ring_args(), 10.0) == 10.0
    assert store.record_ring(1, 0, *_ring_args(), float("inf")) == 50_000.0
    assert sum(s.calls for s in store.snapshot().stats) == 6  # only the first call folded


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"enter": [0]}, "enter must hold 2"),
        ({"t0_ns": [0, 0]}, "t0_ns must hold 3"),
        ({"leave": [1, 2]}, r"leave\[1\] must be a timestamp index in \[0, 2\)"),
        ({"ring": _RING[:5]}, "must fit 3 replays in a ring of 5 words"),
    ],
)
def test_record_ring_refuses_what_does_not_fit(
    core: ModuleType, change: dict[str, Any], match: str
) -> None:
    """A buffer of the wrong length or an index out of the replay is a ValueError naming it;
    nothing is folded."""
    store = core.Store(4, 16, 100, lambda parent, name: 0)
    with pytest.raises(ValueError, match=match):
        store.record_ring(0, 0, *_ring_args(**change), float("inf"))
    assert store.snapshot().stats == []


@needs_c
def test_record_ring_agrees_between_cores() -> None:
    """The C core's record_ring leaves what the Python reference leaves."""
    assert _ring_run(_core_py)[:2] == _ring_run(C_CORE)[:2]  # type: ignore[arg-type]


def _edge_values() -> list[float]:
    """Durations that walk up and down across bucket edges: repeats, values between two seen
    ones of a bucket, and the last double on either side of an edge."""
    import math

    from cudatimer.records._hist import GAMMA

    out: list[float] = []
    for k in range(-40, 40, 7):
        edge = GAMMA**k
        below, above = math.nextafter(edge, 0.0), math.nextafter(edge, math.inf)
        mid = edge * (1 + (GAMMA - 1) / 2)
        out += [mid, mid * 1.001, mid * 0.999, mid, below, edge, above, mid, below, above]
        out += [edge * GAMMA * (1 + 1e-9 * j) for j in range(-3, 4)]
    return out


def _hist_run(core: ModuleType) -> list[Any]:
    _configure(core)
    store = core.Store(0, 0, 100, lambda parent, name: 0)
    for x in _edge_values():
        store.record(1, 0, 0, x, x, 0, 0, 0, 0.0, 0, False)
    return [(s.gpu, s.cpu) for s in store.snapshot().stats]


@needs_c
def test_histogram_buckets_agree_between_cores_at_bucket_edges() -> None:
    """The C core's buckets (a value between two seen in the last bucket skips the log) are
    the reference's, value for value, at and beside every edge."""
    python, c = _hist_run(_core_py), _hist_run(C_CORE)  # type: ignore[arg-type]
    assert [h.buckets for pair in python for h in pair] == [h.buckets for pair in c for h in pair]
    assert python[0][0].n == len(_edge_values())


def _ring_durations_run(core: ModuleType) -> list[Any]:
    """400 replays x 3 calls whose durations (whole ns) run from 0 past 32768 ns (the C
    core's table of nanosecond buckets ends there) to 5 ms, folded by record_ring."""
    import random
    from array import array

    _configure(core)
    rng = random.Random(7)
    n, m = 4, 400
    words: list[int] = []
    for _ in range(m):
        t = rng.randrange(10**9)
        words += [
            t,
            t + rng.randrange(0, 40_000),
            t + rng.choice([0, 1, 32767, 32768, 5_000_000]),
            0,
        ]
    ring = array("q", words)
    store = core.Store(4, 0, 10**6, lambda parent, name: 0)
    q = lambda v: array("q", v)  # noqa: E731
    store.record_ring(0, 0, ring, 0, n, q([1, 2, 3]), q([0, 0, 2]), q([1, 2, 3]),
                      q([0] * m), q([0] * m), q([0] * m), q([0] * m), float("inf"))  # fmt: skip
    return [(s.slot, s.calls, s.gpu) for s in store.snapshot().stats]


@needs_c
def test_record_ring_buckets_agree_between_cores_across_the_ns_table() -> None:
    """Whole-nanosecond durations below, at and past the C core's bucket table fall in the
    reference's buckets, value for value."""
    python, c = _ring_durations_run(_core_py), _ring_durations_run(C_CORE)  # type: ignore[arg-type]
    assert [(slot, calls, h.buckets, h.zeros, h.n) for slot, calls, h in python] == [
        (slot, calls, h.buckets, h.zeros, h.n) for slot, calls, h in c
    ]
    assert sum(h.zeros for _, _, h in python) > 0 and python[0][1] == 400
