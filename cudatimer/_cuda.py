"""CUDA side of the recorder: stream lookup, pooled events, pending samples, harvesting.

Costs that shape this module (measured on an H200):
- ``torch.cuda.current_stream()`` builds a Python Stream object: 4.6-7.6 us, more than the two
  event records it would serve. ``torch._C._cuda_getCurrentStream(device)`` returns a plain tuple
  in 0.14 us; we key a dict of cached Stream objects with it.
- ``torch.Event.record(stream)`` is 1.6 us against 1.8-2.0 us for ``torch.cuda.Event`` (a Python
  subclass); constructing an event is 0.5-1 us and its first record creates the CUDA event
  (+1.5 us once), so events are pooled and reused, and a new stream's pool is pre-warmed.
- ``query()`` never blocks (0.34-0.66 us). Events on one stream complete in the order they were
  recorded, so one query of the newest pending end event usually clears a whole batch.
- The compiled module ``_speedups`` (optional) pops a pooled event and records it in one C call
  through the CUDA runtime torch loaded, skipping the binding's parsing and device guard, and
  reads elapsed times the same way; ``take_recorded``/``elapsed_ms`` below are it, or the same
  logic in Python when it is missing or ``CUDATIMER_PURE_PYTHON`` is set.
- ``_cuda_getCurrentStream(-1)`` resolves the current device in C (``getCurrentCUDAStream(-1)``
  calls ``current_device()``) and returns the stream's device in the tuple: one call (0.14 us)
  instead of ``_cuda_getDevice()`` + ``_cuda_getCurrentStream(dev)`` (0.1 us more), and at exit the
  same call compared with the start key catches a stream switch and a device switch at once.

Nothing here touches CUDA at import: a process that never initialises CUDA stays fork-safe.
"""

from __future__ import annotations

import atexit
import importlib
import os
import threading
import time
import warnings
from collections import deque
from typing import Any

import torch

from ._hist import _INV_LOG_GAMMA

_speedups: Any
try:
    _speedups = importlib.import_module("cudatimer._speedups")
except ImportError:  # not built (no C compiler at install): the Python path does the same
    _speedups = None

_cuda_mod: Any = torch.cuda
_REAL_CUDA: Any = torch.cuda  # never replaced by the tests' fake GPU

# Samples on one stream that wait before the hot path tries to harvest them. A check is one
# query (0.23 us on the H200) when the GPU keeps up and log2(backlog) queries when it lags, so
# 256 exits between checks keep it under 0.01 us per region; the backlog stays a few thousand
# samples (~0.5 MB) at most, since a host cannot run further ahead of its GPU than that.
HARVEST_BATCH = 256
# How far (GPU ms) a trace placement reads from its anchor before the anchor moves on: a
# float32 of ms is good to ~4 ns at 100 ms (StreamEntry.place; _speedups.c has its own copy).
ANCHOR_HOP_MS = 100.0
# Events created and recorded once when a stream is first seen, so the first regions on it do
# not pay CUDA event creation (+1.5 us each) inside the user's loop.
PREWARM_EVENTS = 32

_C: Any = torch._C
_get_device = getattr(_C, "_cuda_getDevice", None)
_get_stream = getattr(_C, "_cuda_getCurrentStream", None)
_is_capturing = getattr(_C, "_cuda_isCurrentStreamCapturing", None)
_HAS_CUDA_BUILD = _get_device is not None and _get_stream is not None

#: One lock for every aggregate and every harvest. The hot path only ever *tries* it.
LOCK = threading.Lock()

UNDECIDED, USABLE, UNUSABLE = 0, 1, 2

#: Argument of ``_cuda_getCurrentStream`` meaning "the current device".
CURRENT_DEVICE = -1


class Ends:
    """The end events of one sample that ended on several streams (``streams=[...]``, or a
    stream switched inside the region): ``main`` on the start stream, ``extra`` elsewhere on the
    same device. Stored in the end slot of a pending sample; ``query()`` is True when all are
    done, so the harvest treats it like one event. GPU time is the latest end: elapsed_time
    between events of different streams of one device is valid (one device clock)."""

    __slots__ = ("extra", "main")

    def __init__(self, main: Any, extra: tuple[Any, ...]) -> None:
        self.main = main
        self.extra = extra

    def query(self) -> bool:
        return bool(self.main.query()) and all(e.query() for e in self.extra)

    def resolve(self, start: Any) -> tuple[float, Any, list[Any]]:
        """(GPU ms to the latest end, that end event, the other end events)."""
        best = self.main
        best_ms = start.elapsed_time(best)
        rest = []
        for e in self.extra:
            ms = start.elapsed_time(e)
            if ms > best_ms:
                rest.append(best)
                best, best_ms = e, ms
            else:
                rest.append(e)
        return best_ms, best, rest


class StreamEntry:
    """A stream seen by some region: its cached Stream object, event pool, pending samples."""

    __slots__ = (
        "anchor",
        "anchor_ms",
        "check_at",
        "clock",
        "device",
        "key",
        "make_event",
        "pending",
        "pool",
        "raw",
        "ref",
        "ref_ns",
        "stream",
    )

    def __init__(self, key: tuple[int, int, int]) -> None:
        stream_id, device, device_type = key
        self.key = key
        self.device = device
        self.clock = f"cuda:{device}"
        self.stream: Any = _cuda_mod.Stream(
            stream_id=stream_id, device_index=device, device_type=device_type
        )
        # Samples: (node, start event, end event, host start ns, host end ns, step, thread id),
        # in end-record order. Host times stay raw integers until the harvest.
        self.pending: deque[tuple[Any, Any, Any, int, int, int, int]] = deque()
        self.check_at = HARVEST_BATCH
        self.pool: list[Any] = _pool_for(device)
        self.make_event, generic = _event_factory(device, self.stream)
        # The cudaStream_t the compiled path records on; None keeps every record in torch
        # (torch.cuda.Event fallback events, or no compiled module).
        self.raw: int | None = (
            int(self.stream.cuda_stream) if generic and RUNTIME_BOUND else None
        )
        # Trace export places every event on this stream's GPU timeline by its elapsed time
        # from this reference event; ref_ns is the host clock when it was recorded.
        self.ref = self.make_event()
        self.ref.record(self.stream)
        self.ref_ns = time.perf_counter_ns()
        # The event GPU starts are read against for the trace, anchor_ms after ref (place()).
        self.anchor: Any = self.ref
        self.anchor_ms = 0.0
        if len(self.pool) < PREWARM_EVENTS:
            for _ in range(PREWARM_EVENTS):
                ev = self.make_event()
                ev.record(self.stream)
                self.pool.append(ev)

    def take(self) -> Any:
        """A pooled event (a new one when the pool is empty); the general paths use this, the
        inlined hot path in Region.__enter__/__exit__ writes the same line out."""
        pool = self.pool
        return pool.pop() if pool else self.make_event()

    def place(self, start: Any) -> tuple[float | None, Any]:
        """Where the finished event ``start`` happened on the host clock (ns; None if it cannot
        be read), for the trace, and the event to give back to the pool in its stead.

        One elapsed read against the anchor (0.24 us), so a sample's events go back to the pool
        at once instead of waiting in the trace ring (2 x 4096 events). Every record then
        cycles through fewer distinct CUDA events: in the launch-bound loop on an H200, 512
        distinct events cost 1.19-1.20x what re-recording the same two does. The read is
        float32 ms, good to ~4 ns within 100 ms: past ANCHOR_HOP_MS ``start`` becomes the
        anchor (the old one goes to the pool, or None for ``ref``) and positions add up in
        double, microsecond-exact over hours. The compiled harvest does the same with its own
        anchor (``_speedups.c``)."""
        try:
            off = elapsed_ms(self.anchor, start)
        except (RuntimeError, ValueError):
            return None, start
        at_ms = self.anchor_ms + off
        if off > ANCHOR_HOP_MS:
            old = self.anchor
            self.anchor, self.anchor_ms = start, at_ms
            start = None if old is self.ref else old
        return self.ref_ns + at_ms * 1e6, start

    def take_recorded(self) -> Any:
        """A pooled event recorded on this stream now: the Python twin of the compiled
        ``_speedups.take_record(entry)``, which calls this when it cannot record itself."""
        event = self.take()
        event.record(self.stream)
        return event


def _elapsed_py(start: Any, end: Any) -> float:
    """Milliseconds from ``start`` to ``end`` (the Python twin of ``_speedups.elapsed_ms``)."""
    ms: float = start.elapsed_time(end)
    return ms


#: True when the compiled module is built and bound to the CUDA runtime torch loaded (decided
#: once, at import; binding never initialises CUDA, so fork safety is unchanged).
RUNTIME_BOUND: bool = _speedups is not None and bool(_speedups.load())
#: The functions the recorder calls: compiled when bound and switched on, else Python
#: (``set_compiled``, from ``_timer.use_compiled``, rebinds them).
take_recorded: Any = StreamEntry.take_recorded
elapsed_ms: Any = _elapsed_py
#: True while the compiled hot path is in use (its device records are kept up to date).
COMPILED = False


def set_compiled(on: bool) -> None:
    """Record and read events of the general paths through the compiled module (when it is
    bound) or in Python; ``on`` also tells the Backend to keep the compiled path's device
    records (default streams) up to date."""
    global take_recorded, elapsed_ms, COMPILED
    bound = on and RUNTIME_BOUND and _speedups is not None
    take_recorded = _speedups.take_record if bound else StreamEntry.take_recorded
    elapsed_ms = _speedups.elapsed_ms if bound else _elapsed_py
    COMPILED = bool(on) and _speedups is not None
    # Device records stay either way: samples the compiled path still has pending are
    # resolved by the next report whichever path is in use then.
    for entry in list(BACKEND.entries.values()):
        BACKEND.register(entry)


_pools: dict[int, list[Any]] = {}


def _pool_for(device: int) -> list[Any]:
    pool = _pools.get(device)
    if pool is None:
        pool = _pools[device] = []
    return pool


def _event_factory(device: int, stream: Any) -> tuple[Any, bool]:
    """Prefer the C++ ``torch.Event`` (cheaper record, and its ``event_id`` is the handle the
    compiled path records); fall back to ``torch.cuda.Event``. Returns (factory, generic)."""
    generic = getattr(torch, "Event", None)
    if generic is not None:
        try:
            probe = generic(device=f"cuda:{device}", enable_timing=True)
            probe.record(stream)
            has_handle = isinstance(getattr(probe, "event_id", None), int)
            return lambda: generic(device=f"cuda:{device}", enable_timing=True), has_handle
        except (TypeError, RuntimeError, AttributeError):
            pass
    return lambda: _cuda_mod.Event(enable_timing=True), False


def resolve_one(entry: StreamEntry, sample: tuple[Any, ...]) -> bool:
    """Resolve one finished sample of ``entry`` (caller holds LOCK): GPU time, then the owning
    Timer records it (placed on the GPU timeline when it keeps a trace); its events go back to
    the pool.
    False when it is not readable yet: it is put back first in line, and harvesting stops.
    The compiled path resolves its own samples in C (``_speedups.c``, ``harvest``)."""
    node, start, end, t0, t1, step, tid = sample
    rest: list[Any] = []
    try:
        if type(end) is Ends:
            # Side-stream ends finish in no particular order: all must be done.
            if not end.query():
                raise RuntimeError("side stream still running")
            gpu_ms, end, rest = end.resolve(start)
        else:
            gpu_ms = elapsed_ms(start, end)
    except (RuntimeError, ValueError):
        # Two threads appended out of record order: this one is not done yet.
        entry.pending.appendleft(sample)
        return False
    timer = node.owner
    at_ns = None
    if timer.trace_samples and node.gen == timer._gen:
        at_ns, start = entry.place(start)
    timer._record(node, entry.clock, gpu_ms, (t1 - t0) * 1e-6, step, False, t0, tid, entry, at_ns)
    pool = entry.pool
    if start is not None:
        pool.append(start)
    pool.append(end)
    pool.extend(rest)
    return True


class Backend:
    """Process-wide CUDA state shared by every Timer (streams and pools are per process)."""

    def __setattr__(self, name: str, value: Any) -> None:
        # The compiled path reads its own copies of these two (no attribute lookup per region).
        object.__setattr__(self, name, value)
        if _speedups is not None:
            if name == "state":
                _speedups.set_usable(value == USABLE)
                if value == USABLE:
                    _trust_c10()
            elif name == "entries":  # a new set of streams (tests swap in a fake GPU's)
                _speedups.forget_streams()
                for entry in list(value.values()):
                    self.register(entry)

    def register(self, entry: StreamEntry) -> None:
        """Hand a default stream's entry to the compiled path (where it is in use)."""
        key = entry.key
        if (
            COMPILED
            and key[0] == 0
            and key[2] == 1
            and self.entries.get(key) is entry
            and not _speedups.has_stream(entry)
        ):
            _speedups.add_stream(entry)

    def __init__(self) -> None:
        self.state = UNDECIDED if _HAS_CUDA_BUILD else UNUSABLE
        self.entries: dict[tuple[int, int, int], StreamEntry] = {}
        self.forked = False
        self._fork_warned = False
        self._graveyard: list[Any] = []

    # -- deciding the clock -------------------------------------------------------------
    def probe(self) -> bool:
        """True once CUDA is initialised in this process (never initialises it ourselves).

        A region entered before the program touched CUDA is timed on the host clock; from the
        first region after CUDA initialisation on, regions are timed with events. Checking
        ``torch.cuda.is_initialized()`` costs ~0.1 us and stops once the answer is yes.
        """
        if self.state == UNDECIDED and _cuda_mod.is_initialized():
            self.state = USABLE
        if self.forked and not self._fork_warned:
            self._fork_warned = True
            warnings.warn(
                "cudatimer: this process was forked after CUDA was initialised in its parent, "
                "so CUDA cannot be used here; regions in this process are timed on the host "
                "clock (use the 'spawn' start method to time GPU work in workers)",
                RuntimeWarning,
                stacklevel=4,
            )
        return self.state == USABLE

    def entry(self, key: tuple[int, int, int]) -> StreamEntry:
        e = self.entries.get(key)
        if e is None:
            e = self.entries[key] = StreamEntry(key)
            self.register(e)
        return e

    def current_entry(self) -> StreamEntry | None:
        """The entry of the current stream, or None when it is capturing a CUDA graph.

        A timing event recorded during capture poisons it (query/elapsed_time then raise
        'invalid argument', even after replay), and any query during capture ruins the capture.
        Capture is impossible on the legacy default stream (id 0), so the capture check
        (~0.4 us) runs only for regions on side streams.
        """
        key = _get_stream(CURRENT_DEVICE)  # type: ignore[misc]
        if key[0] != 0 and _is_capturing is not None and _is_capturing():
            return None
        e = self.entries.get(key)
        return e if e is not None else self.entry(key)

    def clock_now(self, events: bool) -> str:
        """The clock a region entered now would be timed on (counting calls not timed)."""
        if events and (self.state == USABLE or self.probe()):
            entry = self.current_entry()
            if entry is not None:
                return entry.clock
        return "host"

    # -- harvesting -----------------------------------------------------------------------
    def harvest(self, entry: StreamEntry) -> None:
        """Resolve finished samples of ``entry`` without blocking; caller holds LOCK."""
        pend = entry.pending
        n = len(pend)
        if n:
            if pend[-1][2].query():
                ready = n
            else:
                # Events on one stream complete in record order: binary-search the first
                # unfinished sample (log2(n) queries instead of one per finished sample).
                lo, hi = 0, n - 1
                while lo < hi:
                    mid = (lo + hi) // 2
                    if pend[mid][2].query():
                        lo = mid + 1
                    else:
                        hi = mid
                ready = lo
            for _ in range(ready):
                if not resolve_one(entry, pend.popleft()):
                    break
        entry.check_at = len(pend) + HARVEST_BATCH

    def try_harvest(self, entry: StreamEntry) -> None:
        """Hot-path harvest: skip if another thread holds the lock (it will catch up)."""
        if LOCK.acquire(blocking=False):
            try:
                self.harvest(entry)
            finally:
                LOCK.release()

    def drain(self, timeout_s: float) -> int:
        """Wait (polling, never blocking in CUDA) for every pending sample; return how many are
        still pending at the deadline. Called only by reports, never by regions."""
        if self.state != USABLE or self.forked:
            return 0
        deadline = time.monotonic() + timeout_s
        pause = 50e-6
        for entry in list(self.entries.values()):
            while entry.pending:
                try:
                    newest = entry.pending[-1][2]
                except IndexError:  # emptied by another thread (reset, exit) meanwhile
                    break
                if newest.query() and all(
                    s[2].query() for s in list(entry.pending) if type(s[2]) is Ends
                ):
                    break
                if time.monotonic() >= deadline:
                    break
                time.sleep(pause)
                pause = min(pause * 2, 2e-3)
        left = 0
        with LOCK:
            for entry in list(self.entries.values()):
                self.harvest(entry)
                left += len(entry.pending)
            if _speedups is not None:
                left += _speedups.drain(max(0.0, deadline - time.monotonic()))
        return left

    def pending_count(self) -> int:
        n = sum(len(e.pending) for e in self.entries.values())
        return n + (_speedups.pending() if _speedups is not None else 0)

    # -- fork and exit ----------------------------------------------------------------------
    def after_fork_in_child(self) -> None:
        # Only the forking thread lives on in the child; a lock held by another thread of the
        # parent at the fork would never be released. Our code never forks while holding it.
        if LOCK.locked():
            LOCK.release()
        bad_fork = getattr(torch.cuda, "_is_in_bad_fork", lambda: False)
        if self.state == USABLE or bad_fork():
            # The child cannot touch the parent's CUDA context: every CUDA object the recorder
            # holds moves to a graveyard that is never freed (an event's destructor would call
            # into the dead context and print a CUDA warning per event at the child's exit).
            self._graveyard.append((dict(self.entries), dict(_pools)))
            if _speedups is not None:
                self._graveyard.append(_speedups.forget_streams(True))
            self.entries.clear()  # the same dict object: the hot path holds a reference to it
            _pools.clear()
            self.state = UNUSABLE
            self.forked = True
            self._fork_warned = False
            self._bury_timer_events()
            import ctypes

            # One extra reference that nothing releases: even interpreter teardown (which
            # clears module globals) never frees the graveyard, so no event destructor runs in
            # this child. The leak is the size of the parent's event pool, once per child.
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(self._graveyard))

    def _bury_timer_events(self) -> None:
        """In a forked child: regions open on this thread at the fork close on the host clock
        (their start event belongs to the parent), and trace windows let go of the parent's
        stream entries, which own CUDA events (the reference and the placement anchor)."""
        from ._timer import _TIMERS

        for timer in list(_TIMERS):
            self._graveyard.append(timer._trace)
            timer._trace = type(timer._trace)()
            if timer._core is not None:
                self._graveyard.append(timer._core.collect())
            stack = timer._local.stack
            for i, frame in enumerate(stack):
                if isinstance(frame[2], StreamEntry):
                    self._graveyard.append(frame[3])
                    stack[i] = (frame[0], frame[1], None, None, frame[4])

    def at_exit(self) -> None:
        """Interpreter exit: drop pending samples without waiting for the GPU, and time any
        region entered later (other exit handlers) on the host clock. Runs after the optional
        report at exit (atexit runs handlers last-registered first; this one is registered at
        import, before it). Never blocks: if another thread holds the lock, leave it all."""
        if not LOCK.acquire(timeout=0.5):
            return
        try:
            if self.state == USABLE:
                self.state = UNUSABLE
            if not self.forked:  # a forked child must never destroy the parent's events
                for entry in self.entries.values():
                    entry.pending.clear()
                if _speedups is not None:
                    _speedups.clear_pending()
        finally:
            LOCK.release()


def _trust_c10() -> None:
    """Let the compiled path read the current stream from c10 only if it reads what torch
    does (checked once, when CUDA becomes usable)."""
    if _speedups is None or _get_stream is None:
        return
    if not _REAL_CUDA.is_initialized():
        # c10's getCurrentCUDAStream throws a C++ exception without a usable device, and one
        # thrown through C aborts the process: only ask it once CUDA is really up (a fake GPU
        # in the tests sets USABLE without it).
        _speedups.trust_current_stream(False)
        return
    try:
        ours = _speedups.current_stream()
        _speedups.trust_current_stream(ours is not None and tuple(ours) == tuple(_get_stream(-1)))
    except Exception:  # any doubt: torch's own call is used
        _speedups.trust_current_stream(False)


if _speedups is not None:
    _speedups.configure(globals(), _get_stream, _INV_LOG_GAMMA)
BACKEND = Backend()

if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=BACKEND.after_fork_in_child)
atexit.register(BACKEND.at_exit)
