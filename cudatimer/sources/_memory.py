"""Memory per region call (``memory=True``): what a call leaves allocated when it ends (delta:
bytes at exit minus bytes at enter, signed) and the most it held while open (peak: the
highest level reached while it was open, minus the level at its enter), on the CUDA caching
allocator of the region's device.

How, and why so (costs on an H200 host): reading the allocator's statistics at each boundary
(``torch.cuda.memory_allocated()`` builds and sorts the whole statistics dict: ~77 us; its C
part alone builds ~150 dict entries) would cost more than the region itself, and a peak
between two boundaries is only in the allocator's high-water mark, which cudatimer must not
reset (the program's own ``max_memory_allocated()`` would change). Instead the allocator
records its own events in C++ (``_record_memory_history``, no stack traces) and a boundary
only puts a number on the calling thread's allocator metadata (one C call), which the
allocator copies onto every event of that thread after it (``benchmarks/memory_cost.py``
measures both, and the read: 0.18-0.26 us an event for the replay on the CPU machine).
When the history is read (about every half ring of events, at the end of a long measured
episode, and by every report) the events are replayed in order against the boundaries: a
running level, each open call's enter level and highest level, a child's highest passed on to
the call around it when it closes, so a child's peak counts in its parent's and a sibling's
never in another's.

Events of a thread carry that thread's last boundary number; numbers come from one counter,
so "an event after boundary k" orders it after every boundary up to k on any thread. Events
of a thread that has no boundary (another library's worker thread) are counted where they
fall among the boundaries read so far (docs/memory.md, "Limits").

Sampling (``memory_every``, default ``MEMORY_EVERY``): everything above costs in proportion to
what is measured, so one episode in N is (docs/design.md, "Memory per region"); between a
long measured episode and the next the history is turned off.

The byte counts are those the allocator's events carry: the sizes tensors asked for, before
the allocator rounds each one up to a multiple of 512 bytes (and, for large blocks, sometimes
to a whole cached block): ``memory_stats()["requested_bytes.all.current"]`` moves by exactly
these, ``memory_allocated()`` by these plus the rounding.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from ..core import _core, _device
from ..core._locks import fork_safe_lock
from ..records._values import Column, register

__all__ = [
    "MEMORY",
    "MEMORY_EVERY",
    "MEM_DELTA",
    "MEM_PEAK",
    "PAUSE_AFTER_S",
    "TRACKER",
    "MemoryCalls",
    "MemoryProbe",
    "Tracker",
    "check_every",
    "oom_error",
    "probe",
]

#: The two value columns (``records/_values.py``): fields ``mem_delta_mean_bytes``,
#: ``mem_delta_max_bytes``, ``mem_peak_mean_bytes``, ``mem_peak_max_bytes``.
MEM_DELTA = register(
    Column("mem_delta", "bytes", doc="bytes allocated at exit minus at enter (signed)")
)
MEM_PEAK = register(
    Column("mem_peak", "bytes", doc="highest bytes allocated while open minus at enter")
)

_TIMED, _HOST, _SKIP, _UNTIMED = _core.TIMED, _core.HOST, _core.SKIP, _core.UNTIMED
# A boundary's metadata: at most 15 characters, which std::string keeps inline, so the
# allocator copies it onto each event without a heap allocation (12 digits: 10^12 boundaries).
_PREFIX = "\x01ct"
_PREFIX_LEN = len(_PREFIX)
# Boundaries between two reads of the history at first, before the events per boundary are
# known; then the reads come when about half the ring is new (a read converts each event
# once, and a full ring may have wrapped).
_FIRST_READ = 512
_MIN_READ, _MAX_READ = 64, 1 << 20
#: ``memory_every``'s default: one episode in this many is measured, per outermost region (an
#: episode: from a memory region's call opening while none is open, on any thread, until none
#: is open again; each call inside it is measured with it, or not). On the H200 measuring every
#: call of a 12-layer GPT-2 b8x512 bf16 training step (163 modules, forward and backward rows,
#: ~650 boundaries) cost 8.1 ms over the 51.7 ms timed step (1.159x): the history read is
#: ~1.8 us an event and a boundary's mark 3.3 us, both proportional to what is measured. One
#: step in 10 is ~0.9 ms a step (~1.017x), plus the short path of the boundaries not measured
#: (``Tracker.skip``: 2.5-6.8 us a call on the loaded CPU machine against 5.0-13.5 us
#: measured; ~1-2 us expected on the H200 host, ~0.5 ms a step): ~1.02-1.04x in all against the
#: target 1.05x (benchmarks/memory_cost.py). The first episode of each region is measured.
MEMORY_EVERY = 10
#: A measured episode that lasted this long (host seconds) has its events read at its end and
#: the history turned off until the next measured one, so the episodes between record nothing
#: (each event recorded would cost ~1.8 us to read back). A shorter episode leaves the history
#: on: turning it off and on and reading it (~0.1-1 ms with the segments a snapshot lists)
#: would cost more than a few short episodes' events.
PAUSE_AFTER_S = 0.002
_is_compiling: Callable[[], bool] = getattr(
    getattr(torch, "compiler", None), "is_compiling", lambda: False
)
_OOM: tuple[type[BaseException], ...] = tuple(
    t
    for t in (
        getattr(torch, "OutOfMemoryError", None),
        getattr(torch.cuda, "OutOfMemoryError", None),
    )
    if isinstance(t, type)
)
_OOM_HEAD = "cudatimer: memory regions open at this out-of-memory error"


def check_every(memory_every: object, memory: object) -> int:
    """``memory_every`` as given to a region (None: ``MEMORY_EVERY``), checked."""
    if memory_every is None:
        return MEMORY_EVERY
    if isinstance(memory_every, bool) or not isinstance(memory_every, int):
        raise TypeError(
            "memory_every must be an int N >= 1 (measure one episode in N) or None, got "
            f"{type(memory_every).__name__} ({memory_every!r})"
        )
    if memory_every < 1:
        raise ValueError(
            f"memory_every must be >= 1 (memory_every=1 measures every call), got {memory_every}"
        )
    if not memory:
        raise ValueError(
            f"memory_every={memory_every} needs memory=True (it samples the memory columns)"
        )
    return int(memory_every)


def oom_error(exc: BaseException | None) -> bool:
    """True for torch's out-of-memory error."""
    return exc is not None and bool(_OOM) and isinstance(exc, _OOM)


def size_text(n: float) -> str:
    """``n`` bytes for a note, signed: ``+1.50 GiB``, ``-12.0 MiB``, ``+512 B``."""
    a = abs(n)
    if a >= 2**30:
        return f"{n / 2**30:+.2f} GiB"
    if a >= 2**20:
        return f"{n / 2**20:+.1f} MiB"
    if a >= 2**10:
        return f"{n / 2**10:+.1f} KiB"
    return f"{n:+.0f} B"


class _Call:
    """One region call measured: the row its values go to (``calls``' recorder, ``slot``,
    ``gen``, ``row``: the clock's device or -1), the device whose allocator it reads, the
    step it ended in, and while it is replayed its enter level and highest level."""

    __slots__ = ("calls", "dev", "enter", "gen", "hi", "lost", "row", "slot", "step")

    def __init__(self, calls: MemoryCalls, slot: int, gen: int, row: int, dev: int) -> None:
        self.calls = calls
        self.slot = slot
        self.gen = gen
        self.row = row
        self.dev = dev
        self.step = -1
        self.enter = 0
        self.hi = 0
        self.lost = False


class _Device:
    """One device's replay: the level (bytes since the first event read, relative) and the
    calls open on it, in the order they opened."""

    __slots__ = ("level", "open")

    def __init__(self) -> None:
        self.level = 0
        self.open: list[_Call] = []


def _no_tag(text: str) -> None:
    """No allocator to mark (never called while one is read)."""


#: The call of a memory region counted in its episode and not measured (the episode is not
#: sampled, no allocator, or a kind that records no sample).
_SKIPPED = _Call.__new__(_Call)


class _Local(threading.local):
    def __init__(self) -> None:
        # The open `with`s of memory regions on this thread: (region, its call, _SKIPPED, or
        # None when not counted in an episode).
        self.stack: list[tuple[Any, _Call | None]] = []


class Tracker:
    """The boundaries of every memory region of the process (one allocator history holds the
    events of all Timers) and their replay against the allocator's events."""

    def __init__(self) -> None:
        self._lock = fork_safe_lock()
        self._seq = itertools.count(1)
        self._local = _Local()
        self._alloc: _device.Allocator | None = None
        self._tag: Callable[[str], None] = _no_tag
        self.why: str | None = None  # why there is no allocator to read, the last time asked
        self.broken: str | None = None  # a read failed: no more reads of this allocator
        self._refused: tuple[Any, str] = (None, "")  # an allocator that said it cannot be read
        # Boundaries not replayed yet: (number, call, opens). Appended without the lock and
        # taken from the left by a read (both atomic on a deque, so none is ever lost).
        self._pending: deque[tuple[int, _Call, bool]] = deque()
        self._held: dict[int, list[tuple[str, int]]] = {}  # events past the boundaries known
        self._known = 0  # the highest boundary number replayed
        self._devices: dict[int, _Device] = {}
        self._since = 0  # boundaries since the last read
        self._due = _FIRST_READ
        self._reading = False
        self._detached: dict[int, _Call] = {}  # id(token) -> call of detached calls
        # Episodes (``MEMORY_EVERY``): the memory calls open now on every thread, whether the
        # episode they form is measured, its memory_every, when it began (host s), and
        # whether the history was turned off after the last measured one. A reentrant lock,
        # taken at each boundary (~0.1 us), renewed in a forked child: a read under it may
        # run the garbage collector, whose finalizers can close a backward row (``_backward``
        # flushes a graph task's rows when its guard is collected) on this thread.
        self._mutex = threading.RLock()
        self._depth = 0
        self._measuring = True
        self._every = 1
        self._began = 0.0
        self._paused = False
        #: True while an episode that is not measured is open: a call then takes ``skip``
        #: (read without the mutex; ``skip`` checks again under it).
        self.skipping = False

    # -- the allocator ----------------------------------------------------------------------
    def allocator(self) -> _device.Allocator | None:
        """The allocator to read now (turned on at its first use), or None (``why`` says)."""
        alloc = _device.allocator()
        if alloc is not None and alloc is self._alloc:
            if self.broken is None:
                return alloc
            self.why = self.broken
            return None
        if alloc is None:
            self.why = (
                "CUDA is not initialised in this process (a CPU-only run, or regions entered "
                "before the first CUDA tensor), so there is no CUDA allocator to read"
            )
            return None
        if alloc is self._refused[0]:  # asked once: the answer stands
            self.why = self._refused[1]
            return None
        try:
            why = alloc.why_not() or alloc.start()
        except Exception as exc:  # a torch whose allocator answers otherwise
            why = f"the allocator could not be asked ({exc!r})"
        if why is not None:
            self._refused = (alloc, why)
            self.why = why
            return None
        with self._lock:  # another device seam (tests): nothing of the old one carries over
            self._alloc = alloc
            self._tag = alloc.tag
            self._pending = deque()
            self._held = {}
            self._devices = {}
            self._detached = {}
            self._since = 0
            self._due = _FIRST_READ
            self.broken = None
            self._paused = False
        return alloc

    # -- boundaries (a memory region's enter and exit) ---------------------------------------
    def begin(self, calls: MemoryCalls, frame: Any, every: int) -> _Call:
        """A memory region's call opens (``frame``: just pushed by its enter): the call to
        measure, or ``_SKIPPED``. Every call returned must reach ``end``. The first call of
        an episode decides for the whole episode: one in ``every`` of each region's
        episodes is measured, counted per region (``calls.episodes``)."""
        with self._mutex:
            depth = self._depth
            self._depth = depth + 1
            if depth == 0:
                measuring = self._measuring = self._start(calls, frame.slot, every)
                self.skipping = not measuring
            else:
                measuring = self._measuring
        if not measuring:
            calls.unsampled += 1
            return _SKIPPED
        call = calls.call(frame)
        if call is None:
            return _SKIPPED
        k = next(self._seq)
        self._tag(f"{_PREFIX}{k}")
        self._pending.append((k, call, True))
        return call

    def _start(self, calls: MemoryCalls, slot: int, every: int) -> bool:
        """An episode begins (the mutex held): measured or not; a measured one turns the
        history back on if it was turned off after the last."""
        n = calls.episodes.get(slot, 0)
        calls.episodes[slot] = n + 1
        alloc = self.allocator()
        if alloc is None:
            return True  # nothing to skip: each call counts as one without an allocator
        self._every = every
        if n % every:
            calls.every.add(every)
            return False
        self._began = time.perf_counter()
        if self._paused:
            self._paused = False
            try:
                alloc.resume()
            except Exception as exc:  # never an error in the program's region enter
                self.broken = f"the allocator's history could not be turned on again: {exc}"
        return True

    def skip(self, region: Any) -> bool:
        """A memory region's call opens inside an episode not measured: counted in it, and
        pushed as ``_SKIPPED`` (~1 us with its exit, against ~4 us through ``begin``). False
        (nothing done) when that episode has ended meanwhile."""
        with self._mutex:
            if not self.skipping:
                return False
            self._depth += 1
        self._local.stack.append((region, _SKIPPED))
        region.timer.recorder.memory.unsampled += 1
        return True

    def end(self, call: _Call) -> None:
        """The call ``begin`` returned closes (its values come at a later read); the last
        call of a measured episode that lasted ``PAUSE_AFTER_S`` or more has the history
        read and turned off until the next measured episode."""
        if call is _SKIPPED:
            with self._mutex:
                depth = self._depth - 1 if self._depth > 0 else 0
                self._depth = depth
                if depth == 0:
                    self.skipping = False
            return
        k = next(self._seq)
        self._tag(f"{_PREFIX}{k}")
        self._pending.append((k, call, False))
        self._since += 1
        if self._since >= self._due and not self._reading:
            self.read()
        done: list[tuple[_Call, int, int]] = []
        with self._mutex:
            depth = self._depth - 1 if self._depth > 0 else 0
            self._depth = depth
            if depth:
                return
            self.skipping = False
            if not self._measuring or self._every == 1 or self._paused or self._reading:
                return
            alloc = self._alloc
            if alloc is None or alloc is not _device.allocator() or self.broken is not None:
                return
            if time.perf_counter() - self._began < PAUSE_AFTER_S:
                return
            # Under the mutex: no episode can begin between the read and the pause.
            self._collect(done)
            try:
                self._paused = alloc.pause()
            except Exception as exc:  # never an error in the program's region exit
                self.broken = f"the allocator's history could not be turned off: {exc}"
        _deliver(done)

    def push(self, region: Any, call: _Call | None) -> None:
        self._local.stack.append((region, call))

    def pop(self, region: Any) -> _Call | None:
        """The call of ``region`` innermost on this thread's stack, removed (None: none)."""
        stack = self._local.stack
        for i in range(len(stack) - 1, -1, -1):
            if stack[i][0] is region:
                return stack.pop(i)[1]
        return None

    def keep_detached(self, token: Any, call: _Call) -> None:
        self._detached[id(token)] = call

    def take_detached(self, token: Any) -> _Call | None:
        return self._detached.pop(id(token), None) if token is not None else None

    def skipped_here(self) -> list[tuple[Any, int, int]]:
        """(MemoryCalls, slot, memory_every) of the calls open on this thread that were not
        measured because their episode is not, outermost first."""
        if self._measuring:
            return []
        out = []
        for region, call in self._local.stack:
            if call is not _SKIPPED:
                continue
            rec = region.timer.recorder
            for frame in reversed(rec.store.stack().frames()):
                if frame.region is region:
                    out.append((rec.memory, frame.slot, self._every))
                    break
        return out

    # -- reading the history ----------------------------------------------------------------
    def read(self) -> None:
        """Read the allocator's new events and replay them with the boundaries set so far;
        the calls that ended get their values."""
        done: list[tuple[_Call, int, int]] = []
        self._collect(done)
        _deliver(done)

    def _collect(self, done: list[tuple[_Call, int, int]]) -> None:
        """``read`` up to the values, kept in ``done`` (no recorder's lock taken)."""
        alloc = self._alloc
        if alloc is None or alloc is not _device.allocator():
            return
        with self._lock:
            self._reading = True
            try:
                pending = self._pending  # taken before the read: all precede its events
                batch = [pending.popleft() for _ in range(len(pending))]
                try:
                    events, lost = alloc.read()
                except Exception as exc:  # never an error in the program's region exit
                    self.broken = f"the allocator's history could not be read: {exc}"
                    events, lost = {}, set(self._devices) | {b[1].dev for b in batch}
                self._replay(batch, events, lost, done)
            finally:
                self._reading = False

    def _replay(
        self,
        batch: list[tuple[int, _Call, bool]],
        events: dict[int, list[tuple[str, int]]],
        lost: set[int],
        done: list[tuple[_Call, int, int]],
    ) -> None:
        batch.sort(key=_first)
        if batch:
            self._known = max(self._known, batch[-1][0])
        bounds: dict[int, list[tuple[int, _Call, bool]]] = {}
        for b in batch:
            bounds.setdefault(b[1].dev, []).append(b)
        count = 0
        for dev in set(bounds) | set(events) | set(self._held):
            held = self._held.pop(dev, None)
            got = events.get(dev, [])
            todo = held + got if held else got
            count += len(got)
            state = self._devices.get(dev)
            if state is None:
                state = self._devices[dev] = _Device()
            mine = bounds.get(dev, [])
            if dev in lost:
                # Events went missing somewhere before this read: no call open across it, or
                # replayed in it, can be trusted.
                for c in state.open:
                    c.lost = True
                for _, c, _ in mine:
                    c.lost = True
            rest = self._replay_device(state, todo, mine, done)
            if rest:
                self._held[dev] = rest
        per = count / max(1, self._since)
        self._since = 0
        ring = self._alloc.ring if self._alloc is not None else None
        if ring is None:
            self._due = _MAX_READ  # the program's own history: read at reports only
        else:
            self._due = int(min(_MAX_READ, max(_MIN_READ, ring / 2 / max(per, 1.0))))

    def _replay_device(
        self,
        state: _Device,
        events: list[tuple[str, int]],
        bounds: list[tuple[int, _Call, bool]],
        done: list[tuple[_Call, int, int]],
    ) -> list[tuple[str, int]]:
        """Replay one device's events in order, applying each boundary before the first
        event that comes after it; returns the events past the last boundary known (their
        thread's boundary is not in this batch yet), kept for the next read."""
        level = state.level
        opened = state.open
        top = opened[-1] if opened else None
        # The innermost open call's highest level, kept in a local while events run (an
        # attribute write per event would cost more than the rest of the loop) and written
        # back before a boundary reads it.
        hi = top.hi if top is not None else 0
        i, n = 0, len(bounds)
        known = self._known
        last_tag: str | None = None
        rest: list[tuple[str, int]] = []
        for j, (tag, size) in enumerate(events):
            if tag != last_tag:
                last_tag = tag
                k = _number(tag)
                if k is not None:
                    if k > known:  # after a boundary this read does not have yet
                        rest = events[j:]
                        break
                    if i < n and bounds[i][0] <= k:
                        if top is not None:
                            top.hi = hi
                        while i < n and bounds[i][0] <= k:
                            level, top = _apply(bounds[i], level, opened, done)
                            i += 1
                        hi = top.hi if top is not None else 0
            level += size
            if level > hi:
                hi = level
        if top is not None:
            top.hi = hi
        while i < n:
            level, top = _apply(bounds[i], level, opened, done)
            i += 1
        state.level = level
        return rest

    def open_calls(self) -> list[tuple[int, int, int, _Call]]:
        """(device, its level now, the highest level since the call opened, call) of every
        call open now, outermost first per device (read the history first for now's)."""
        out: list[tuple[int, int, int, _Call]] = []
        for dev, state in sorted(self._devices.items()):
            hi = -(2**62)
            rows = []
            for call in reversed(state.open):  # what a call inside reached, it reached too
                hi = max(hi, call.hi)
                rows.append((dev, state.level, hi, call))
            out += reversed(rows)
        return out

    def after_fork(self) -> None:
        """In a forked child: the parent's allocator and boundaries are not this process's."""
        self._alloc = None
        self._tag = _no_tag
        self._pending = deque()
        self._held = {}
        self._devices = {}
        self._detached = {}
        self._local = _Local()
        self._reading = False
        self._mutex = threading.RLock()
        self._depth = 0
        self._measuring = True
        self._paused = False
        self.skipping = False


def _deliver(done: list[tuple[_Call, int, int]]) -> None:
    """The values of the calls a read closed, to their recorders: outside the tracker's locks
    (each recorder's values take its own), one batch per recorder."""
    batches: dict[int, tuple[Any, list[Any]]] = {}
    for call, delta, peak in done:
        values = call.calls.host.values
        batch_of = batches.get(id(values))
        if batch_of is None:
            batch_of = batches[id(values)] = (values, [])
        row = (("mem_delta", delta), ("mem_peak", peak))
        batch_of[1].append((call.slot, call.gen, call.row, call.step, row))
    for values, calls in batches.values():
        values.add_each(calls)


def _first(b: tuple[int, _Call, bool]) -> int:
    return b[0]


def _number(tag: str) -> int | None:
    """The boundary number of a metadata string of ours (None: another's, or none)."""
    if not tag.startswith(_PREFIX):
        return None
    try:
        return int(tag[_PREFIX_LEN:])
    except ValueError:
        return None


def _apply(
    b: tuple[int, _Call, bool], level: int, opened: list[_Call], done: list[tuple[_Call, int, int]]
) -> tuple[int, _Call | None]:
    """One boundary at ``level``: a call opens (its enter and highest level are now), or
    closes (its values are kept in ``done``, and its highest level counts in the call that
    opened before it and is still open). Returns the level and the innermost open call."""
    _, call, opens = b
    if opens:
        call.enter = call.hi = level
        opened.append(call)
        return level, call
    if opened and opened[-1] is call:
        opened.pop()
        at = len(opened)
    else:
        try:
            at = opened.index(call)
        except ValueError:  # its opening was never replayed (read before this tracker)
            return level, opened[-1] if opened else None
        # Closed while calls that opened inside it are still open (another thread's, or an
        # exit out of order): what they reached so far was reached inside it too.
        for later in opened[at + 1 :]:
            if later.hi > call.hi:
                call.hi = later.hi
        del opened[at]
    if at > 0 and call.hi > opened[at - 1].hi:
        opened[at - 1].hi = call.hi
    if call.lost:
        call.calls.lost += 1
    else:
        done.append((call, level - call.enter, call.hi - call.enter))
    return level, opened[-1] if opened else None


#: The one tracker of the process.
TRACKER = Tracker()

if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=TRACKER.after_fork)


class MemoryCalls:
    """This source's state for one recorder (``Recorder.memory``): the calls it measured
    without values, and the notes for its report (``Source``)."""

    __slots__ = ("episodes", "every", "host", "lost", "oom", "unmeasured", "unsampled", "why")

    def __init__(self, host: Any) -> None:
        self.host = host  # the Recorder: store, tree, values
        self.unmeasured = 0  # calls that had no allocator to read
        self.why: str | None = None
        self.lost = 0
        self.oom: str | None = None  # the note of the last out-of-memory error in its regions
        # Episodes begun per slot of their first call (``Tracker.begin``); calls of episodes
        # not measured; the memory_every values of the episodes that skipped some.
        self.episodes: dict[int, int] = {}
        self.unsampled = 0
        self.every: set[int] = set()

    def call(self, frame: Any) -> _Call | None:
        """The call to measure for ``frame`` (just pushed by its region's enter), or None:
        its kind records no sample (off, NVTX only, inside a graph capture), or there is no
        allocator (counted for the report's note)."""
        kind = frame.kind
        if kind == _TIMED:
            row = dev = frame.rec.device
        elif kind in (_HOST, _SKIP):
            row, dev = -1, -1
        elif kind == _UNTIMED:
            row = dev = frame.dev
        else:
            return None
        if TRACKER.allocator() is None:
            self.unmeasured += 1
            self.why = TRACKER.why
            return None
        if dev < 0:
            dev = _device.current_key()[1]
        return _Call(self, frame.slot, frame.gen, row, dev)

    def path(self, call: _Call) -> str:
        try:
            return str(self.host.tree.path(call.slot))
        except KeyError:  # forgotten by a reset since
            return "?"

    # -- Source ---------------------------------------------------------------------------
    def drain(self, timeout_s: float) -> None:
        """Read the allocator's history: every call ended so far gets its values."""
        TRACKER.read()

    def pending(self) -> int:
        return 0

    def notes(self) -> tuple[tuple[str, str], ...]:
        out = []
        parts = []
        if self.unmeasured:
            parts.append(f"{self.unmeasured} call(s) of memory=True regions have none: {self.why}")
        if self.lost:
            parts.append(
                f"{self.lost} call(s) have none because the allocator's history lost events "
                "between two reads (its ring overflowed, or the program cleared it)"
            )
        if self.unsampled:
            every = ", ".join(str(n) for n in sorted(self.every)) or str(MEMORY_EVERY)
            parts.append(
                f"sampled: one call in memory_every={every} of each outermost memory region "
                "is measured with every call inside it (the first one always); "
                f"{self.unsampled} call(s) were not, and 'mem calls' counts those that were "
                "(memory_every=1 measures all)"
            )
        if parts:
            out.append(("memory_note", "memory columns: " + "; ".join(parts)))
        if self.oom is not None:
            out.append(("memory_oom_note", self.oom))
        return tuple(out)

    def reset(self) -> None:
        self.unmeasured = 0
        self.why = None
        self.lost = 0
        self.oom = None
        self.episodes = {}
        self.unsampled = 0
        self.every = set()


class MemoryProbe:
    """What ``memory=True`` adds around each call of a region (``sources._source.Probe``),
    measuring one episode in ``every`` (``memory_every``)."""

    __slots__ = ("every", "options")

    option = "memory"

    def __init__(self, every: int) -> None:
        self.every = every
        #: The region options that made it: a region's backward row gets the same.
        self.options: dict[str, Any] = {"memory": True, "memory_every": every}

    def enter(self, region: Any) -> None:
        if _is_compiling():
            return
        tracker = TRACKER
        if tracker.skipping and tracker.skip(region):
            return
        rec = region.timer.recorder
        top = rec.store.stack().top()
        if top is not None and top.region is region:
            tracker.push(region, tracker.begin(rec.memory, top, self.every))
        else:
            tracker.push(region, None)

    def exit(self, region: Any, exc: BaseException | None) -> None:
        if _is_compiling():
            return
        if exc is not None and oom_error(exc):
            note_oom(exc)  # with this call still open
        call = TRACKER.pop(region)
        if call is not None:
            if call is not _SKIPPED:
                call.step = call.calls.host.store.step
            TRACKER.end(call)

    def opened(self, region: Any, token: Any) -> None:
        """A detached call of ``region`` (a backward row, a coroutine) opened as ``token``."""
        if token is None or _is_compiling():
            return
        TRACKER.keep_detached(token, TRACKER.begin(region.timer.recorder.memory, token, self.every))

    def closed(self, region: Any, token: Any) -> None:
        call = TRACKER.take_detached(token)
        if call is not None:
            if call is not _SKIPPED:
                call.step = call.calls.host.store.step
            TRACKER.end(call)

    def detached(
        self, region: Any, open_: Callable[[], Any], close: Callable[[Any], None]
    ) -> tuple[Callable[[], Any], Callable[[Any], None]]:
        """``open_`` and ``close`` of a detached call of ``region``, measured."""

        def measured_open() -> Any:
            token = open_()
            self.opened(region, token)
            return token

        def measured_close(token: Any) -> None:
            try:
                self.closed(region, token)
            finally:
                close(token)

        return measured_open, measured_close


_PROBES: dict[int, MemoryProbe] = {}


def probe(every: int) -> MemoryProbe:
    """The probe of ``memory=True, memory_every=every`` (one per value)."""
    made = _PROBES.get(every)
    if made is None:
        made = _PROBES.setdefault(every, MemoryProbe(every))
    return made


#: The probe of ``memory=True`` with the default ``memory_every``.
MEMORY = probe(MEMORY_EVERY)


def note_oom(exc: BaseException) -> None:
    """Name the memory regions open now, with their memory, on ``exc`` (an exception note,
    Python >= 3.11) and in the next report of each one's Timer. Once per exception: the
    innermost region's exit notes it, the ones around it see the note."""
    notes = getattr(exc, "__notes__", None) or ()
    if any(isinstance(n, str) and n.startswith(_OOM_HEAD) for n in notes):
        return
    if getattr(exc, "_cudatimer_noted", False):  # Python 3.10: no notes to look at
        return
    TRACKER.read()
    parts = []
    devices = []
    recorders = []
    for dev, level, hi, call in TRACKER.open_calls():
        if call.lost:
            continue
        where = f"cuda:{dev}" if call.row == dev else f"host clock, cuda:{dev}"
        parts.append(
            f"{call.calls.path(call)} ({where}) {size_text(level - call.enter)} now, "
            f"{size_text(hi - call.enter)} at most"
        )
        if dev not in devices:
            devices.append(dev)
        if call.calls not in recorders:
            recorders.append(call.calls)
    for calls, slot, every in TRACKER.skipped_here():
        # Inside an episode that is not measured: named, with no bytes of its own.
        try:
            path = str(calls.host.tree.path(slot))
        except KeyError:
            path = "?"
        parts.append(f"{path} (not measured in this call: memory_every={every})")
        if calls not in recorders:
            recorders.append(calls)
        if _device.usable():
            dev = _device.current_key()[1]
            if dev not in devices:
                devices.append(dev)
    if not parts:
        return
    alloc = TRACKER.allocator()
    usage = []
    for dev in devices:
        if alloc is None:
            break
        try:
            allocated, reserved = alloc.usage(dev)
        except Exception:  # a note must never replace the error it annotates
            break
        usage.append(
            f"cuda:{dev} had {size_text(allocated)[1:]} allocated and "
            f"{size_text(reserved)[1:]} reserved by PyTorch"
        )
    text = (
        f"{_OOM_HEAD}, outermost first (bytes since each one's enter: held now, most held): "
        + "; ".join(parts)
        + (". " + "; ".join(usage) if usage else "")
    )
    add_note = getattr(exc, "add_note", None)
    if add_note is not None:
        add_note(text)
    else:
        with contextlib.suppress(AttributeError):
            exc._cudatimer_noted = True  # type: ignore[attr-defined]
    for calls in recorders:
        calls.oom = text.removeprefix("cudatimer: ")
