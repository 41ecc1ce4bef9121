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
When the history is read (about every half ring of events, and by every report) the events
are replayed in order against the boundaries: a running level, each open call's enter level
and highest level, a child's highest passed on to the call around it when it closes, so a
child's peak counts in its parent's and a sibling's never in another's.

Events of a thread carry that thread's last boundary number; numbers come from one counter,
so "an event after boundary k" orders it after every boundary up to k on any thread. Events
of a thread that has no boundary (another library's worker thread) are counted where they
fall among the boundaries read so far (docs/memory.md, "Limits").

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
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from ..core import _core, _device
from ..core._locks import fork_safe_lock
from ..records._values import Column, register

__all__ = [
    "MEMORY",
    "MEM_DELTA",
    "MEM_PEAK",
    "TRACKER",
    "MemoryCalls",
    "MemoryProbe",
    "Tracker",
    "oom_error",
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


class _Local(threading.local):
    def __init__(self) -> None:
        self.stack: list[tuple[Any, _Call | None]] = []  # (region, its call) of open `with`s


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
        self._detached: dict[int, _Call | None] = {}  # id(token) -> call of detached calls

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
        return alloc

    # -- boundaries (a memory region's enter and exit) ---------------------------------------
    def opened(self, call: _Call) -> None:
        k = next(self._seq)
        self._tag(f"{_PREFIX}{k}")
        self._pending.append((k, call, True))

    def closed(self, call: _Call) -> None:
        k = next(self._seq)
        self._tag(f"{_PREFIX}{k}")
        self._pending.append((k, call, False))
        self._since += 1
        if self._since >= self._due and not self._reading:
            self.read()

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

    # -- reading the history ----------------------------------------------------------------
    def read(self) -> None:
        """Read the allocator's new events and replay them with the boundaries set so far;
        the calls that ended get their values."""
        alloc = self._alloc
        if alloc is None or alloc is not _device.allocator():
            return
        done: list[tuple[_Call, int, int]] = []
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
        # Outside the lock (each recorder's values take its own), one batch per recorder.
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

    __slots__ = ("host", "lost", "oom", "unmeasured", "why")

    def __init__(self, host: Any) -> None:
        self.host = host  # the Recorder: store, tree, values
        self.unmeasured = 0  # calls that had no allocator to read
        self.why: str | None = None
        self.lost = 0
        self.oom: str | None = None  # the note of the last out-of-memory error in its regions

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


class MemoryProbe:
    """What ``memory=True`` adds around each call of a region (``sources._source.Probe``)."""

    option = "memory"

    def enter(self, region: Any) -> None:
        if _is_compiling():
            return
        rec = region.timer.recorder
        top = rec.store.stack().top()
        call = None
        if top is not None and top.region is region:
            call = rec.memory.call(top)
            if call is not None:
                TRACKER.opened(call)
        TRACKER.push(region, call)

    def exit(self, region: Any, exc: BaseException | None) -> None:
        if _is_compiling():
            return
        call = TRACKER.pop(region)
        if call is not None:
            if exc is not None and oom_error(exc):
                note_oom(exc)
            call.step = call.calls.host.store.step
            TRACKER.closed(call)

    def opened(self, region: Any, token: Any) -> None:
        """A detached call of ``region`` (a backward row, a coroutine) opened as ``token``."""
        if token is None or _is_compiling():
            return
        call = region.timer.recorder.memory.call(token)
        if call is not None:
            TRACKER.opened(call)
            TRACKER.keep_detached(token, call)

    def closed(self, region: Any, token: Any) -> None:
        call = TRACKER.take_detached(token)
        if call is not None:
            call.step = call.calls.host.store.step
            TRACKER.closed(call)

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


#: The probe of ``memory=True``.
MEMORY = MemoryProbe()


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
