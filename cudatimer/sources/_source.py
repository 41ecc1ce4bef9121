"""The seam between the recorder and its boundary sources, and the one registry of Timers.

A boundary source records what a region's own enter and exit cannot: marks traced into
compiled code (``_compile``), device timestamps inside CUDA graphs (``_capture``), backward
rows opened by autograd (``_backward``), synchronisations counted against the open region
(``_sync_counts``). Each Recorder holds one object per source, which keeps that recorder's
state of the source, and reads them all through ``Source``:

>>> from cudatimer.regions._timer import Timer
>>> rec = Timer(name="seam").recorder
>>> [type(s).__name__ for s in rec.sources]
['CompileNotes', 'Graphs', 'BackwardRows', 'SyncCounts', 'MemoryCalls', 'FlopCalls']
>>> sum(s.pending() for s in rec.sources), [n for s in rec.sources for n in s.notes()]
(0, [])

A new source adds a class with these four methods and one line in ``Recorder.__init__``;
the summary and ``reset()`` loop over ``Recorder.sources`` and need no change.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable
from typing import Any, Protocol

from ..core._locks import fork_safe_lock

__all__ = ["TIMERS", "Host", "Probe", "Registry", "Source"]


class Source(Protocol):
    """What a Recorder asks of each boundary source it holds."""

    def drain(self, timeout_s: float) -> None:
        """Fold into the recorder's store what this source holds for it and is ready,
        waiting for the GPU at most ``timeout_s`` (a report calls it first)."""
        ...

    def pending(self) -> int:
        """Region calls this source holds and has not folded yet (``Summary.pending``)."""
        ...

    def notes(self) -> tuple[tuple[str, str], ...]:
        """The report's notes on what this source could not time, as (meta key, text)."""
        ...

    def reset(self) -> None:
        """Forget what this source keeps of the recorder's results and notes
        (``Timer.reset``; the recorder holds its lock and has moved its generation on)."""
        ...


class Probe(Protocol):
    """What a region option that measures each call (``memory=True``: ``_memory.MEMORY``)
    adds around the call. Decided when the region is made (``Region.probes``): a region
    without probes runs its enter and exit as before, nothing tested per call."""

    #: The region option that adds it.
    option: str
    #: The region options that made it (a region's backward row gets them too).
    options: dict[str, Any]

    def enter(self, region: Any) -> None:
        """After the region's own enter: its frame is the top of the thread's stack."""
        ...

    def exit(self, region: Any, exc: BaseException | None) -> None:
        """Before the region's own exit (``exc``: what the block raised, or None)."""
        ...

    def detached(
        self, region: Any, open_: Callable[[], Any], close: Callable[[Any], None]
    ) -> tuple[Callable[[], Any], Callable[[Any], None]]:
        """``open_`` (returns a token) and ``close(token)`` of a detached call of ``region``
        (a backward row, a coroutine), measured."""
        ...


class Host(Protocol):
    """What a source reads of the Recorder it belongs to (``recorder._recorder.Recorder``)."""

    store: Any
    tree: Any
    lock: Any

    def live_top(self, stack: Any) -> Any:
        """The innermost live frame of ``stack`` (frames closed by other threads dropped)."""
        ...

    def detached(self, r: Any, stack: Any, slot: int, gen: int) -> Any:
        """A detached region's frame (``Recorder.begin``'s), at ``slot``."""
        ...

    def end(self, r: Any, token: Any) -> None:
        """Close a detached region opened by ``detached``."""
        ...


class Registry:
    """Every live Timer, by number. Dynamo folds ints and strings into traced code, not
    objects (torch 2.11 refused a Timer as an argument of an ``assume_constant_result``
    function), so compiled code names its Timer by this number. Numbers are never reused:
    a graph compiled for a Timer since collected finds nothing, never another Timer.

    >>> reg = Registry()
    >>> class T: ...
    >>> t = T()
    >>> key = reg.add(t)
    >>> reg.get(key) is t, reg.live() == [t]
    (True, True)
    >>> del t
    >>> import gc; _ = gc.collect()
    >>> reg.get(key), reg.live()
    (None, [])
    """

    def __init__(self) -> None:
        self._by_key: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
        self._keys = itertools.count()
        self._lock = fork_safe_lock()

    def add(self, timer: Any) -> int:
        """Register ``timer`` (held weakly); returns its number."""
        with self._lock:
            key = next(self._keys)
            self._by_key[key] = timer
        return key

    def get(self, key: int) -> Any:
        """The live Timer numbered ``key``, or None."""
        return self._by_key.get(key)

    def live(self) -> list[Any]:
        """Every live Timer, oldest first."""
        with self._lock:
            return list(self._by_key.values())


#: The one registry of Timers: ``live_timers()``, fork handling, sync detection and the
#: marks inside compiled code all read it.
TIMERS = Registry()
