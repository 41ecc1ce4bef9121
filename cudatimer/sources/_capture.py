"""Regions inside CUDA graphs: timed on every replay by device timestamps.

While a stream captures a graph (``torch.cuda.graph``, ``make_graphed_callables``, a
``torch.compile(mode="reduce-overhead")`` model), a region's enter and exit each capture a
timestamp kernel (``_stamps``) into the graph, on a branch off the captured stream (0.06-0.09
us of a replay's GPU time each on an H200), and a boundary with nothing captured since the
previous timestamp shares it (an exit followed by the next enter, a parent's enter and its
first child's). At capture end one more node moves the graph's ring on and counts the replay.

The host counts replays too (``torch.cuda.CUDAGraph.replay`` is wrapped: a dictionary lookup
for graphs that hold no region), so replay ``j``'s timestamps sit at a known place in the ring,
and what the host knew at replay ``j`` (the step, the region open around the replay, the
thread) is kept beside it. No replay adds an event, a query or a copy: every ``cap // n``
replays or so (half the ring) the wrapper starts a copy of the ring on the replays' stream
into pinned memory and goes on; a later replay, or a report, reads it once its event has
passed and folds its samples into the stores (``Store.record_ring``).
A report waits for the replays issued before it (the copy waits on their streams, on the
GPU), polling until its ``timeout_s``.

A captured region keeps the path it had inside the capture, under the region open around
each replay at replay time (``decode/graph/attn`` for a replay inside ``decode``). Its GPU
time is the time between its two timestamps; its CPU time is 0: the host runs nothing of it
at replay (the replay's launch is host time of the region around it). If the ring wraps
before it was read (more replays than it holds, with the copies held back), the lost replays
are counted and the report says so; nothing else is dropped.

NVTX: a range pushed during capture is seen by Nsight Systems at capture time only; a replay
shows as one graph launch with its kernels (``nsys --cuda-graph-trace=node`` shows them).
"""

from __future__ import annotations

import threading
import time
import weakref
from array import array
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from ..core import _core, _device
from ..core._locks import LockStuckError, claim, fork_safe_lock
from ._source import Host

_now = _core.now_ns
_get_ident = threading.get_ident
_GRAPH, _SKIP, _ORPHAN = _core.GRAPH, _core.SKIP, _core.ORPHAN

__all__ = [
    "DEFAULT_CAP",
    "Call",
    "Capture",
    "Graphs",
    "capture_begin",
    "capture_end",
    "current",
    "install",
    "no_capture",
    "replay",
    "timestamps",
]

# Words of one graph's ring (8 bytes each): 262144 hold 1297 replays of a graph with 202
# timestamps, a 2 MiB buffer on the device and as much pinned on the host per copy. Each copy
# costs ~300 us of host time however small (its CUDA calls meet the launches queued before
# them: H200 host, torch 2.11), so the ring is 4x the 65536 words it was: 1.9 us a replay
# less for a graph of 100 regions.
DEFAULT_CAP = 1 << 18
# Copies in flight per graph at most (each holds a pinned buffer of the ring's size).
MAX_COPIES = 8

_lock = fork_safe_lock()
_local = threading.local()  # .capture: the Capture this thread's stream records into
_by_graph: dict[int, Capture] = {}  # id(graph) -> its capture (replays look it up)
_retired: list[Capture] = []  # graphs reset, recaptured or collected with replays unread
cap_words = DEFAULT_CAP  # tests make it small
# Captures begun through torch's CUDAGraph and not ended yet (every thread), counted under
# _quiet: a reader on another thread (cudatimer.live) holds it while it records or queries
# events, so no capture begins meanwhile (see no_capture).
_quiet = fork_safe_lock()  # a reader thread of the parent may hold it at a fork
_open = [0]
# A reader waits this long at most for the capture bookkeeping (a capture beginning holds
# the lock for a few bytecodes): past it, it takes the moment as not quiet.
_QUIET_WAIT_S = 0.5


@dataclass(eq=False)
class Call:
    """One region call captured into a graph: its recorder's ``Graphs``, its path from the
    capture's base, and its two timestamps (``exit`` -1 while it is open)."""

    capture: Capture
    recorder: Graphs
    names: tuple[str, ...]
    enter: int
    exit: int = -1


# Where a run of consecutive replays puts its samples: per recorder of the graph (parent slot,
# generation, step) or None (that Timer was off), then the thread and the stream. Replays note
# one only when it changes (a decode loop launches thousands with the same), and their launch
# times in an array: ~1.5 us of host time a replay in all.
_Where = tuple[tuple[tuple[int, int, int] | None, ...], int, int]


@dataclass(eq=False)
class _Block:
    """Consecutive replays read together under one parent: one ``record_ring`` call."""

    first: int
    parent: int
    gen: int
    cols: tuple[array[int], array[int], array[int]]  # slots, enter, leave
    step: array[int] = field(default_factory=lambda: array("q"))
    tid: array[int] = field(default_factory=lambda: array("q"))
    stream: array[int] = field(default_factory=lambda: array("q"))

    def extends(self, first: int, parent: int, gen: int) -> bool:
        return first == self.first + len(self.step) and (parent, gen) == (self.parent, self.gen)

    def add(self, m: int, step: int, tid: int, stream: int) -> None:
        self.step.extend([step] * m)
        self.tid.extend([tid] * m)
        self.stream.extend([stream] * m)


@dataclass(eq=False)
class Capture:
    """One captured graph with regions in it, and its replays not read yet."""

    device: int
    stamps: Any
    chunk: Any
    cap: int
    n: int = 0
    calls: list[Call] = field(default_factory=list)
    recorders: list[Graphs] = field(default_factory=list)  # of the Timers with calls in it
    position: Any = None
    ended: bool = False
    # Replays: issued (host count), read (the first not read), their host context, lost.
    replays: int = 0
    read: int = 0
    runs: list[tuple[int, _Where]] = field(default_factory=list)  # (first replay, where)
    t0: array[int] = field(default_factory=lambda: array("q"))  # launch ns of replays read..
    per_recorder: list[int] = field(default_factory=list)  # timed calls of each recorder
    half: int = 1  # replays between two copies: half the ring
    copies: deque[Any] = field(default_factory=deque)  # in flight, oldest first
    copy_at: int = 0  # replays launched when the newest copy began
    streams: dict[int, Any] = field(default_factory=dict)  # replay streams, for the report
    # (recorder index, parent slot, generation) -> (slots, enter, leave) of its timed calls
    # (None: no path of it is in the tree): the tree is walked once per parent, not per read.
    columns: dict[tuple[int, int, int], tuple[array[int], array[int], array[int]] | None] = field(
        default_factory=dict
    )
    offset_ns: float = float("inf")  # GPU clock minus host clock, least seen (trace placement)
    lock: Any = field(default_factory=fork_safe_lock)

    # -- capture ------------------------------------------------------------------------
    def boundary(self) -> int:
        """The index of a timestamp taken now on the current stream (shared with the last
        one when nothing was captured since), or -1 when the ring has no room."""
        pos = self.stamps.position()
        if pos is not None and self.n and pos == self.position:
            return self.n - 1
        if self.n >= self.cap:
            return -1
        k = self.n
        self.stamps.stamp(self.chunk, k, self.cap)
        self.n += 1
        self.position = self.stamps.position()
        return k

    def open(self, recorder: Graphs, names: tuple[str, ...]) -> Call | None:
        k = self.boundary()
        if k < 0:
            recorder.full += 1
            return None
        call = Call(self, recorder, names, k)
        if not any(r is recorder for r in self.recorders):
            self.recorders.append(recorder)
        self.calls.append(call)
        return call

    def close(self, call: Call) -> None:
        if self.ended or current() is not self or not _device.capturing(_device.current_key()):
            return  # closed outside its capture: it has no exit timestamp, left out
        k = self.boundary()
        if k < 0:
            call.recorder.full += 1
            return
        call.exit = k

    # -- replay -------------------------------------------------------------------------
    def per_replay(self) -> int:
        """Replays the ring holds."""
        return self.cap // self.n

    def note_replay(self) -> None:
        """Host side of a replay about to be launched (the wrapper calls it). The lock is
        taken only when the context changes: appends and the count are single operations
        under the GIL, and a reader only ever trims the front."""
        key = _device.current_key()
        recs = self.recorders
        context = (
            (recs[0].replay_context(),)
            if len(recs) == 1
            else tuple([r.replay_context() for r in recs])
        )
        where = (context, _get_ident(), key[0])
        runs = self.runs
        if not runs or runs[-1][1] != where:
            with self.lock:
                runs.append((self.replays, where))
                self.streams[key[0]] = key
        self.t0.append(_now())
        self.replays += 1

    def launched(self) -> None:
        """After a replay's launch, every half ring: read the finished copies and start one
        behind it on its stream."""
        with self.lock:
            self.poll(start=True)

    def unnote_replay(self) -> None:
        """The replay just noted raised before it was launched."""
        with self.lock:
            self.replays -= 1
            self.t0.pop()
            if self.runs[-1][0] == self.replays:
                self.runs.pop()

    def poll(self, start: bool, after: list[Any] | None = None) -> bool:
        """Read the finished copies, oldest first; with ``start``, begin a new one (on the
        current stream, behind the replays launched on it; with ``after``, on a side stream
        behind those events). True while a copy is in flight. The caller holds ``lock``."""
        copies = self.copies
        while copies:
            try:
                done = copies[0].done()
            except RuntimeError:  # a stream is capturing: nothing can be read now
                return True
            if not done:
                break
            copy = copies.popleft()
            self._take(copy.words())
            copy.recycle()
        if (
            start
            and self.copy_at < self.replays
            and len(copies) < MAX_COPIES
            and not _device.capturing(_device.current_key())
        ):
            self.copy_at = self.replays
            copies.append(self.stamps.copy(self.chunk, self.cap, after))
        return bool(copies)

    def _take(self, words: Any) -> None:
        """Keep the timestamps of the replays a copy holds whole; count the overwritten ones.
        ``words``: [finished replays before, ring..., after] (an int64 tensor)."""
        before, after = int(words[0]), int(words[-1])
        first_whole = after - self.per_replay() + 1  # a replay in flight may overwrite older
        stop = min(before, self.replays)
        if stop <= self.read:
            return
        lost_end = max(self.read, min(first_whole, stop))
        for a, b, where in self._segments(self.read, lost_end):
            for r_index, w in enumerate(where[0]):
                if w is not None and w[1] == self.recorders[r_index].store.gen:
                    self.recorders[r_index].lost += (b - a) * self.per_recorder[r_index]
        if lost_end < stop:
            self._fold(words, lost_end, stop)
        del self.t0[: stop - self.read]
        self.read = stop
        while len(self.runs) > 1 and self.runs[1][0] <= stop:
            del self.runs[0]

    def _fold(self, words: Any, lo: int, hi: int) -> None:
        """Fold replays [lo, hi) straight from the ring read into the stores: one
        ``Store.record_ring`` per recorder and run of replays under the same parent, and no
        tensor operation. In the C core ~13 ns a region call in a warm loop (the CI's host);
        right after the driver's launches on an H200 host about twice that."""
        ring = _buffer(words[1:-1])
        t0 = self.t0[lo - self.read : hi - self.read]
        segments = self._segments(lo, hi)
        for ri, recorder in enumerate(self.recorders):
            blocks: list[_Block] = []
            for a, b, (where, tid, stream) in segments:
                w = where[ri]
                if w is None:
                    continue  # that Timer was off at those replays
                parent, gen, step = w
                cols = self._columns(ri, recorder, parent, gen)
                if cols is None:
                    continue
                if not blocks or not blocks[-1].extends(a, parent, gen):
                    blocks.append(_Block(a, parent, gen, cols))
                blocks[-1].add(b - a, step, tid, stream)
            for blk in blocks:
                i = blk.first - lo
                self.offset_ns = recorder.store.record_ring(
                    blk.gen, self.device, ring, (blk.first * self.n) % self.cap, self.n,
                    *blk.cols, blk.step, t0[i : i + len(blk.step)], blk.tid, blk.stream,
                    self.offset_ns,
                )  # fmt: skip

    def _columns(
        self, ri: int, recorder: Graphs, parent: int, gen: int
    ) -> tuple[array[int], array[int], array[int]] | None:
        """The slots and timestamp indexes of ``recorder``'s timed calls under ``parent``."""
        key = (ri, parent, gen)
        if key not in self.columns:
            calls = [c for c in self.calls if c.recorder is recorder and c.exit >= 0]
            slots = recorder.slots(parent, [c.names for c in calls])
            keep = [k for k, slot in enumerate(slots) if slot is not None]
            if len(self.columns) > 256:  # parents come and go (reset): keep the map small
                self.columns.clear()
            self.columns[key] = (
                (
                    array("q", [slot for slot in slots if slot is not None]),
                    array("q", [calls[k].enter for k in keep]),
                    array("q", [calls[k].exit for k in keep]),
                )
                if keep
                else None
            )
        return self.columns[key]

    def _segments(self, lo: int, hi: int) -> list[tuple[int, int, _Where]]:
        """The runs' pieces that cover replays [lo, hi)."""
        out = []
        runs = self.runs
        for i, (first, where) in enumerate(runs):
            end = runs[i + 1][0] if i + 1 < len(runs) else self.replays
            a, b = max(first, lo), min(end, hi)
            if a < b:
                out.append((a, b, where))
        return out

    def _calls_of(self, recorder: Graphs) -> int:
        return sum(1 for c in self.calls if c.recorder is recorder and c.exit >= 0)

    def unread(self, recorder: Graphs) -> int:
        """Region calls of ``recorder`` in replays not read yet."""
        for r, calls in zip(self.recorders, self.per_recorder, strict=True):
            if r is recorder:
                return calls * (self.replays - self.read)
        return 0


def _buffer(t: Any) -> Any:
    """A contiguous CPU tensor's bytes, for ``Store.record_ring`` (no copy with numpy)."""
    t = t.contiguous()
    try:
        return t.numpy()
    except (ImportError, RuntimeError):  # torch without numpy
        return bytes(t.untyped_storage())[
            t.storage_offset() * 8 : (t.storage_offset() + t.numel()) * 8
        ]


def current() -> Capture | None:
    """The capture the calling thread's current stream records into (None: not one of ours,
    a capture begun outside ``torch.cuda.CUDAGraph``)."""
    return getattr(_local, "capture", None)


# -- the three moments of a graph (torch's CUDAGraph calls them through ``install``) --------
def capture_begin(graph: Any) -> None:
    """Before a capture begins on the current stream: the ring, allocated now (a capture
    refuses allocations outside its pool), and the timestamp kernels."""
    _local.capture = None
    old = _by_graph.pop(id(graph), None)
    if old is not None:
        _retire(old)
    if not _device.usable():
        return
    dev = _device.current_key()[1]
    stamps = _device.stamps(dev)
    if stamps is None:
        return
    _local.capture = Capture(dev, stamps, stamps.chunk(cap_words), cap_words)


def capture_end(graph: Any) -> None:
    """Before the capture ends: the node that moves the ring on, then the bookkeeping."""
    cap = current()
    _local.capture = None
    if cap is None or cap.n == 0:
        return
    cap.stamps.advance(cap.chunk, cap.n, cap.cap)
    cap.ended = True
    cap.per_recorder = [cap._calls_of(r) for r in cap.recorders]
    cap.half = max(1, cap.per_replay() // 2)
    with _lock:
        _by_graph[id(graph)] = cap
    weakref.finalize(graph, _collected, id(graph), cap)


def capture_failed() -> None:
    """The capture raised: its regions are left out."""
    _local.capture = None


def replay(graph: Any, run: Callable[[Any], Any]) -> Any:
    """Launch a replay of ``graph`` (``run(graph)``), noting it first if regions were
    captured. Runs once per replay: a graph without regions costs one dictionary lookup."""
    cap = _by_graph.get(id(graph))
    if cap is None:
        return run(graph)
    cap.note_replay()
    try:
        out = run(graph)
    except BaseException:
        cap.unnote_replay()
        raise
    if cap.replays - cap.copy_at >= cap.half:
        cap.launched()
    return out


def reset(graph: Any) -> None:
    cap = _by_graph.pop(id(graph), None)
    if cap is not None:
        _retire(cap)


def _collected(key: int, cap: Capture) -> None:
    with _lock:
        if _by_graph.get(key) is cap:
            del _by_graph[key]
    _retire(cap)


def _retire(cap: Capture) -> None:
    if cap.read < cap.replays:
        with _lock:
            _retired.append(cap)


def _all() -> list[Capture]:
    with _lock:
        return list(_by_graph.values()) + list(_retired)


# -- reading ------------------------------------------------------------------------------
def timestamps(graph: Any) -> int:
    """The timestamps a graph's replays write (0: none, or not captured with regions)."""
    cap = _by_graph.get(id(graph))
    return cap.n if cap is not None else 0


# -- one recorder's side ----------------------------------------------------------------
class Graphs:
    """This source's state for one recorder (``Recorder.graphs``): its region calls captured
    into graphs, what their replays lost, and the reading of their replays (``Source``)."""

    __slots__ = ("full", "host", "lost")

    def __init__(self, host: Host) -> None:
        self.host = host
        self.lost = 0  # region calls in replays the ring overwrote before they were read
        self.full = 0  # region calls captured without room in the ring for their timestamps

    @property
    def store(self) -> Any:
        return self.host.store

    # -- capture ------------------------------------------------------------------------
    def frame(self, r: Any, stack: Any, slot: int, gen: int, rid: Any) -> Any:
        """The frame of a region entered while its stream captures a CUDA graph: a timestamp
        in the graph, or, in a capture begun outside torch's ``CUDAGraph`` or without room
        left, host time counted as skipped."""
        cap = current()
        if cap is not None:
            names: tuple[str, ...] = (r.name,)
            inner: list[str] = []
            for f in reversed(stack.frames()):
                if f.kind == _GRAPH and f.start.capture is cap:
                    names = (*f.start.names, *reversed(inner), r.name)
                    break
                inner.append(f.region.name)
            call = cap.open(self, names)
            if call is not None:
                return _core.Frame(r, slot, gen, _GRAPH, start=call, t0_ns=_now(), range_id=rid)
        return _core.Frame(r, slot, gen, _SKIP, t0_ns=_now(), range_id=rid)

    # -- replay -------------------------------------------------------------------------
    def replay_context(self) -> tuple[int, int, int] | None:
        """Where a graph replay launched now puts this Timer's captured regions: (parent
        slot, generation, step), or None while the Timer is off."""
        store = self.host.store
        if not store.enabled:
            return None
        stack = store.stack()
        gen = store.gen  # before the slot (see Recorder.reset)
        top = stack.top()
        if top is not None and top.kind == _ORPHAN:  # rare: not a call per replay
            top = self.host.live_top(stack)
        return (top.slot if top is not None else stack.base, gen, store.step)

    def slots(self, parent: int, paths: list[tuple[str, ...] | None]) -> list[int | None]:
        """The slots of captured regions' paths under ``parent`` (None: no path given, or a
        parent a reset() forgot)."""
        tree = self.host.tree
        out: list[int | None] = []
        for names in paths:
            slot: int | None = None
            if names is not None:
                try:
                    slot = parent
                    for name in names:
                        slot = tree.child(slot, name)
                except KeyError:
                    slot = None
            out.append(slot)
        return out

    # -- Source ---------------------------------------------------------------------------
    def drain(self, timeout_s: float) -> None:
        """Read every replay of the graphs holding this recorder's regions that was issued
        before now, waiting for the GPU (polling) at most ``timeout_s``, and fold them."""
        caps = [c for c in _all() if any(r is self for r in c.recorders)]
        if not caps:
            return
        deadline = time.monotonic() + timeout_s
        busy = []
        for cap in caps:
            # The copy waits, on the GPU, for the replays issued so far on every stream.
            after = [_device.marker(key) for key in cap.streams.values()]
            with cap.lock:
                if cap.poll(True, after):
                    busy.append(cap)
        sleep = 1e-5
        while busy and time.monotonic() < deadline:
            time.sleep(sleep)
            sleep = min(sleep * 2, 1e-3)
            still = []
            for cap in busy:
                with cap.lock:
                    if cap.poll(start=False):
                        still.append(cap)
            busy = still
        with _lock:
            _retired[:] = [c for c in _retired if c.read < c.replays]

    def pending(self) -> int:
        """Region calls of this recorder inside graph replays not read yet."""
        total = 0
        for cap in _all():
            with cap.lock:
                total += cap.unread(self)
        return total

    def notes(self) -> tuple[tuple[str, str], ...]:
        """The report's note on region calls of graphs that could not be timed."""
        notes = []
        if self.lost:
            notes.append(
                f"{self.lost} region call(s) in CUDA graph replays were lost: the graph's "
                f"timestamp ring wrapped before it was read (it holds {cap_words} timestamps "
                "per graph)"
            )
        if self.full:
            notes.append(
                f"{self.full} region call(s) captured into a CUDA graph are not timed: the "
                f"graph has more than {cap_words} region boundaries"
            )
        return (("graph_note", "; ".join(notes)),) if notes else ()

    def reset(self) -> None:
        self.lost = 0
        self.full = 0


@contextmanager
def no_capture() -> Iterator[bool]:
    """``with no_capture() as quiet:``: while the block runs no capture through torch's
    ``CUDAGraph`` begins (one that would waits for the block, which should be brief);
    ``quiet`` is False when one is under way on some thread, and the block must then make no
    CUDA call: in torch's default capture mode ("global") an event query or record from
    another thread ruins the capture. Captures begun outside ``CUDAGraph`` are not seen."""
    try:  # held by this very thread (a signal handler run inside _opened) or stuck:
        lock = claim(_quiet, "CUDA graph captures under way", _QUIET_WAIT_S)
    except LockStuckError:
        yield False  # not a moment for CUDA calls
        return
    with lock:  # (taken by `with` only: see core._locks)
        yield _open[0] == 0


def _opened(n: int) -> None:
    with _quiet:
        _open[0] = max(0, _open[0] + n)


# -- torch's CUDAGraph ------------------------------------------------------------------
_installed = False


def install() -> None:
    """Wrap ``torch.cuda.CUDAGraph``'s capture and replay methods (once, at import). A graph
    that holds no region replays through one dictionary lookup more."""
    global _installed
    import torch

    cls = getattr(getattr(torch, "cuda", None), "CUDAGraph", None)
    if _installed or cls is None:
        return
    names = ("capture_begin", "capture_end", "replay", "reset")
    if not all(callable(getattr(cls, n, None)) for n in names):
        return
    _installed = True
    begin, end, run, clear = (getattr(cls, n) for n in names)

    def capture_begin_(self: Any, *args: Any, **kwargs: Any) -> Any:
        capture_begin(self)
        _opened(1)
        try:
            return begin(self, *args, **kwargs)
        except BaseException:
            _opened(-1)
            capture_failed()
            raise

    def capture_end_(self: Any) -> Any:
        try:
            capture_end(self)
        except BaseException:  # the graph's own end comes first; its regions are left out
            capture_failed()
            try:
                end(self)
            finally:
                _opened(-1)
            raise
        try:
            return end(self)
        finally:
            _opened(-1)

    def replay_(self: Any) -> Any:
        return replay(self, run)

    def reset_(self: Any) -> Any:
        reset(self)
        return clear(self)

    for name, fn in zip(names, (capture_begin_, capture_end_, replay_, reset_), strict=True):
        fn.__name__ = name
        fn.__qualname__ = f"{cls.__qualname__}.{name}"
        fn.__doc__ = getattr(cls, name).__doc__
        fn.__wrapped__ = getattr(cls, name)  # type: ignore[attr-defined]
        setattr(cls, name, fn)
