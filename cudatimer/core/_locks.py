"""Locks that a forked child gets anew: one held by another thread of the parent at the fork
would never be released in the child (20 of 20 children hung at their first region, with two
threads of the parent recording). For the rare, brief sections outside the core's hot path;
the core keeps its own lock (its hot path only ever tries it)."""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any

__all__ = ["ForkSafeLock"]

_ALL: weakref.WeakSet[ForkSafeLock] = weakref.WeakSet()


class ForkSafeLock:
    """``with lock:`` as with ``threading.Lock``; after ``os.fork()`` the child has a new one."""

    __slots__ = ("__weakref__", "_lock")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        _ALL.add(self)

    def __enter__(self) -> ForkSafeLock:
        self._lock.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._lock.release()


def _renew_in_child() -> None:
    for lock in list(_ALL):
        lock._lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_renew_in_child)
