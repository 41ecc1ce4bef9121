"""One Timer's recorder: its region tree, its store (in the core) and the general path.

The common case of a region (the Timer on, CUDA in use, the default stream, no side streams)
runs entirely in the core's ``RegionBase.__enter__``/``__exit__``. Everything else comes here,
written once for both cores: the Timer off, ``mode="nvtx"``, the host clock, ``every=N``,
side streams and stream or device switches, CUDA graph capture, out-of-order exits and
detached regions (coroutines, backward hooks). It records through the core's primitives
(``Stack``, ``StreamRec``, ``Store.record``), so every sample ends in the one store.

``Recorder.summary`` turns a store snapshot into frozen records: per report, never per region.
The boundary sources (compile marks, graph captures, backward rows, sync counts) each keep
this recorder's state of theirs in one object of ``Recorder.sources``, which the summary and
``reset()`` loop over (``sources._source.Source``).
"""

from __future__ import annotations

import math
import os
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any, Protocol

import torch

from ..core import _core, _device
from ..core._locks import claim, fork_safe_lock
from ..records._hist import Histogram
from ..records._records import RegionStats, Summary
from ..records._values import EMPTY
from ..sources import _backward, _capture, _compile, _flops, _memory, _sync_counts
from ..sources._source import Source
from . import _steps
from ._values import ValueStore
from ._view import Tree, View


class Region(Protocol):
    """What the general path reads of a region (``_timer.Region`` has it all)."""

    name: str
    nvtx: bool
    attrs: Any
    domain: Any
    timing: bool
    events: bool
    streams: tuple[tuple[tuple[int, int, int], Any], ...]
    counter: Any
    every: int
    warned: int
    compiled: bool

    def open_at(self, slot: int, gen: int) -> Any:
        """The core's common case of a detached call (``_core.RegionBase.open_at``)."""

    def close(self, frame: Any) -> bool:
        """The core's common case of its end (``_core.RegionBase.close``)."""


_NAN = math.nan
_now = _core.now_ns
_TIMED, _HOST, _SKIP, _OFF, _NVTX, _UNTIMED, _ORPHAN, _GRAPH = (
    _core.TIMED,
    _core.HOST,
    _core.SKIP,
    _core.OFF,
    _core.NVTX,
    _core.UNTIMED,
    _core.ORPHAN,
    _core.GRAPH,
)
# Dynamo folds it to True while it traces: a region reached inside traced code does nothing
# (Dynamo would trace into thread-locals and event objects and crash or lose them; torch 2.11).
_is_compiling: Callable[[], bool] = getattr(
    getattr(torch, "compiler", None), "is_compiling", lambda: False
)

# Region.warned bits: each kind of warning once per region.
W_STREAM = 1
W_DEVICE = 2
W_SIDE_DEVICE = 4

# The package's folder (this file is in its recorder/ folder): frames of every cudatimer file.
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def clock_name(dev: int) -> str:
    return "host" if dev < 0 else f"cuda:{dev}"


def user_stacklevel() -> int:
    """The ``stacklevel`` of warnings.warn that points at the first frame outside cudatimer
    (the C and Python hooks put a different number of frames in between)."""
    frame = sys._getframe(1)
    level = 1
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame = frame.f_back  # type: ignore[assignment]
        level += 1
    return level


class Recorder:
    """The general path and the store of one Timer."""

    def __init__(self, keep_steps: int, trace_samples: int) -> None:
        self.tree = Tree()
        self.store = _core.Store(keep_steps, trace_samples, _steps.STEP_SAMPLE_CAP, self.tree.child)
        # Taken by reset() and by the sources' rare, brief sections (a sync counted) that must
        # not straddle it.
        self.lock = fork_safe_lock()
        # The boundary sources, each holding this recorder's state of it.
        self.compiled = _compile.CompileNotes()
        self.graphs = _capture.Graphs(self)
        self.backward = _backward.BackwardRows(self)
        self.syncs = _sync_counts.SyncCounts(self)
        self.memory = _memory.MemoryCalls(self)
        self.flops = _flops.FlopCalls(self)
        self.sources: tuple[Source, ...] = (
            self.compiled,
            self.graphs,
            self.backward,
            self.syncs,
            self.memory,
            self.flops,
        )
        #: Per-call values other than time (FLOPs, memory), by value column.
        self.values = ValueStore(self.store, self.lock, keep_steps)

    def _slot(self, stack: Any, top: Any, name: str) -> int:
        """The slot of ``name`` under the top of ``stack``. A frame pushed on this thread while
        another thread's reset() pruned the tree may carry a forgotten slot: the frames are
        then named again from their regions' names, bottom up, so paths stay whole."""
        tree = self.tree
        try:
            return tree.child(top.slot if top is not None else stack.base, name)
        except KeyError:
            pass
        while True:  # a reset() between two of these calls forgets a slot just made: again
            try:
                parent = stack.base if tree.knows(stack.base) else -1
                for f in stack.frames():
                    if not tree.knows(f.slot):
                        f.slot = tree.child(parent, f.region.name)
                    parent = f.slot
                return tree.child(parent, name)
            except KeyError:
                continue

    # -- the general hooks (RegionBase calls them for everything but the common case) --------
    def enter(self, r: Region) -> None:
        if _is_compiling():
            return
        store = self.store
        stack = store.stack()
        top = _live_top(stack)
        gen = store.gen  # before the slot (see reset)
        slot = self._slot(stack, top, r.name)
        if not store.enabled:
            stack.push(_core.Frame(r, slot, gen, _OFF))
            return
        depth = len(stack)
        if r.nvtx:
            try:  # a C call: an exception from it (run as it returned) came after the push
                r.domain.push(r.attrs)
            except BaseException:
                r.domain.pop()
                raise
        try:
            if not r.timing:
                stack.push(_core.Frame(r, slot, gen, _NVTX))
                return
            if r.events and _device.usable():
                rec = _device.current_rec()
                if rec is None:  # capturing a CUDA graph: timestamps in the graph
                    stack.push(self.graphs.frame(r, stack, slot, gen, None))
                    return
                start = rec.take()
                stack.push(_core.Frame(r, slot, gen, _TIMED, rec, start, _now()))
                return
            stack.push(_core.Frame(r, slot, gen, _HOST, t0_ns=_now()))
        except BaseException:
            # Raised before the frame was on the stack (a KeyboardInterrupt as a call here
            # returned, say): its range goes here; one pushed goes with the frame (the core).
            if r.nvtx and len(stack) == depth:
                r.domain.pop()
            raise

    def enter_sampled(self, r: Region) -> None:
        """Enter hook of ``every=N`` regions: time call 0, N, 2N...; count the others."""
        if _is_compiling():
            return
        if next(r.counter) % r.every == 0:
            self.enter(r)
            return
        store = self.store
        stack = store.stack()
        top = _live_top(stack)
        gen = store.gen
        slot = self._slot(stack, top, r.name)
        if not store.enabled:
            stack.push(_core.Frame(r, slot, gen, _OFF))
            return
        # A frame like any other (inner regions nest under it), without events or host time.
        dev = _device.clock_now(r.events)
        depth = len(stack)
        if r.nvtx:
            try:  # a C call: an exception from it (run as it returned) came after the push
                r.domain.push(r.attrs)
            except BaseException:
                r.domain.pop()
                raise
        try:
            stack.push(_core.Frame(r, slot, gen, _UNTIMED, dev=dev))
        except BaseException:  # (as in enter)
            if r.nvtx and len(stack) == depth:
                r.domain.pop()
            raise

    def exit_block(self, r: Region, exc_type: type[BaseException] | None) -> None:
        """The core's general exit hook: ``exit`` with the block's exception type."""
        self.exit(r, exc_type is None, exc_type)

    def exit(self, r: Region, clean: bool, exc_type: type[BaseException] | None = None) -> None:
        if _is_compiling():
            return
        t1 = _now()
        stack = self.store.stack()
        top = _live_top(stack)
        # A generator suspended inside the region and closed on another thread (the garbage
        # collector's): GeneratorExit arrives here. The frame's own thread drops it (and pops
        # its NVTX range) the next time it enters or exits a region.
        if (
            (top is None or (top.region is not r and not _has_frame(stack, r)))
            and exc_type is not None
            and issubclass(exc_type, GeneratorExit)
            and self.store.orphan(r)
        ):
            return
        if top is None:
            raise RuntimeError(
                f"cudatimer: region {r.name!r} exited on a thread where no region is open "
                "(was __exit__ called twice, or from another thread than __enter__?)"
            )
        if top.region is not r and top.region.compiled and _has_frame(stack, r):
            # Compiled code that raised between a region's two marks (a kernel error inside a
            # torch.compile'd call) never ran the exit mark. Nothing else can leave a compiled
            # region open under an eager one that closes: those frames close here, now.
            while top is not None and top.region is not r and top.region.compiled:
                self._close(stack, top, t1)
                top = stack.top()
        if top is not None and top.region is r:
            self._close(stack, top, t1)
            return
        if exc_type is not None:
            self._close_interrupted(stack, r, t1)
            top = stack.top()
            if top is not None and top.region is r:
                self._close(stack, top, t1)
                return
        frame = next((f for f in reversed(stack.frames()) if f.region is r), None)
        if frame is None:
            names = ", ".join(f.region.name for f in stack.frames())
            raise RuntimeError(
                f"cudatimer: region {r.name!r} exited on this thread without having been "
                f"entered here (open regions: {names})"
            )
        self._close(stack, frame, t1)
        if clean:
            raise RuntimeError(
                f"cudatimer: region {r.name!r} was closed while a region opened inside it "
                f"({top.region.name!r}) is still open; close regions in reverse order. "
                "Both are still recorded."
            )

    def _close_interrupted(self, stack: Any, r: Region, t1: int) -> None:
        """Close the frames above ``r``'s whose own ``__exit__`` the exception passing
        through interrupted before it could do anything: a KeyboardInterrupt that a signal
        handler raised on the first instruction of a Python-level ``__exit__`` (where CPython
        checks for signals) reaches the enclosing region's exit with the inner frame still
        open. The traceback names them: each is a call of a region's ``__exit__``."""
        exc = sys.exc_info()[1]
        tb = exc.__traceback__ if exc is not None else None
        cut: list[Any] = []
        while tb is not None:
            code = tb.tb_frame.f_code
            if code.co_name == "__exit__":
                q = tb.tb_frame.f_locals.get("self")
                if q is not None and q is not r and isinstance(q, _core.RegionBase):
                    cut.append(q)
            tb = tb.tb_next
        if not cut:
            return
        frames = stack.frames()
        below = next((i for i in range(len(frames) - 1, -1, -1) if frames[i].region is r), -1)
        for q in cut:
            for i in range(len(frames) - 1, below, -1):
                if frames[i].region is q:
                    self._close(stack, frames[i], t1)
                    break

    def _close(self, stack: Any, frame: Any, t1: int) -> None:
        """Take ``frame`` off ``stack`` and record it. An exception raised as the removal
        returned (a KeyboardInterrupt run then) still records it and pops its NVTX range:
        a frame off the stack with its range open is the one state nothing else repairs
        (the core's repair closes frames that are still on the stack)."""
        n = len(stack)
        try:
            if stack.top() is frame:
                stack.pop()
            else:
                stack.take(frame.region)
        finally:
            if len(stack) < n and frame.kind != _OFF:
                try:  # (the range ends here, not in a call whose first instruction could raise)
                    self._record(frame, t1, stack.tid)
                finally:
                    r = frame.region
                    if r.nvtx:
                        if frame.range_id is None:
                            r.domain.pop()
                        else:
                            r.domain.end(frame.range_id)

    def unwind(self, stack: Any, depth: int, r: Region) -> None:
        """After a Python-level enter of ``r`` raised (a KeyboardInterrupt from a signal
        handler, raised as a call inside it returned): the frame it pushed, if any (the stack
        deeper than ``depth`` with ``r`` on top), goes with its NVTX range, as if the call
        never ran. The general hooks' own repair does this for the core's enter."""
        if len(stack) <= depth:
            return
        top = stack.top()
        if top is None or top.region is not r:
            return
        f = stack.pop()
        if f.rec is not None and f.start is not None and f.kind == _TIMED:
            f.rec.give(f.start)
        if r.nvtx and f.kind != _OFF and f.range_id is None:
            r.domain.pop()

    def begin(self, r: Region) -> Any:
        """Open a detached region (async functions, backward hooks): not on the thread's
        stack, an NVTX start/end range instead of push/pop; its parent is the region open on
        this thread now. Returns the token ``end`` takes (None: nothing to close)."""
        store = self.store
        if _is_compiling() or not store.enabled:
            return None
        stack = store.stack()
        top = stack.top()
        gen = store.gen  # before the slot (see reset)
        return self.detached(r, stack, self._slot(stack, top, r.name), gen)

    def detached(self, r: Region, stack: Any, slot: int, gen: int) -> Any:
        """The frame of a detached region at ``slot`` (``begin``, and backward rows at their
        fixed paths through ``BackwardRows.begin_at``)."""
        # The common case in one core call; the general path below for the rest. Backward
        # rows open and close here inside autograd's pass: on the H200 machine's GPT-2 step
        # (67 hooks a step, benchmarks/backward_cost.py) the step read 0.95x of what it read
        # through the general path (1.197x against 1.237x the plain step, 12 rounds).
        frame = r.open_at(slot, gen)
        if frame is not None:
            return frame
        rid = r.domain.start(r.attrs) if r.nvtx else None
        if not r.timing:
            return _core.Frame(r, slot, gen, _NVTX, range_id=rid)
        if r.counter is not None and next(r.counter) % r.every:
            dev = _device.clock_now(r.events)
            return _core.Frame(r, slot, gen, _UNTIMED, dev=dev, range_id=rid)
        if r.events and _device.usable():
            rec = _device.current_rec()
            if rec is None:
                return self.graphs.frame(r, stack, slot, gen, rid)
            return _core.Frame(r, slot, gen, _TIMED, rec, rec.take(), _now(), range_id=rid)
        return _core.Frame(r, slot, gen, _HOST, t0_ns=_now(), range_id=rid)

    def end(self, r: Region, token: Any) -> None:
        if token is not None and not r.close(token):
            self._finish(token, _now(), self.store.stack().tid)

    def _finish(self, f: Any, t1: int, tid: int) -> None:
        if f.kind == _OFF:
            return
        try:
            self._record(f, t1, tid)
        finally:
            r = f.region
            if r.nvtx:
                if f.range_id is None:
                    r.domain.pop()
                else:
                    r.domain.end(f.range_id)

    def _record(self, f: Any, t1: int, tid: int) -> None:
        """The sample of a closed frame (its NVTX range is ended by the caller)."""
        r = f.region
        kind = f.kind
        if kind == _OFF:
            return
        if kind == _TIMED:
            rec = f.rec
            # One stream read (0.14 us) tells whether the region still runs on the stream
            # and device it started on; side streams and switches take the slower branch.
            if r.streams or _device.current_key() != rec.key:
                self._finish_streams(r, f, t1, tid)
                return
            end = rec.take()
            step = self.store.step
            rec.push(self.store, f.slot, f.gen, f.start, end, (), f.t0_ns, t1, step, tid)
        elif kind in (_HOST, _SKIP):
            self.store.record(
                f.slot,
                f.gen,
                -1,
                _NAN,
                (t1 - f.t0_ns) * 1e-6,
                self.store.step,
                f.t0_ns,
                tid,
                _NAN,
                0,
                kind == _SKIP,
            )
        elif kind == _UNTIMED:
            self.store.count(f.slot, f.gen, f.dev)
        elif kind == _GRAPH:
            f.start.capture.close(f.start)

    def _finish_streams(self, r: Region, f: Any, t1: int, tid: int) -> None:
        """Exit of a region with side streams, or whose current stream or device changed.

        The end event on the start stream is always recorded (valid whatever the current
        device). Each other stream of the start device gets its own end event; the sample's GPU
        time runs to the latest of them. No stream waits on another: only events are recorded.
        """
        rec = f.rec
        # torch's record: the current device may have changed, and torch's record switches
        # to the event's device first.
        end = rec.take(True)
        extra: list[Any] = []
        covered = {rec.key}
        key = _device.current_key()
        if key != rec.key:
            if key[1] != rec.device:
                _warn(
                    r,
                    W_DEVICE,
                    f"cudatimer: region {r.name!r} started on cuda:{rec.device} and ended on "
                    f"cuda:{key[1]} (the current device changed inside it); its GPU time covers "
                    f"cuda:{rec.device} only. Open a region inside the device switch to time "
                    "work on the other device.",
                )
            elif not _device.capturing(key):
                ev = rec.take(True)
                ev.record(_device.rec_for(key).stream)
                extra.append(ev)
                covered.add(key)
                _warn(
                    r,
                    W_STREAM,
                    f"cudatimer: region {r.name!r} ended on another CUDA stream than it started "
                    "on (the current stream changed inside it and was not restored); its GPU "
                    "time runs from its start to the later of its ends on both streams. Switch "
                    "streams with `with torch.cuda.stream(s):` inside the region, or pass "
                    "streams=[...] to cover side streams.",
                )
        for skey, stream in r.streams:
            if skey in covered:
                continue
            if skey[1] != rec.device:
                _warn(
                    r,
                    W_SIDE_DEVICE,
                    f"cudatimer: region {r.name!r} ran on cuda:{rec.device}, but one of its "
                    f"streams= is on cuda:{skey[1]}; events of two devices cannot be compared, "
                    "so that stream is not covered.",
                )
                continue
            ev = rec.take(True)
            ev.record(stream)  # re-recorded on the side stream: a record overwrites
            extra.append(ev)
            covered.add(skey)
        step = self.store.step
        rec.push(self.store, f.slot, f.gen, f.start, end, tuple(extra), f.t0_ns, t1, step, tid)

    def live_top(self, stack: Any) -> Any:
        """The innermost live frame of ``stack`` (the sources' ``Host``)."""
        return _live_top(stack)

    def bury(self, grave: list[Any]) -> None:
        """In a forked child: regions open on this thread at the fork close on the host clock
        (their start events belong to the parent)."""
        self.store.stack().bury(grave)

    def open_regions(self) -> list[tuple[int, tuple[tuple[str, int], ...]]]:
        """The regions of this Timer open now: one ``(thread id, ((path, t0_ns), ...))`` per
        thread (or asyncio task) with any, outermost first. ``t0_ns`` is when the call
        began on the host clock (``_core.now_ns``), 0 where the call keeps no start time (the
        Timer off, ``mode="nvtx"``, an untimed ``every=N`` call). Reads the stacks only: no
        result changes and nothing waits for the GPU, so any thread may call it (the live
        view does, from its own thread, while the others record)."""
        out: list[tuple[int, tuple[tuple[str, int], ...]]] = []
        current, tid_of = -1, 0
        frames: list[tuple[str, int]] = []
        tree = self.tree
        for stack, tid, slot, _kind, t0_ns in self.store.open_frames():
            if stack != current:
                if frames:
                    out.append((tid_of, tuple(frames)))
                current, tid_of, frames = stack, tid, []
            try:
                frames.append((tree.path(slot), t0_ns))
            except KeyError:  # forgotten by a reset() racing with this read: left out
                continue
        if frames:
            out.append((tid_of, tuple(frames)))
        return out

    # -- switches --------------------------------------------------------------------------
    def reset(self) -> None:
        """Forget every result and note, the sources' included, and the region paths no open
        region uses. The tree is pruned before the store's generation moves on, so every slot
        taken under the new generation (a region's cached slot is checked against it) is in
        the pruned tree."""
        with claim(self.lock, "the Timer's results (Timer.reset)"):
            self.tree.prune(self.store.open_slots())
            self.store.reset()
            for source in self.sources:
                source.reset()
            self.values.reset()

    # -- reading ---------------------------------------------------------------------------
    def summary(
        self,
        meta: tuple[tuple[str, str], ...],
        timeout_s: float,
        window_args: dict[str, Any],
        step_stats: bool,
        trace: bool,
    ) -> Summary:
        """Resolve every finished sample and return frozen records (never clears anything)."""
        store = self.store
        _steps.select(store.step, None, store.keep_steps, **window_args)  # bad input fails early
        deadline = time.monotonic() + timeout_s
        _device.drain(timeout_s)
        for source in self.sources:
            source.drain(max(0.0, deadline - time.monotonic()))
        current = store.step
        slot_syncs, sync_sites = self.syncs.read()
        run_values, step_values = self.values.read()
        windowed = any(v not in (None, 0) for v in window_args.values())
        snap = store.snapshot(series=windowed or step_stats, trace=trace)
        view = View(self.tree, snap, slot_syncs, run_values, step_values)
        oldest = snap.kept[0] if snap.kept and len(snap.kept) >= store.keep_steps else None
        window = _steps.select(
            current, oldest, store.keep_steps, dropped=snap.dropped, **window_args
        )
        regions = _steps.window_regions(view, window) if window is not None else self._regions(view)
        per_step = _steps.step_stats(view, window) if step_stats else ()
        samples = _steps.trace_samples(view, window) if trace else ()
        if window is not None:
            meta += _steps.window_meta(window)
        for source in self.sources:
            meta += source.notes()
        return Summary(
            regions=regions,
            sync_sites=sync_sites,
            pending=store.pending() + sum(source.pending() for source in self.sources),
            open=len(store.stack()),
            steps=current if window is None else len(window),
            meta=meta,
            step_stats=per_step,
            trace=samples,
        )

    @staticmethod
    def _regions(view: View) -> tuple[RegionStats, ...]:
        tree = view.tree
        seen: set[int] = set()
        rows = []
        for s in view.stats:
            first = s.slot not in seen
            seen.add(s.slot)
            rows.append(
                RegionStats(
                    name=tree.path(s.slot),
                    clock=clock_name(s.dev),
                    calls=s.calls,
                    gpu=Histogram(*s.gpu) if s.dev >= 0 else None,
                    cpu=Histogram(*s.cpu),
                    skipped=s.skipped,
                    depth=tree.depth(s.slot),
                    syncs=view.syncs.get(s.slot, 0) if first else 0,
                    values=view.values.get((s.slot, s.dev), EMPTY),
                )
            )
        return tuple(rows)


def _live_top(stack: Any) -> Any:
    """The innermost frame after dropping the frames other threads closed (ORPHAN): their
    events go back to the pool and their NVTX ranges are popped here, on their own thread."""
    top = stack.top()
    while top is not None and top.kind == _ORPHAN:
        f = stack.pop()
        if f.rec is not None and f.start is not None:
            f.rec.give(f.start)
        if f.region.nvtx and f.range_id is None and f.dev != _OFF:  # dev: its kind before
            f.region.domain.pop()
        top = stack.top()
    return top


def _has_frame(stack: Any, r: Region) -> bool:
    return any(f.region is r for f in stack.frames())


def _warn(r: Region, bit: int, message: str) -> None:
    """Warn once per region and kind, pointing at the line that closed the region."""
    if not r.warned & bit:
        r.warned |= bit
        warnings.warn(message, RuntimeWarning, stacklevel=user_stacklevel())
