"""The device seam: which stream is current, whether CUDA is in use, how events and streams are
made; fork and interpreter exit. The one place where tests plug in a fake GPU (``use``).

Costs that shape it (measured on an H200):
- ``torch.cuda.current_stream()`` builds a Python Stream object: 4.6-7.6 us, more than the two
  event records it would serve. ``torch._C._cuda_getCurrentStream(-1)`` returns a plain tuple
  (stream id, device, device type) in 0.14 us, resolving the current device in C; the stream
  records are keyed by it, and at exit the same call compared with the start key catches a
  stream switch and a device switch at once. The C core reads c10's current stream directly
  once it was checked to agree with torch (``_trust_c10``).
- ``torch.Event.record(stream)`` is 1.6 us against 1.8-2.0 us for ``torch.cuda.Event`` (a
  Python subclass); constructing an event is 0.5-1 us and its first record creates the CUDA
  event (+1.5 us once), so events are pooled and a new stream's pool is pre-warmed.
- ``query()`` never blocks (0.34-0.66 us). Events on one stream complete in record order, so
  one query of the newest pending end event usually clears a whole batch.

Nothing here touches CUDA at import: a process that never initialises CUDA stays fork-safe.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import warnings
from collections.abc import Callable
from typing import Any, Protocol

import torch

from ..records._hist import INV_LOG_GAMMA
from . import _core

# Samples on one stream that wait before the hot path tries to harvest them. A check is one
# query (0.23 us on the H200) when the GPU keeps up and log2(backlog) queries when it lags, so
# 256 exits between checks keep it under 0.01 us per region; the backlog stays a few thousand
# samples (~0.5 MB) at most, since a host cannot run further ahead of its GPU than that.
HARVEST_BATCH = 256
# How far (GPU ms) a trace placement reads from its anchor before the anchor moves on: a
# float32 of ms is good to ~4 ns at 100 ms.
ANCHOR_HOP_MS = 100.0
# Events created and recorded once when a stream is first seen, so the first regions on it do
# not pay CUDA event creation (+1.5 us each) inside the user's loop.
PREWARM_EVENTS = 32


def configure_core(harvest_batch: int = HARVEST_BATCH) -> None:
    """Hand the constants above to the core (the only place they are defined)."""
    _core.configure(
        inv_log_gamma=INV_LOG_GAMMA,
        harvest_batch=harvest_batch,
        anchor_hop_ms=ANCHOR_HOP_MS,
        prewarm=PREWARM_EVENTS,
    )


configure_core()

StreamKey = tuple[int, int, int]  # (stream id, device index, device type) as c10 gives it


class Device(Protocol):
    """What the recorder asks of a GPU. ``CudaDevice`` is torch's; tests give a fake one."""

    #: torch's own stream getter (the C core may then read c10's current stream directly).
    native: bool

    def get_stream(self, device: int) -> StreamKey: ...
    def is_capturing(self) -> bool: ...
    def is_initialized(self) -> bool: ...
    def stream(self, key: StreamKey) -> Any: ...
    def event_factory(self, device: int, stream: Any) -> tuple[Callable[[], Any], int | None]:
        """(a function that makes a timing event, the cudaStream_t to record through the
        runtime, or None to record with torch's ``record``)."""
        ...

    def stamps(self, device: int) -> Any:
        """The device timestamps of CUDA graphs (``_stamps.Stamps``), or None."""
        ...

    def marker(self, key: StreamKey) -> Any:
        """An event (no timing) recorded on stream ``key`` now, for another stream to wait on."""
        ...

    def allocator(self) -> Allocator | None:
        """The caching allocator the memory columns read (``Allocator``), or None."""
        ...


class Allocator(Protocol):
    """What the memory columns (``memory=True``, ``sources/_memory.py``) ask of the CUDA
    caching allocator: a marker per region boundary in its own event history, and that
    history read back. ``CudaAllocator`` is torch's; tests give a fake one.

    The allocator records every allocation and free in a per-device history with the calling
    thread's metadata string; a boundary sets that string (``tag``), so reading the history
    places each event between two boundaries of its thread, and the attribution to regions is
    done when the history is read (``read``), never at a boundary."""

    def why_not(self) -> str | None:
        """None when the history can be used; else why not (shown once in the report)."""
        ...

    def start(self) -> str | None:
        """Have the history recorded from now on (once); None, or why it cannot be."""
        ...

    def pause(self) -> bool:
        """Stop recording the history (what it holds is dropped: read it first), if cudatimer
        turned it on; False (nothing done) when it is the program's own."""
        ...

    def resume(self) -> None:
        """Record the history again after ``pause`` (from empty)."""
        ...

    #: Set the calling thread's metadata string: what the allocator puts on its next events.
    tag: Callable[[str], None]

    @property
    def ring(self) -> int | None:
        """Events the history holds between two reads (None: the program's own history, of a
        size not known here, is read at reports only)."""
        ...

    def read(self) -> tuple[dict[int, list[tuple[str, int]]], set[int]]:
        """The events recorded since the last read, per device, oldest first, as (metadata,
        signed bytes: + allocated, - freed); and the devices where events were lost since
        the last read (the history's ring overflowed, or was cleared). RuntimeError, saying
        why, once the history cannot be read any more (the program turned it off)."""
        ...

    def usage(self, device: int) -> tuple[int, int]:
        """(bytes allocated, bytes reserved) on ``device`` now: one full statistics read
        (~77 us), for out-of-memory notes only."""
        ...


class CudaDevice:
    """torch's CUDA."""

    native = True

    def __init__(self) -> None:
        c: Any = torch._C
        self.get_stream: Callable[[int], StreamKey] = c._cuda_getCurrentStream
        self._capturing: Callable[[], bool] = c._cuda_isCurrentStreamCapturing
        self._allocator: CudaAllocator | None = None

    def is_capturing(self) -> bool:
        return self._capturing()

    def is_initialized(self) -> bool:
        return bool(torch.cuda.is_initialized())  # type: ignore[no-untyped-call]

    def stream(self, key: StreamKey) -> Any:
        return torch.cuda.Stream(  # type: ignore[no-untyped-call]
            stream_id=key[0], device_index=key[1], device_type=key[2]
        )

    def event_factory(self, device: int, stream: Any) -> tuple[Callable[[], Any], int | None]:
        """Prefer the C++ ``torch.Event`` (cheaper record, and its ``event_id`` is the handle
        the C core records through the runtime); fall back to ``torch.cuda.Event``."""
        generic = getattr(torch, "Event", None)
        if generic is not None:
            name = f"cuda:{device}"
            try:
                probe = generic(device=name, enable_timing=True)
                probe.record(stream)
                if isinstance(getattr(probe, "event_id", None), int):
                    return (
                        lambda: generic(device=name, enable_timing=True),
                        int(stream.cuda_stream) if _core.runtime_bound() else None,
                    )
                return lambda: generic(device=name, enable_timing=True), None
            except (TypeError, RuntimeError, AttributeError):
                pass
        return lambda: torch.cuda.Event(enable_timing=True), None  # type: ignore[no-untyped-call]

    def stamps(self, device: int) -> Any:
        from ._stamps import cuda_stamps

        return cuda_stamps(device)

    def marker(self, key: StreamKey) -> Any:
        event = torch.cuda.Event()  # type: ignore[no-untyped-call]
        event.record(self.stream(key))
        return event

    def allocator(self) -> Allocator | None:
        if self._allocator is None:
            self._allocator = CudaAllocator()
        return self._allocator


# The allocator's history ring, per device: 65536 events of ~150 bytes (~10 MB of host
# memory a device). The memory columns read it when about half of it is new
# (``sources/_memory.py``), and cleared after each read, so each event is converted once.
HISTORY_ENTRIES = 65536
# What the history leaves out: only an allocation and a free request move the allocated
# bytes; a free completed later (after record_stream), segments and snapshots would take
# half the ring.
_SKIP_ACTIONS = ["free_completed", "segment_alloc", "segment_free", "snapshot", "oom"]
_MOVES = {"alloc": 1, "free_requested": -1}


def _no_tag(text: str) -> None:
    """The marker of a torch that has none (``why_not`` says so; never called then)."""


def _event_key(e: dict[str, Any]) -> tuple[Any, ...]:
    return (e.get("time_us"), e.get("action"), e.get("addr"), e.get("size"), e.get("user_metadata"))


class CudaAllocator:
    """torch's caching allocator, read through its own event history
    (``torch.cuda.memory._record_memory_history``) with a thread's metadata string as the
    boundary marker (``torch.cuda.memory._set_memory_metadata``, torch >= 2.10: one C call
    taking a str). Reading the statistics at each boundary instead (``memory_allocated()``, ~77 us:
    it builds the whole statistics dict) would cost more than the regions themselves, and
    could not see a peak between two boundaries without resetting the user's
    ``max_memory_allocated()``.

    The history is turned on once, without stack traces, unless the program records it
    already (then its settings are kept and it is only read, never turned off). Between two
    measured episodes of ``memory_every`` it is turned off (``pause``; turning it off drops
    what it holds, so it is read first) and on again (``resume``). Each event costs the allocator
    a ring entry in C++; sizes are the bytes the tensors asked for (before rounding)."""

    def __init__(self) -> None:
        self._set: Callable[[str], None] | None = getattr(torch._C, "_cuda_setMemoryMetadata", None)
        self.tag: Callable[[str], None] = self._set or _no_tag
        self._started = False
        self._owned = False  # turned on here: cleared after each read, so none is read twice
        self._stopped: str | None = None
        self._paused = False  # owned and turned off between measured episodes (``pause``)
        self._last: dict[int, tuple[Any, ...]] = {}  # not owned: the last event read, per device

    @property
    def ring(self) -> int | None:
        return HISTORY_ENTRIES if self._owned else None

    def why_not(self) -> str | None:
        if self._set is None:
            return (
                f"torch {torch.__version__} cannot mark the allocator's events "
                "(torch.cuda.memory._set_memory_metadata is new in torch 2.10)"
            )
        backend = torch.cuda.memory.get_allocator_backend()  # type: ignore[no-untyped-call]
        if backend != "native":
            return (
                f"the {backend} allocator backend keeps no event history (PYTORCH_CUDA_ALLOC_CONF "
                "selects it); the native caching allocator does"
            )
        return self._stopped

    def _record(self, clear: bool) -> None:
        options: dict[str, Any] = {
            "context": None,
            "stacks": "python",
            "max_entries": HISTORY_ENTRIES,
            "clear_history": clear,
        }
        record = torch.cuda.memory._record_memory_history
        try:
            record("all", skip_actions=_SKIP_ACTIONS, **options)
        except (TypeError, ValueError, RuntimeError):  # no skip_actions, or not one of them
            record("all", **options)

    def start(self) -> str | None:
        if not self._started:
            self._started = True
            try:
                if torch._C._cuda_isHistoryEnabled():
                    self._owned = False  # the program's own: read it, change nothing
                else:
                    self._record(clear=True)
                    self._owned = True
            except (RuntimeError, TypeError, ValueError, AttributeError) as exc:
                self._stopped = f"the allocator's history could not be turned on ({exc})"
        return self._stopped

    def pause(self) -> bool:
        if not self._owned or self._stopped is not None:
            return False
        if not self._paused:
            self._paused = True
            try:
                torch.cuda.memory._record_memory_history(None)
            except (RuntimeError, TypeError, ValueError) as exc:
                self._stopped = f"the allocator's history could not be turned off ({exc})"
        return True

    def resume(self) -> None:
        if not self._paused or self._stopped is not None:
            return
        self._paused = False
        try:
            if torch._C._cuda_isHistoryEnabled():
                # The program turned its own history on meanwhile: read it, change nothing.
                self._owned = False
                self._last = {}
            else:
                self._record(clear=True)
        except (RuntimeError, TypeError, ValueError) as exc:
            self._stopped = f"the allocator's history could not be turned on again ({exc})"

    def read(self) -> tuple[dict[int, list[tuple[str, int]]], set[int]]:
        if self._paused and self._stopped is None:
            return {}, set()  # off between measured episodes: nothing new, nothing lost
        if self._stopped is None and not torch._C._cuda_isHistoryEnabled():
            self._stopped = (
                "the program turned the allocator's history off "
                "(torch.cuda.memory._record_memory_history(None))"
            )
        if self._stopped is not None:
            raise RuntimeError(self._stopped)
        traces: list[list[dict[str, Any]]] = torch.cuda.memory._snapshot().get("device_traces", [])
        if self._owned:
            self._record(clear=True)  # right after the read: what follows is all new
        events: dict[int, list[tuple[str, int]]] = {}
        lost: set[int] = set()
        for dev, entries in enumerate(traces):
            if not entries:
                continue
            first = 0
            if self._owned:
                if len(entries) >= HISTORY_ENTRIES:  # a full ring may have wrapped
                    lost.add(dev)
            else:
                last = self._last.get(dev)
                self._last[dev] = _event_key(entries[-1])
                if last is not None:
                    at = next(
                        (
                            i
                            for i in range(len(entries) - 1, -1, -1)
                            if _event_key(entries[i]) == last
                        ),
                        None,
                    )
                    if at is None:
                        lost.add(dev)
                    else:
                        first = at + 1
            moves = _MOVES
            events[dev] = [
                (e.get("user_metadata") or "", moves[e["action"]] * int(e["size"]))
                for e in entries[first:]
                if e["action"] in moves
            ]
        return events, lost

    def usage(self, device: int) -> tuple[int, int]:
        return (
            int(torch.cuda.memory_allocated(device)),  # type: ignore[no-untyped-call]
            int(torch.cuda.memory_reserved(device)),  # type: ignore[no-untyped-call]
        )


_HAS_CUDA_BUILD = all(
    hasattr(torch._C, n) for n in ("_cuda_getCurrentStream", "_cuda_isCurrentStreamCapturing")
)

UNDECIDED, USABLE, UNUSABLE = 0, 1, 2


class _Seam:
    """The device in use and what was decided about it."""

    def __init__(self, device: Device | None) -> None:
        self.device = device
        self.state = UNDECIDED if device is not None else UNUSABLE
        self.forked = False
        self.fork_warned = False


_seam = _Seam(CudaDevice() if _HAS_CUDA_BUILD else None)
_graveyard: list[Any] = []


def use(device: Device | None) -> Device | None:
    """Make ``device`` the GPU the recorder uses (None: no CUDA) and return the one before.
    Every stream record is dropped; a fake device counts as initialised at once. For tests."""
    global _seam
    old = _seam.device
    _core.forget_streams()
    _core.set_usable(False)
    _core.set_stream_getter(None, False)
    _seam = _Seam(device)
    if device is not None and not device.native and device.is_initialized():
        _set_usable()
    return old


def usable() -> bool:
    """True once CUDA is initialised in this process (never initialises it ourselves).

    A region entered before the program touched CUDA is timed on the host clock; from the
    first region after CUDA initialisation on, regions are timed with events. Checking
    ``torch.cuda.is_initialized()`` costs ~0.1 us and stops once the answer is yes.
    """
    seam = _seam
    if seam.state == UNDECIDED and seam.device is not None and seam.device.is_initialized():
        _set_usable()
    if seam.forked and not seam.fork_warned:
        seam.fork_warned = True
        warnings.warn(
            "cudatimer: this process was forked after CUDA was initialised in its parent, "
            "so CUDA cannot be used here; regions in this process are timed on the host "
            "clock (use the 'spawn' start method to time GPU work in workers)",
            RuntimeWarning,
            stacklevel=4,
        )
    return seam.state == USABLE


def _set_usable() -> None:
    seam = _seam
    device = seam.device
    assert device is not None
    seam.state = USABLE
    _core.set_stream_getter(device.get_stream, device.native and _trust_c10(device))
    _core.set_usable(True)


def _trust_c10(device: Device) -> bool:
    """Whether the C core may read c10's current stream itself: only if it reads what torch
    does (checked once, when CUDA becomes usable). Without a usable device c10's getter throws
    a C++ exception, which would abort the process through C: ask only once CUDA is up."""
    # C core only (declared in _speedups.pyi, which mypy does not see through _core.pyi).
    current: Callable[[], tuple[int, int, int] | None] | None = getattr(
        _core, "current_stream", None
    )
    if current is None or not torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        return False
    try:
        ours = current()
        return ours is not None and tuple(ours) == tuple(device.get_stream(-1))
    except Exception:  # any doubt: the getter is called
        return False


def current_key() -> StreamKey:
    device = _seam.device
    assert device is not None
    return device.get_stream(-1)


def capturing(key: StreamKey) -> bool:
    """Whether the current stream (``key``) captures a CUDA graph. Capture is impossible on
    the legacy default stream (id 0), so the check (~0.4 us) runs only for side streams."""
    device = _seam.device
    return key[0] != 0 and device is not None and device.is_capturing()


def rec_for(key: StreamKey) -> _core.StreamRec:
    """The record of stream ``key``, made when first seen."""
    rec = _core.stream_of(key)
    if rec is None:
        device = _seam.device
        assert device is not None
        stream = device.stream(key)
        make_event, raw = device.event_factory(key[1], stream)
        rec = _core.new_stream(key, stream, raw, make_event)
    return rec


def current_rec() -> _core.StreamRec | None:
    """The record of the current stream, or None when it is capturing a CUDA graph: a timing
    event recorded during capture poisons it (query/elapsed_time then raise 'invalid
    argument', even after replay), and any query during capture ruins the capture."""
    key = current_key()
    if capturing(key):
        return None
    return rec_for(key)


def stamps(device: int) -> Any:
    """The device timestamps for regions inside CUDA graphs on ``device``, or None."""
    seam = _seam
    if seam.device is None or seam.state != USABLE:
        return None
    return seam.device.stamps(device)


def allocator() -> Allocator | None:
    """The caching allocator of the GPU in use, once CUDA is initialised; None without it."""
    seam = _seam
    if seam.device is None or not usable():
        return None
    return seam.device.allocator()


def marker(key: StreamKey) -> Any:
    device = _seam.device
    assert device is not None
    return device.marker(key)


def clock_now(events: bool) -> int:
    """The clock a region entered now would be timed on: a device index, or -1 (host)."""
    if events and usable():
        rec = current_rec()
        if rec is not None:
            return rec.device
    return -1


def drain(timeout_s: float) -> int:
    """Resolve every finished sample, waiting at most ``timeout_s`` for the GPU (polling,
    never a blocking CUDA call); returns how many are still pending. Only reports call it."""
    if _seam.state != USABLE or _seam.forked:
        return 0
    return _core.drain(timeout_s)


# -- fork and exit ---------------------------------------------------------------------------
#: Called in a forked child with the grave: each Timer turns its open frames into host frames.
_on_fork: list[Callable[[list[Any]], None]] = []


def on_fork(hook: Callable[[list[Any]], None]) -> None:
    _on_fork.append(hook)


def _after_fork_in_child() -> None:
    seam = _seam
    bad_fork = getattr(torch.cuda, "_is_in_bad_fork", lambda: False)
    if seam.state != USABLE and not bad_fork():
        return
    # The child cannot touch the parent's CUDA context: every CUDA object the recorder holds
    # moves to a graveyard that is never freed (an event's destructor would call into the dead
    # context and print a CUDA warning per event at the child's exit).
    _core.set_usable(False)
    _core.forget_streams(_graveyard)
    for hook in _on_fork:
        hook(_graveyard)
    seam.state = UNUSABLE
    seam.forked = True
    seam.fork_warned = False
    # One extra reference that nothing releases: even interpreter teardown (which clears
    # module globals) never frees the graveyard, so no event destructor runs in this child.
    # The leak is the size of the parent's event pool, once per child.
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(_graveyard))


def _at_exit() -> None:
    """Interpreter exit: drop pending samples without waiting for the GPU, and time any region
    entered later (other exit handlers) on the host clock. Runs after the optional report at
    exit (atexit runs handlers last-registered first; this one is registered at import)."""
    if _seam.state == USABLE:
        _seam.state = UNUSABLE
        _core.set_usable(False)
    if not _seam.forked:  # a forked child must never destroy the parent's events
        _core.clear_pending()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_at_exit)
