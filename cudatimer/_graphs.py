"""CUDA graphs: time replays, never captures.

A timing event recorded while a stream captures poisons the capture (``query`` and
``elapsed_time`` then raise "invalid argument", even after replay), and any query during
capture ruins it (measured on an H200). So a region entered while its stream captures
records no event: it is timed on the host clock and counted as ``skipped`` (the report says so).
Replays are ordinary stream work: a region around ``graph.replay()`` is timed like any other,
which :func:`timed_replay` spells out.

Per-region GPU time *inside* a replay is not measured: external events
(``torch.cuda.Event(enable_timing=True, external=True)``) can be captured as graph nodes, but each
replay overwrites them, so without synchronising only the latest replay could be read.
"""

from __future__ import annotations

from typing import Any

from ._timer import Timer

__all__ = ["timed_replay"]


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
    from . import default_timer

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
