"""Bracket a capture window for ``nsys profile --capture-range=cudaProfilerApi``."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

__all__ = ["nsight_capture"]

# cudaProfilerStart/Stop are process-wide and do not nest: only the outermost capture toggles
# them, so a library and its caller can both mark a window without cutting each other's short.
_lock = threading.Lock()
_depth = 0
_started = False


def _profiler(name: str) -> Callable[[], object]:
    # Looked up at each call, not imported once, so tests can patch torch.cuda.profiler; typed
    # here because torch leaves start/stop unannotated.
    fn: Callable[[], object] = getattr(torch.cuda.profiler, name)
    return fn


def _cuda_usable() -> bool:
    # A forked child of a CUDA parent cannot touch CUDA; a CPU build has nothing to profile.
    return bool(torch.cuda.is_available()) and not torch.cuda._is_in_bad_fork()


@contextmanager
def nsight_capture() -> Iterator[None]:
    """Tell an attached Nsight Systems to record only inside this block.

    Calls ``torch.cuda.profiler.start()`` on entry and ``stop()`` on exit, even when the body
    raises. Without CUDA it does nothing. Also usable as a decorator: ``@nsight_capture()``.
    Run under ``nsys profile --capture-range=cudaProfilerApi ...``.
    """
    global _depth, _started
    with _lock:
        _depth += 1
        if _depth == 1 and _cuda_usable():
            _profiler("start")()
            _started = True
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _started:
                _started = False
                _profiler("stop")()
