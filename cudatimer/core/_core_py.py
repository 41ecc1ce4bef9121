"""The recorder core in plain Python: the reference implementation of the contract in
``_core.pyi``, and the fallback where ``_speedups`` (the C implementation) was not built.

Everything done per sample lives behind that contract: the per-thread stack of open regions,
the per-stream event pools and pending samples, the harvest (non-blocking reads of finished
events) and trace placement, the fold into histograms, the per-step series and the trace ring.
Python outside it (``_recorder``) handles what is done per region path or per report: options,
the region tree, windows, records and renderers; it reads a store through ``snapshot``, which
changes nothing.

The tests run the whole CPU suite on this module and on ``_speedups`` and hold the two to the
same results (``tests/test_core_contract.py``). Written for clarity first; its hot path
(``RegionBase.__enter__``/``__exit__``) is kept short because it is also what runs where no C
compiler was present.
"""

from __future__ import annotations

import contextvars
import math
import threading
import time
import weakref
from array import array

# torch imports asyncio already; _get_running_loop is C where _asyncio exists (0.05 us a call),
# current_task is C from Python 3.12 on.
from asyncio import current_task
from asyncio.events import _get_running_loop
from collections import deque
from collections.abc import Callable
from types import TracebackType
from typing import Any, NamedTuple

from ..records._hist import HistBuilder
from ._locks import LockStuckError as _LockStuckError
from ._locks import claim as _claim
from ._locks import fork_safe_lock as _fork_safe_lock

_FOLD = HistBuilder.FOLD

IMPL = "python"

# Frame kinds (what ``Frame.kind`` says the exit must do).
TIMED = 0  # start event recorded on ``rec``'s stream: exit records the end and a pending sample
HOST = 1  # host clock only: exit folds the host time
SKIP = 2  # entered while the stream captured a CUDA graph: host time, counted as skipped
OFF = 3  # the Timer was off at enter: exit pops the frame and nothing else
NVTX = 4  # mode="nvtx": exit pops the NVTX range only
UNTIMED = 5  # every=N, a call not sampled: exit counts it on clock ``dev``
ORPHAN = 6  # closed on another thread (Store.orphan): its own thread drops it when it next can
GRAPH = 7  # entered while its stream captured a CUDA graph: device timestamps, read per replay

# Set by ``configure`` from the one place that defines them (``_device``); see there.
_INV_LOG_GAMMA = 0.0  # the C implementation's bucket rule; HistBuilder has its own here
_HARVEST_BATCH = 256
_ANCHOR_HOP_MS = 100.0
_PREWARM = 0

#: The host clock of every sample (CLOCK_MONOTONIC on Linux, as the C implementation reads).
_now_ns = time.perf_counter_ns  # the hot path calls it directly: no Python frame
_get_ident = threading.get_ident
_NAN = math.nan
_isnan = math.isnan

# One lock for every store and stream of this implementation, taken only by `with` (its C
# __enter__ cannot be split from the block by a KeyboardInterrupt from a signal handler: an
# `if _LOCK.acquire(blocking=False): try:` could, raised as the acquire returned, and every
# later harvest of the process then waited for it). The hot path harvests only when it finds
# the lock free (a harvest that finds it taken is left to the thread holding it; two threads
# that both found it free take turns, one harvest long). Made anew in a forked child: a lock
# held by another thread of the parent at the fork would never be released there.
_LOCK = _fork_safe_lock()


def configure(
    *, inv_log_gamma: float, harvest_batch: int, anchor_hop_ms: float, prewarm: int
) -> None:
    """Set the constants the core works with (``_device`` passes them once, at import)."""
    global _INV_LOG_GAMMA, _HARVEST_BATCH, _ANCHOR_HOP_MS, _PREWARM
    if harvest_batch < 1 or prewarm < 0:
        raise ValueError("harvest_batch must be >= 1 and prewarm >= 0")
    _INV_LOG_GAMMA = float(inv_log_gamma)
    _HARVEST_BATCH = int(harvest_batch)
    _ANCHOR_HOP_MS = float(anchor_hop_ms)
    _PREWARM = int(prewarm)


# -- the current stream -------------------------------------------------------------------------
_getter: Callable[[int], tuple[int, int, int]] | None = None
_usable = False


def set_stream_getter(getter: Callable[[int], tuple[int, int, int]] | None, c10: bool) -> None:
    """The function that returns the current stream's key (stream id, device, device type) for
    a device index (-1: the current device); None: no CUDA. ``c10`` only matters in C."""
    global _getter
    _getter = getter


def set_usable(on: bool, /) -> None:
    """Whether CUDA is in use: the hot path records events only then."""
    global _usable
    _usable = bool(on)


def now_ns() -> int:
    """The host clock of every sample, in ns (``time.perf_counter_ns``: CLOCK_MONOTONIC on
    Linux, as the C core reads it). A function of its own, not the builtin itself, so that it
    has the contract's signature (the builtin has none to read); ~30 ns more a call on this
    core's general path, none on its hot path (which calls the builtin)."""
    return _now_ns()


def runtime_bound() -> bool:
    """True when events are recorded through the CUDA runtime directly (never here)."""
    return False


# -- frames and stacks --------------------------------------------------------------------------
class Frame:
    """One open region call on a thread's stack (or a detached one: ``range_id`` set).

    The hot path's exit queues the frame itself as the pending sample (``_end``, ``_extra``,
    ``_t1``, ``_step``, ``_tid`` and ``_store`` set then): one object per region instead of
    two, ~0.45 us less per region in Python. Those fields are private: the C core's frames
    have none of them."""

    __slots__ = (
        "_end",
        "_extra",
        "_step",
        "_store",
        "_t1",
        "_tid",
        "dev",
        "gen",
        "kind",
        "range_id",
        "rec",
        "region",
        "slot",
        "start",
        "t0_ns",
    )

    def __init__(
        self,
        region: Any,
        slot: int,
        gen: int,
        kind: int,
        rec: StreamRec | None = None,
        start: Any = None,
        t0_ns: int = 0,
        dev: int = -1,
        range_id: Any = None,
    ) -> None:
        self.region = region
        self.slot = slot
        self.gen = gen
        self.kind = kind
        self.rec = rec
        self.start = start
        self.t0_ns = t0_ns
        self.dev = dev
        self.range_id = range_id

    def __repr__(self) -> str:
        return f"Frame({getattr(self.region, 'name', self.region)!r}, kind={self.kind})"


class Stack(list):  # type: ignore[type-arg]
    """A thread's (or an asyncio task's) open regions, innermost last; ``tid`` is the owning
    thread's id, ``base`` the slot regions nest under when it is empty (-1: the root; a task's
    stack starts under the region open where the task first opened one), ``_owner`` its task.

    A list, so that the hot path indexes, appends and deletes at C speed; the list's own
    methods are no part of the contract (the C core's Stack has only the stub's)."""

    __slots__ = ("__weakref__", "_owner", "base", "tid")

    def __init__(self) -> None:
        super().__init__()
        self.tid = _get_ident()
        self.base = -1
        self._owner: Any = None

    # push and pop with the contract's signatures (list.append names its argument ``object``,
    # list.pop takes an index): ~0.13 us more per push and pop, paid on the general path only;
    # the hot path appends and deletes through the list itself.
    def push(self, frame: Frame, /) -> None:
        self.append(frame)

    def pop(self) -> Frame:  # type: ignore[override]
        """The innermost frame, removed (IndexError when empty)."""
        frame: Frame = list.pop(self)
        return frame

    def top(self) -> Frame | None:
        return self[-1] if self else None

    def take(self, region: Any, /) -> Frame | None:
        """Remove and return the innermost frame of ``region`` (None if it has none)."""
        for i in range(len(self) - 1, -1, -1):
            if self[i].region is region:
                frame: Frame = super().pop(i)
                return frame
        return None

    def frames(self) -> list[Frame]:
        return list(self)

    def bury(self, grave: list[Any], /) -> None:
        """In a forked child: frames timed with events of the parent become host frames;
        their events go into ``grave`` (never released)."""
        for frame in self:
            if frame.kind == TIMED:
                grave.append(frame.start)
                frame.kind, frame.rec, frame.start = HOST, None, None


class _Local(threading.local):
    def __init__(self, stacks: list[weakref.ref[Stack]]) -> None:
        self.stack = Stack()
        # The store finds every thread's stack (orphan()); gone threads' refs are dropped.
        stacks[:] = [ref for ref in stacks if ref() is not None]
        stacks.append(weakref.ref(self.stack))


# -- samples and stream records -----------------------------------------------------------------
class _Pending:
    """A region call whose events the GPU may not have reached yet (queued by ``push``; the
    hot path queues its Frame, which has the same fields)."""

    __slots__ = (
        "_end",
        "_extra",
        "_step",
        "_store",
        "_t1",
        "_tid",
        "gen",
        "slot",
        "start",
        "t0_ns",
    )

    def __init__(
        self,
        store: Store,
        slot: int,
        gen: int,
        start: Any,
        end: Any,
        extra: tuple[Any, ...],
        t0: int,
        t1: int,
        step: int,
        tid: int,
    ) -> None:
        self._store = store
        self.slot = slot
        self.gen = gen
        self.start = start
        self._end = end
        self._extra = extra
        self.t0_ns = t0
        self._t1 = t1
        self._step = step
        self._tid = tid


def _done(s: Any) -> bool:
    """Whether every end event of a pending sample is complete (never blocks)."""
    if not s._end.query():
        return False
    return not s._extra or all(e.query() for e in s._extra)


class StreamRec:
    """A stream some region ran on: its event pool, its pending samples, and the reference
    and anchor events that place GPU starts on the host clock for the trace."""

    __slots__ = (
        "_anchor",
        "_check_at",
        "_make_event",
        "_pending",
        "_pool",
        "_ref",
        "anchor_ms",
        "device",
        "key",
        "ref_ns",
        "stream",
    )

    def __init__(
        self,
        key: tuple[int, int, int],
        stream: Any,
        raw: int | None,
        make_event: Callable[[], Any],
    ) -> None:
        self.key = key
        self.device = key[1]
        self.stream = stream
        self._make_event = make_event
        self._pool: list[Any] = []
        self._pending: deque[Any] = deque()  # _Pending, or Frames queued by the hot path
        self._check_at = _HARVEST_BATCH
        # GPU starts are read against this reference, recorded now at host time ref_ns.
        self._ref = make_event()
        self._ref.record(stream)
        self.ref_ns = _now_ns()
        self._anchor: Any = self._ref
        self.anchor_ms = 0.0
        for _ in range(_PREWARM):
            ev = make_event()
            ev.record(stream)
            self._pool.append(ev)

    def take(self, torch_record: bool = False) -> Any:
        """A pooled event recorded on this stream now (torch's record either way here)."""
        pool = self._pool
        ev = pool.pop() if pool else self._make_event()
        ev.record(self.stream)
        return ev

    def give(self, event: Any, /) -> None:
        self._pool.append(event)

    @property
    def pooled(self) -> int:
        return len(self._pool)

    @property
    def pending(self) -> int:
        return len(self._pending)

    @property
    def anchor_is_ref(self) -> bool:
        return self._anchor is self._ref

    def push(
        self,
        store: Store,
        slot: int,
        gen: int,
        start: Any,
        end: Any,
        extra: tuple[Any, ...],
        t0: int,
        t1: int,
        step: int,
        tid: int,
    ) -> None:
        """Queue a sample whose end events are recorded; every HARVEST_BATCH samples, try a
        harvest (skipped when another thread holds the lock: it catches up)."""
        pend = self._pending
        pend.append(_Pending(store, slot, gen, start, end, extra, t0, t1, step, tid))
        if len(pend) >= self._check_at and not _LOCK.locked():
            with _LOCK:  # (see _LOCK)
                self._harvest()

    def harvest(self) -> None:
        """Resolve every finished sample, never blocking on the GPU."""
        with _LOCK:
            self._harvest()

    def _ready(self) -> int:
        pend = self._pending
        n = len(pend)
        if not n or _done(pend[-1]):
            return n
        # Events on one stream complete in record order: binary-search the first unfinished
        # sample (log2(n) queries instead of one per sample).
        lo, hi = 0, n - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if _done(pend[mid]):
                lo = mid + 1
            else:
                hi = mid
        return lo

    def _harvest(self) -> None:
        """Resolve and fold the finished samples, in order (the lock held). The common case
        (one end event, placement for the trace) is written out: in the launch-bound loop each
        Python call saved here is ~0.1 us per region."""
        pend = self._pending
        pool = self._pool
        dev, stream = self.device, self.key[0]
        for _ in range(self._ready()):
            s = pend.popleft()
            if s._extra:
                if not self._resolve(s):
                    break
                continue
            start = s.start
            try:
                gpu_ms = start.elapsed_time(s._end)
            except (RuntimeError, ValueError):  # two threads appended out of record order
                pend.appendleft(s)
                break
            store = s._store
            at_ns = _NAN
            if store._trace_samples and s.gen == store._gen:
                at_ns, start = self._place(start)
            if start is not None:
                pool.append(start)
            pool.append(s._end)
            t0 = s.t0_ns
            store._fold(
                s.slot,
                s.gen,
                dev,
                gpu_ms,
                (s._t1 - t0) * 1e-6,
                s._step,
                t0,
                s._tid,
                at_ns,
                stream,
                False,
            )
        self._check_at = len(pend) + _HARVEST_BATCH

    def _resolve(self, s: Any) -> bool:
        """Fold one finished sample with side-stream ends; False (put back first in line) when
        its events cannot be read yet."""
        try:
            if not _done(s):  # side-stream ends finish in no particular order
                raise RuntimeError("a side stream is still running")
            gpu_ms = max(s.start.elapsed_time(e) for e in (s._end, *s._extra))
        except (RuntimeError, ValueError):
            self._pending.appendleft(s)
            return False
        store = s._store
        start: Any = s.start
        at_ns = _NAN
        if store._trace_samples and s.gen == store.gen:
            at_ns, start = self._place(start)
        pool = self._pool
        if start is not None:
            pool.append(start)
        pool.append(s._end)
        pool.extend(s._extra)
        store._fold(
            s.slot,
            s.gen,
            self.device,
            gpu_ms,
            (s._t1 - s.t0_ns) * 1e-6,
            s._step,
            s.t0_ns,
            s._tid,
            at_ns,
            self.key[0],
            False,
        )
        return True

    def _place(self, start: Any) -> tuple[float, Any]:
        """Where the finished ``start`` happened on the host clock (ns; NaN if unreadable),
        and the event to give back to the pool in its stead.

        One elapsed read against the anchor (0.24 us on an H200), so the sample's events go
        back to the pool at once: keeping them in the trace ring instead (2 x 4096 events)
        made every record cycle through thousands of distinct CUDA events, and in the
        launch-bound loop 512 distinct events cost 1.19-1.20x what re-recording two does.
        ``elapsed_time`` is float32 ms, good to ~4 ns within 100 ms: past ANCHOR_HOP_MS
        ``start`` becomes the anchor and positions add up in double (microseconds over hours).
        """
        try:
            off = self._anchor.elapsed_time(start)
        except (RuntimeError, ValueError):
            return _NAN, start
        at_ms = self.anchor_ms + off
        if off > _ANCHOR_HOP_MS:
            old = self._anchor
            self._anchor, self.anchor_ms = start, at_ms
            start = None if old is self._ref else old
        return self.ref_ns + at_ms * 1e6, start


# -- the registry of streams (process-wide) -----------------------------------------------------
_streams: dict[tuple[int, int, int], StreamRec] = {}
_defaults: dict[int, StreamRec] = {}  # the default stream's record per device: the hot path's


def stream_of(key: tuple[int, int, int], /) -> StreamRec | None:
    return _streams.get(key)


def new_stream(
    key: tuple[int, int, int], stream: Any, raw: int | None, make_event: Callable[[], Any], /
) -> StreamRec:
    """Make and register the record of a stream (replacing one of the same key)."""
    rec = StreamRec(key, stream, raw, make_event)
    _streams[key] = rec
    if key[0] == 0 and key[2] == 1:
        _defaults[key[1]] = rec
    return rec


def all_streams() -> list[StreamRec]:
    return list(_streams.values())


def forget_streams(grave: list[Any] | None = None) -> None:
    """Drop every stream record, pending samples included; ``grave`` (a forked child) keeps
    every object so that no CUDA event of the parent is ever destroyed."""
    if grave is not None:
        grave.append(dict(_streams))
    _streams.clear()
    _defaults.clear()


def pending_total() -> int:
    return sum(len(rec._pending) for rec in list(_streams.values()))


def clear_pending() -> None:
    """Drop every pending sample without waiting (interpreter exit); leaves them when another
    thread holds the lock for more than 0.5 s (a stuck thread must not hang the exit)."""
    try:
        lock = _claim(_LOCK, "the core's streams (clearing pending samples at exit)", 0.5)
    except _LockStuckError:
        return
    with lock:
        for rec in _streams.values():
            rec._pending.clear()


def drain(timeout_s: float, /) -> int:
    """Wait (polling with a growing pause, never a blocking CUDA call) until the newest pending
    sample of each stream is done or ``timeout_s`` passed, resolve every finished sample, and
    return how many are still pending."""
    deadline = time.monotonic() + timeout_s
    for rec in list(_streams.values()):
        pause = 50e-6
        while True:
            pend = rec._pending
            try:
                newest = pend[-1]
            except IndexError:
                break
            try:
                done = _done(newest) and all(_done(s) for s in list(pend) if s._extra)
            except RuntimeError:  # a stream is capturing: nothing can be read now
                break
            if done or time.monotonic() >= deadline:
                break
            time.sleep(pause)
            pause = min(pause * 2, 2e-3)
    with _LOCK:
        for rec in list(_streams.values()):
            rec._harvest()
    return pending_total()


# -- the store of one Timer ---------------------------------------------------------------------
class HistState(NamedTuple):
    """A distribution as ``_hist.Histogram`` takes it (``Histogram(*state)``)."""

    n: int
    total: float
    min: float
    max: float
    zeros: int
    buckets: tuple[tuple[int, int], ...]


class SlotStats(NamedTuple):
    """Whole-run statistics of one region path (``slot``) on one clock (``dev``, -1: host)."""

    slot: int
    dev: int
    order: int  # when this (slot, dev) was first recorded, among the store's
    calls: int
    skipped: int
    gpu: HistState
    cpu: HistState


class SeriesRow(NamedTuple):
    """Raw samples of one region path on one clock in one kept step (float64 bytes)."""

    step: int
    slot: int
    dev: int
    gpu_ms: bytes
    cpu_ms: bytes


class TraceItem(NamedTuple):
    """One of the last calls, for the trace (NaN ``at_ns``: its GPU start could not be read;
    NaN ``gpu_ms``: a host sample)."""

    slot: int
    dev: int
    stream: int
    at_ns: float
    gpu_ms: float
    t0_ns: int
    cpu_ms: float
    step: int
    tid: int


class Snapshot(NamedTuple):
    """What a store holds, copied out (``Store.snapshot``)."""

    stats: list[SlotStats]
    kept: tuple[int, ...]  # kept steps, oldest first
    dropped: tuple[int, ...]  # kept steps whose raw samples passed the step cap
    series: list[SeriesRow]
    trace: list[TraceItem]


def _state(builder: HistBuilder) -> HistState:
    h = builder.freeze()
    return HistState(h.count, h.total, h.min, h.max, h.zeros, h.buckets)


class _Acc:
    """Statistics of one (slot, clock), and its series in the step it last saw."""

    __slots__ = ("calls", "cpu", "gpu", "order", "series", "series_rec", "series_step", "skipped")

    def __init__(self, order: int) -> None:
        self.order = order
        self.calls = 0
        self.skipped = 0
        # Values are appended raw and folded into buckets 256 at a time (HistBuilder), about
        # 0.1 us a value against 0.35 us for a per-value update in Python.
        self.gpu = HistBuilder()
        self.cpu = HistBuilder()
        # The series of the step this (slot, clock) last saw, while that step is kept and not
        # dropped (``_StepRec.live``): one test per sample instead of two dict lookups.
        self.series_step = -1
        self.series_rec: _StepRec | None = None
        self.series: tuple[array[float], array[float]] | None = None


class _StepRec:
    """The raw samples of one kept step: {(slot, dev): (gpu ms, cpu ms)}."""

    __slots__ = ("count", "dropped", "live", "rows")

    def __init__(self) -> None:
        self.count = 0
        self.dropped = False
        self.live = True  # False once evicted or dropped: cached series must be looked up
        self.rows: dict[tuple[int, int], tuple[array[float], array[float]]] = {}


class Store:
    """Everything one Timer recorded: whole-run statistics per (slot, clock), the raw samples
    of the last ``keep_steps`` steps (at most ``step_cap`` per step), the last
    ``trace_samples`` calls, and the Timer's switches (``enabled``, ``step``, ``gen``).

    ``child(parent_slot, name) -> slot`` names region paths (the region tree lives outside
    the core); -1 is the root.
    """

    def __init__(
        self,
        keep_steps: int,
        trace_samples: int,
        step_cap: int,
        child: Callable[[int, str], int],
    ) -> None:
        if keep_steps < 0 or trace_samples < 0 or step_cap < 1:
            raise ValueError("keep_steps and trace_samples must be >= 0, step_cap >= 1")
        self.enabled = True
        self.step = 0
        self._gen = 0
        # Read-only outside, as in C (properties below); the per-sample code reads these.
        self._keep_steps = keep_steps
        self._trace_samples = trace_samples
        self._step_cap = step_cap
        self._child = child
        self._stacks: list[weakref.ref[Stack]] = []
        self._local = _Local(self._stacks)
        # Each asyncio task's own stack, in its context (a task inherits its creator's
        # context, so a task's first region finds the creator's stack there and nests under it).
        self._task_stack: contextvars.ContextVar[Stack] = contextvars.ContextVar(
            f"cudatimer-stack-{id(self)}"
        )
        self._stats: dict[tuple[int, int], _Acc] = {}
        self._steps: dict[int, _StepRec] = {}  # insertion order: oldest first
        # Plain tuples in TraceItem's field order (a NamedTuple built per sample cost ~0.6 us
        # in Python); named at the boundary, in snapshot().
        self._trace: deque[tuple[Any, ...]] = deque(maxlen=trace_samples)

    @property
    def gen(self) -> int:
        """Bumped by reset(): samples of calls entered before it are dropped."""
        return self._gen

    @property
    def keep_steps(self) -> int:
        return self._keep_steps

    @property
    def trace_samples(self) -> int:
        return self._trace_samples

    @property
    def step_cap(self) -> int:
        """Raw samples kept per step; past it the step's series are dropped."""
        return self._step_cap

    @property
    def child(self) -> Callable[[int, str], int]:
        return self._child

    def stack(self) -> Stack:
        """The calling thread's stack of open regions of this store, or the running asyncio
        task's: concurrent tasks interleave on one thread, each nests its own regions."""
        stack: Stack = self._local.stack
        if _get_running_loop() is None:
            return stack
        task = current_task()
        if task is None:
            return stack
        mine = self._task_stack.get(None)
        if mine is None or mine._owner is not task:
            parent = mine if mine is not None else stack
            top = parent.top()
            mine = Stack()
            mine.base = top.slot if top is not None else parent.base
            mine._owner = task
            self._stacks[:] = [ref for ref in self._stacks if ref() is not None]
            self._stacks.append(weakref.ref(mine))
            self._task_stack.set(mine)
        return mine

    def open_slots(self) -> list[int]:
        """The slots of every frame open on any stack of this store, and the stacks' bases:
        what the region tree must keep when ``reset()`` lets it forget the rest."""
        slots = []
        for ref in list(self._stacks):
            stack = ref()
            if stack is not None:
                slots.append(stack.base)
                slots.extend(frame.slot for frame in list(stack))
        return slots

    def open_frames(self) -> list[tuple[int, int, int, int, int]]:
        """Every frame open on a stack of this store now, as ``(stack, tid, slot, kind,
        t0_ns)``: ``stack`` numbers the stacks of this call, each stack's frames come
        outermost first, ORPHAN frames are left out. Changes nothing; any thread may call it
        (a live view reads the other threads' stacks)."""
        out: list[tuple[int, int, int, int, int]] = []
        number = 0
        for ref in list(self._stacks):
            stack = ref()
            if not stack:
                continue
            frames = list(stack)  # one C-level copy: no other thread runs in between
            out.extend(
                (number, stack.tid, f.slot, f.kind, f.t0_ns) for f in frames if f.kind != ORPHAN
            )
            number += 1
        return out

    def reset(self) -> None:
        with _LOCK:
            self._gen += 1
            self.step = 0
            self._stats = {}
            self._steps = {}
            self._trace = deque(maxlen=self._trace_samples)

    def record(
        self,
        slot: int,
        gen: int,
        dev: int,
        gpu_ms: float,
        cpu_ms: float,
        step: int,
        t0_ns: int,
        tid: int,
        at_ns: float,
        stream: int,
        skipped: bool,
    ) -> None:
        """Fold one finished sample (``gpu_ms`` NaN for host samples)."""
        with _LOCK:
            self._fold(slot, gen, dev, gpu_ms, cpu_ms, step, t0_ns, tid, at_ns, stream, skipped)

    def record_ring(
        self,
        gen: int,
        dev: int,
        ring: Any,
        first: int,
        n: int,
        slots: Any,
        enter: Any,
        leave: Any,
        step: Any,
        t0_ns: Any,
        tid: Any,
        stream: Any,
        offset_ns: float,
    ) -> float:
        """Fold m replays of a CUDA graph read from its timestamp ring: replay ``i``'s ``n``
        timestamps start at word ``(first + i*n) % cap``; column ``j`` is slot ``slots[j]``
        between timestamps ``enter[j]`` and ``leave[j]``. Returns the least GPU-minus-host
        offset (the trace starts are placed with it). CPU time 0."""
        views = [
            memoryview(b).cast("B") for b in (ring, slots, enter, leave, step, t0_ns, tid, stream)
        ]
        cap, c, m = len(views[0]) // 8, len(views[1]) // 8, len(views[4]) // 8
        names = ("ring", "slots", "enter", "leave", "step", "t0_ns", "tid", "stream")
        wants = (None, None, c, c, None, m, m, m)
        for name, view, want in zip(names, views, wants, strict=True):
            if len(view) % 8 or (want is not None and len(view) // 8 != want):
                raise ValueError(
                    f"record_ring: {name} must hold {want if want is not None else -1} "
                    f"8-byte values, got {len(view)} bytes"
                )
        if n < 1 or n > cap or m * n > cap or first < 0 or first >= cap:
            raise ValueError(
                f"record_ring: n ({n}) and first ({first}) must fit {m} replays in a ring of "
                f"{cap} words (1 <= n, m * n <= cap, 0 <= first < cap)"
            )
        rg, sl, en, lv, st, t0, td, sm = (v.cast("q") for v in views)
        for name, col in (("enter", en), ("leave", lv)):
            for j, k in enumerate(col):
                if not 0 <= k < n:
                    raise ValueError(
                        f"record_ring: {name}[{j}] must be a timestamp index in [0, {n}), got {k}"
                    )
        bases = [(first + i * n) % cap for i in range(m)]
        offset = float(offset_ns)
        for i, base in enumerate(bases):
            for k in en:
                offset = min(offset, float(rg[(base + k) % cap] - t0[i]))
        if gen != self._gen or m == 0 or c == 0:
            return offset
        fold = self._fold
        with _LOCK:
            for i, base in enumerate(bases):
                for j in range(c):
                    a, b = rg[(base + en[j]) % cap], rg[(base + lv[j]) % cap]
                    fold(sl[j], gen, dev, (b - a) * 1e-6, 0.0, st[i], t0[i], td[i],
                         a - offset, sm[i], False)  # fmt: skip
        return offset

    def count(self, slot: int, gen: int, dev: int) -> None:
        """Count a call that was not timed (``every=N``)."""
        with _LOCK:
            if gen == self._gen:
                self._acc(slot, dev).calls += 1

    def _acc(self, slot: int, dev: int) -> _Acc:
        acc = self._stats.get((slot, dev))
        if acc is None:
            acc = self._stats[(slot, dev)] = _Acc(len(self._stats))
        return acc

    def _fold(
        self,
        slot: int,
        gen: int,
        dev: int,
        gpu_ms: float,
        cpu_ms: float,
        step: int,
        t0_ns: int,
        tid: int,
        at_ns: float,
        stream: int,
        skipped: bool,
    ) -> None:
        """``record`` with the lock held (the harvest calls it so). HistBuilder's appends and
        the series cache are written out: each Python call saved is ~0.1 us per sample."""
        if gen != self._gen:
            return  # entered before reset(): discarded
        acc = self._stats.get((slot, dev))
        if acc is None:
            acc = self._stats[(slot, dev)] = _Acc(len(self._stats))
        acc.calls += 1
        if gpu_ms == gpu_ms:  # not NaN: a GPU sample
            raw = acc.gpu.raw
            raw.append(gpu_ms)
            if len(raw) >= _FOLD:
                acc.gpu.fold()
        raw = acc.cpu.raw
        raw.append(cpu_ms)
        if len(raw) >= _FOLD:
            acc.cpu.fold()
        if skipped:
            acc.skipped += 1
        if self._keep_steps:
            rec = acc.series_rec
            if acc.series_step == step and rec is not None and rec.live:
                rec.count += 1
                if rec.count > self._step_cap:
                    self._drop(rec)
                else:
                    series = acc.series
                    series[0].append(gpu_ms)  # type: ignore[index]
                    series[1].append(cpu_ms)  # type: ignore[index]
            else:
                self._keep(acc, slot, dev, step, gpu_ms, cpu_ms)
        if self._trace_samples:
            self._trace.append((slot, dev, stream, at_ns, gpu_ms, t0_ns, cpu_ms, step, tid))

    def _keep(self, acc: _Acc, slot: int, dev: int, step: int, gpu: float, cpu: float) -> None:
        """A sample of a step this (slot, clock) has no cached series for."""
        rec = self._steps.get(step)
        if rec is None:
            rec = self._steps[step] = _StepRec()
            if len(self._steps) > self._keep_steps:
                self._steps.pop(next(iter(self._steps))).live = False
        rec.count += 1
        if rec.dropped:
            return
        if rec.count > self._step_cap:
            self._drop(rec)
            return
        series = rec.rows.get((slot, dev))
        if series is None:
            series = rec.rows[(slot, dev)] = (array("d"), array("d"))
        acc.series, acc.series_step, acc.series_rec = series, step, rec
        series[0].append(gpu)
        series[1].append(cpu)

    @staticmethod
    def _drop(rec: _StepRec) -> None:
        """A run that never calls step() is all step 0: past the cap its raw samples go, so
        memory stays bounded; windows leave the step out and say so."""
        rec.dropped = True
        rec.live = False
        rec.rows = {}

    def snapshot(self, series: bool = False, trace: bool = False) -> Snapshot:
        """A copy of what this store holds; changes nothing."""
        with _LOCK:
            stats = [
                SlotStats(
                    slot, dev, acc.order, acc.calls, acc.skipped, _state(acc.gpu), _state(acc.cpu)
                )
                for (slot, dev), acc in self._stats.items()
            ]
            kept = tuple(self._steps)
            dropped = tuple(s for s, rec in self._steps.items() if rec.dropped)
            rows = (
                [
                    SeriesRow(step, slot, dev, g.tobytes(), c.tobytes())
                    for step, rec in self._steps.items()
                    for (slot, dev), (g, c) in rec.rows.items()
                ]
                if series
                else []
            )
            items = [TraceItem._make(t) for t in self._trace] if trace else []
        return Snapshot(stats, kept, dropped, rows, items)

    def step_rows(self, first: int, stop: int) -> list[SeriesRow]:
        """The rows of the kept steps with ``first <= step < stop``, in the order the steps were
        kept; changes nothing. A per-step feed reads each new step once through this, paying
        for that step's rows only (``snapshot(series=True)`` copies every kept step's)."""
        with _LOCK:
            return [
                SeriesRow(step, slot, dev, g.tobytes(), c.tobytes())
                for step, rec in self._steps.items()
                if first <= step < stop
                for (slot, dev), (g, c) in rec.rows.items()
            ]

    def orphan(self, region: Any, /) -> bool:
        """Mark the innermost frame of ``region`` on another thread's stack ORPHAN: its call
        was closed elsewhere (a generator suspended inside a region, closed by the garbage
        collector on another thread). The owning thread drops it, NVTX pop included, the next
        time a region of this store enters or exits there. False when no other thread has one.
        """
        mine = self.stack()
        for ref in list(self._stacks):
            stack = ref()
            if stack is None or stack is mine:
                continue
            for frame in reversed(list(stack)):
                if frame.region is region and frame.kind != ORPHAN:
                    frame.dev = frame.kind  # the kind it had: an OFF frame pushed no NVTX
                    frame.kind = ORPHAN
                    return True
        return False

    def pending(self) -> int:
        """This store's samples still waiting for the GPU."""
        return sum(
            1 for rec in list(_streams.values()) for s in list(rec._pending) if s._store is self
        )


# -- the hot path -------------------------------------------------------------------------------
class RegionBase:
    """Base of ``cudatimer.Region``: ``__enter__``/``__exit__`` for the common case (the
    Timer on, CUDA in use, the current device's default stream, no side streams), and the
    general hooks given to ``bind`` for everything else."""

    __slots__ = (
        "_attrs",
        "_cgen",
        "_cslots",
        "_end",
        "_enter_hook",
        "_exit_hook",
        "_fast",
        "_pop",
        "_push",
        "_rname",
        "_start",
        "_store",
    )

    def bind(
        self,
        store: Store,
        fast: bool,
        name: str,
        push: Callable[[Any], Any] | None,
        attrs: Any,
        pop: Callable[[], Any] | None,
        enter: Callable[[Any], None],
        exit: Callable[[Any, Any], None],
        start: Callable[[Any], Any] | None = None,
        end: Callable[[Any], Any] | None = None,
    ) -> None:
        """Set what the hooks read (``Region.__init__`` calls it once); ``exit(region,
        exc_type)`` gets the exception type of the block (None: it ended cleanly); ``start``
        and ``end``: NVTX ranges of detached calls (``open_at``/``close``)."""
        self._store = store
        self._fast = fast
        self._rname = name
        self._push = push
        self._attrs = attrs
        self._pop = pop
        self._enter_hook = enter
        self._exit_hook = exit
        self._start = start
        self._end = end
        # The slot cache: parent slot -> this region's slot, under generation _cgen. A dict,
        # not one entry: a region shared by parents (instrument's "attn" in each block) would
        # take the store's child() on every call (the C core keeps 32 ways).
        self._cslots: dict[int, int] = {}
        self._cgen = -1

    def __enter__(self) -> Any:
        store = self._store
        stack = store._local.stack if _get_running_loop() is None else store.stack()
        rec = self._common_rec()
        if rec is None:
            return self._general_enter(stack)
        if stack:
            top = stack[-1]
            if top.kind == ORPHAN:  # closed on another thread: the general hook drops it
                return self._general_enter(stack)
            parent = top.slot
        else:
            parent = stack.base
        # The generation is read before the slot: reset() prunes the tree, then bumps it, so
        # a slot taken under a generation is in the tree that generation's samples are read by.
        gen = store._gen
        if gen != self._cgen:  # a reset() since: every cached slot may be forgotten
            self._cslots = {}
            self._cgen = gen
        slot = self._cslots.get(parent)
        if slot is None:
            try:
                slot = store._child(parent, self._rname)
            except KeyError:  # a parent forgotten by a racing reset(): the general path
                return self._general_enter(stack)
            self._cslots[parent] = slot
        push = self._push
        if push is not None:
            push(self._attrs)
        frame = None
        try:
            pool = rec._pool
            start = pool.pop() if pool else rec._make_event()  # rec.take(), written out
            start.record(rec.stream)
            frame = Frame(self, slot, gen, TIMED, rec, start, _now_ns())
            stack.append(frame)
        except BaseException:
            # Whatever raises here (a KeyboardInterrupt from a signal handler, raised as a
            # call returns, included) leaves neither a frame nor an NVTX range behind.
            if frame is not None and stack and stack[-1] is frame:
                del stack[-1]
            if push is not None:
                self._pop()  # type: ignore[misc]
            raise
        return self

    def _common_rec(self) -> StreamRec | None:
        """The record of the current device's default stream where a call of this region
        takes the common case (the fast path on, the store enabled, CUDA in use, that stream
        current and seen before); None where it does not: a side stream (maybe capturing), or
        a stream not seen yet. (The C core's ``common_case``.)"""
        if not (self._fast and self._store.enabled and _usable):
            return None
        key = _getter(-1)  # type: ignore[misc]
        return _defaults.get(key[1]) if key[0] == 0 else None

    def _general_enter(self, stack: Stack) -> Any:
        depth = len(stack)
        try:
            self._enter_hook(self)
        except BaseException:
            _repair(stack, self, depth, None)
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
        /,
    ) -> None:
        # If anything raises in here (a KeyboardInterrupt from a signal handler, say), the
        # frame this exit closes still goes: the one noted (``own``), or, before it could be
        # noted, the innermost frame of this region; unless the hot path already popped it.
        # (The first instruction of a Python function, where CPython also checks for
        # signals, stays a window the C core does not have.)
        try:
            own = None
            popped = False
            t1 = _now_ns()
            store = self._store
            stack = store._local.stack if _get_running_loop() is None else store.stack()
            if self._fast and stack:
                f = stack[-1]
                rec = f.rec
                if f.region is self and f.kind == TIMED and _getter(-1) == rec.key:  # type: ignore[misc,union-attr]
                    del stack[-1]
                    popped = True
                    try:
                        pool = rec._pool  # type: ignore[union-attr]
                        end = pool.pop() if pool else rec._make_event()  # type: ignore[union-attr]
                        end.record(rec.stream)  # type: ignore[union-attr]
                        f._end = end
                        f._extra = ()
                        f._t1 = t1
                        f._step = store.step
                        f._tid = stack.tid
                        f._store = store
                        pend = rec._pending  # type: ignore[union-attr]
                        pend.append(f)
                        if len(pend) >= rec._check_at and not _LOCK.locked():  # type: ignore[union-attr]
                            with _LOCK:  # (see _LOCK)
                                rec._harvest()  # type: ignore[union-attr]
                    finally:
                        if self._pop is not None:
                            self._pop()
                    return
            own = _innermost(stack, self)
            self._exit_hook(self, exc_type)
        except BaseException:
            state = locals()  # (what was set before the exception: it may come at any line)
            if not state.get("popped"):
                stack = self._store.stack()
                own = state.get("own")
                _repair(stack, self, -1, own if own is not None else _innermost(stack, self))
            raise

    # Detached calls (frames on no stack, opened at a slot the caller names: backward rows).

    def open_at(self, slot: int, gen: int, /) -> Frame | None:
        """A detached call at ``slot`` in the common case: a TIMED frame on no stack, its
        start recorded on the current device's default stream now, its NVTX range started;
        None, with nothing done, where ``__enter__`` would take the general hook."""
        rec = self._common_rec()
        if rec is None:
            return None
        rid = self._start(self._attrs) if self._start is not None else None
        try:
            start = rec.take()
        except BaseException:
            if rid is not None and self._end is not None:
                self._end(rid)
            raise
        return Frame(self, slot, gen, TIMED, rec, start, _now_ns(), range_id=rid)

    def close(self, frame: Frame, /) -> bool:
        """End a TIMED frame of this region in the common case (its stream still the current
        one): the sample queued, the NVTX range ended, the frame OFF; False, with nothing
        done, for any other frame or stream."""
        t1 = _now_ns()
        if type(frame) is not Frame:
            raise TypeError(f"close() takes a Frame, got {type(frame).__name__}")
        rec = frame.rec
        if not (self._fast and frame.region is self and frame.kind == TIMED) or rec is None:
            return False
        if frame.start is None or _getter is None or _getter(-1) != rec.key:
            return False
        store = self._store
        start, rid = frame.start, frame.range_id
        frame.start = frame.range_id = None
        frame.kind = OFF
        try:
            end = rec.take()
            rec.push(
                store,
                frame.slot,
                frame.gen,
                start,
                end,
                (),
                frame.t0_ns,
                t1,
                store.step,
                store.stack().tid,
            )
        finally:
            if rid is not None and self._end is not None:
                self._end(rid)
        return True


def _innermost(stack: Stack, region: RegionBase) -> Frame | None:
    for frame in reversed(stack):
        if frame.region is region:
            return frame  # type: ignore[no-any-return]
    return None


def _repair(stack: Stack, region: RegionBase, depth: int, own: Frame | None) -> None:
    """After a general hook raised (a KeyboardInterrupt from a signal handler, say): a frame
    the enter hook pushed (the stack deeper than ``depth``), or the frame ``own`` the exit hook
    did not get to pop, goes, with its NVTX range; the stack stays as if the call never ran."""
    if own is None and depth < 0:
        return
    if own is None:
        if len(stack) <= depth or stack[-1].region is not region:
            return
        own = stack[-1]
    for i in range(len(stack) - 1, -1, -1):
        if stack[i] is own:
            del stack[i]
            break
    else:
        return
    if own.kind == TIMED and own.rec is not None and own.start is not None:
        own.rec.give(own.start)
    if region._pop is not None and own.kind != OFF and own.range_id is None:
        region._pop()


class NullRegion:
    """What regions become under ``CUDATIMER_DISABLE``: nothing on enter, exit or call."""

    __slots__ = ()
    name = ""

    def __enter__(self) -> NullRegion:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def __call__(self, fn: Any, /) -> Any:
        return fn

    def backward_from(self, *outputs: object) -> None:
        """A ``backward=True`` region's: nothing either."""
        return None
