"""CUDA graphs: regions captured into a graph are timed on every replay.

A region entered while its stream captures a graph through ``torch.cuda.CUDAGraph`` (so
``torch.cuda.graph``, ``make_graphed_callables`` and ``torch.compile(mode="reduce-overhead")``)
captures a device timestamp at enter and at exit (``_capture``, ``_stamps``); each replay
yields one sample per captured region call, nested under the region open around the replay.
A timing event is never recorded in capture: it would poison the graph (``query`` and
``elapsed_time`` then raise "invalid argument", even after replay; measured on an H200).
A capture begun another way (``cudaStreamBeginCapture`` outside torch) still times its
regions on the host clock only, counted as ``skipped``.

A replay as a whole is ordinary stream work: a region around ``graph.replay()`` times it, which
:func:`timed_replay` spells out.
"""

from __future__ import annotations

from typing import Any

from .._config import DISABLED_AT_IMPORT
from ..regions._timer import Timer
from ..sources import _capture

__all__ = ["timed_replay"]

# At import, not at first use: a graph's ring must exist before its capture begins, and a
# program may begin a capture before its first cudatimer call (its first region made inside
# the capture); set up inside the capture instead, the ring's allocation invalidates it in
# torch's default capture mode (H200, torch 2.11; docs/design.md, "The seams").
if not DISABLED_AT_IMPORT:  # CUDATIMER_DISABLE=1: torch's CUDAGraph is left as it is
    _capture.install()


def timed_replay(graph: Any, name: str = "graph.replay", *, timer: Timer | None = None) -> None:
    """Replay a captured CUDA graph inside a region named ``name`` (GPU time: the whole
    replay on the current stream; CPU time: the launch).

    >>> import cudatimer  # doctest: +SKIP
    >>> g = torch.cuda.CUDAGraph()  # doctest: +SKIP
    >>> with torch.cuda.graph(g):  # doctest: +SKIP
    ...     y = model(static_x)
    >>> for _ in range(100):  # doctest: +SKIP
    ...     cudatimer.timed_replay(g, "decode")

    The same as ``with cudatimer.cuda_region(name): graph.replay()``.
    """
    from ..regions._timer import default_timer

    replay = getattr(graph, "replay", None)
    if not callable(replay):
        raise TypeError(
            f"graph must be a captured torch.cuda.CUDAGraph (anything with replay()), got "
            f"{type(graph).__name__}"
        )
    if timer is None:
        timer = default_timer()
    elif not isinstance(timer, Timer):
        raise TypeError(f"timer must be a cudatimer.Timer or None, got {type(timer).__name__}")
    region = timer.region(name)
    with region:
        replay()
