"""cudatimer: where PyTorch GPU time goes, from CUDA events and NVTX ranges, never synchronizing.

>>> import cudatimer
>>> @cudatimer.cuda_timed
... def forward(x):
...     return x * 2
>>> with cudatimer.cuda_region("step"):
...     _ = forward(3)
>>> cudatimer.summary()["step/forward"].calls
1
>>> cudatimer.reset()
"""

from __future__ import annotations

import atexit
import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Literal, overload

from ._version import __version__ as __version__
from .features import _exit
from .features._feed import StepFeed, StepTimes
from .features._graphs import timed_replay
from .features._instrument import Instrumented, instrument
from .features._live import live
from .features._nsight import nsight_capture
from .features._syncs import SyncDetection, detect_syncs
from .records._hist import ALPHA, Histogram
from .records._records import SCHEMA_VERSION, RegionStats, StepStats, Summary, SyncSite, TraceSample
from .regions import _timer
from .regions._timer import Region, Timer, default_timer
from .render._export import load

if TYPE_CHECKING:
    from .distributed import RankSummary

__all__ = [
    "ALPHA",
    "SCHEMA_VERSION",
    "Histogram",
    "Instrumented",
    "Region",
    "RegionStats",
    "StepFeed",
    "StepStats",
    "StepTimes",
    "Summary",
    "SyncDetection",
    "SyncSite",
    "Timer",
    "TraceSample",
    "compiled",
    "cuda_region",
    "cuda_timed",
    "default_timer",
    "detect_syncs",
    "disable",
    "enable",
    "export_trace",
    "html",
    "instrument",
    "is_enabled",
    "live",
    "load",
    "mark",
    "nsight_capture",
    "plot",
    "report",
    "reset",
    "save",
    "step",
    "step_series",
    "summary",
    "timed_replay",
    "to_csv",
    "to_dataframe",
]
_DEFAULT = default_timer()


#: A region of the default Timer: ``with cuda_region("fwd"):`` or ``@cuda_region("fwd")``,
#: with the options of :meth:`Timer.region` (``mode``, ``color``, ``category``, ``payload``,
#: ``clock``, ``streams``, ``every``). It is the default Timer's own bound method, so
#: ``with cuda_region("x"):`` in a loop costs one call and one dict hit, no wrapper frame.
cuda_region = _DEFAULT.region


def cuda_timed(fn: Any = None, /, name: str | None = None, **options: Any) -> Any:
    """Decorator: ``@cuda_timed``, ``@cuda_timed("name")`` or ``@cuda_timed(name=..., **opts)``.

    Works on functions, methods, class and static methods, ``nn.Module.forward`` (or a module
    instance, or an nn.Module subclass), async functions (timed until the coroutine finishes),
    generator functions (each resume is one call), ``@contextmanager`` functions and context
    manager classes (timed from ``__enter__`` to ``__exit__``). The default name is the
    function's ``__qualname__``. ``every=N`` times one call in N and counts them all.
    """
    return _DEFAULT.timed(fn, name=name, **options)


def report(*, all_ranks: bool = False, summary: Summary | None = None, **options: Any) -> str:
    """Print the default Timer's table and return it (reading never clears results).

    Options: see :meth:`Timer.report` (``view="tree"``, ``sort``, ``fmt``, ``columns``,
    ``match``, ``min_share``, ``last``/``steps``/``warmup``, ``file``, ``logger``).
    ``summary=``: render that Summary instead (e.g. ``cudatimer.load("run.json")``).

    ``all_ranks=True``: the cross-rank table of a torch.distributed job, printed on rank 0;
    every rank must call it (options: see ``cudatimer.distributed.report``).
    """
    if not isinstance(all_ranks, bool):
        raise TypeError(f"all_ranks must be True or False, got {type(all_ranks).__name__}")
    if all_ranks:
        from . import distributed

        return distributed.report(_DEFAULT if summary is None else summary, **options)
    return _DEFAULT.report(summary=summary, **options)


@overload
def summary(
    *,
    timeout_s: float = ...,
    all_ranks: Literal[False] = ...,
    last: int | None = ...,
    steps: Iterable[int] | None = ...,
    warmup: int = ...,
    step_stats: bool = ...,
    trace: bool = ...,
) -> Summary: ...
@overload
def summary(
    *, timeout_s: float = ..., all_ranks: Literal[True], **options: Any
) -> RankSummary | None: ...
def summary(
    *, timeout_s: float = 60.0, all_ranks: bool = False, **options: Any
) -> Summary | RankSummary | None:
    """The default Timer's results as frozen records.

    ``all_ranks=True``: every rank's results as a ``cudatimer.distributed.RankSummary`` on rank
    0 (None on the others); every rank must call it (options: ``cudatimer.distributed.summary``).
    Otherwise options pick a window of steps and extras, see :meth:`Timer.summary` (``last``,
    ``steps``, ``warmup``, ``step_stats``, ``trace``).
    """
    if not isinstance(all_ranks, bool):
        raise TypeError(f"all_ranks must be True or False, got {type(all_ranks).__name__}")
    if all_ranks:
        from . import distributed

        return distributed.summary(_DEFAULT, timeout_s=timeout_s, **options)
    return _DEFAULT.summary(timeout_s=timeout_s, **options)


def reset() -> None:
    """Clear the default Timer's results."""
    _DEFAULT.reset()


def enable() -> None:
    """Turn the default Timer on."""
    _DEFAULT.enable()


def disable() -> None:
    """Turn the default Timer off: regions do no timing and emit no NVTX."""
    _DEFAULT.disable()


def is_enabled() -> bool:
    return _DEFAULT.enabled


def compiled() -> bool:
    """True when the recorder runs its C core (``cudatimer.core._speedups``, built at install where
    a C compiler is present; it records events through the CUDA runtime torch loaded); False
    means its Python reference runs (not built, or ``CUDATIMER_PURE_PYTHON=1``).

    >>> import cudatimer
    >>> isinstance(cudatimer.compiled(), bool)
    True
    """
    return _timer.compiled()


def step() -> int:
    """Mark an iteration boundary of the default Timer; returns the new step number."""
    return _DEFAULT.step()


def save(path: str | os.PathLike[str], *, timeout_s: float = 60.0, **window: Any) -> Summary:
    """Write the default Timer's summary as JSON, with per-step stats and trace samples;
    ``cudatimer.load(path)`` reads it back exactly. ``window``: ``last``/``steps``/``warmup``."""
    return _DEFAULT.save(path, timeout_s=timeout_s, **window)


def step_series(**window: Any) -> tuple[StepStats, ...]:
    """Per-step time of every region of the default Timer (``StepStats`` records).

    ``window``: ``last``, ``steps``, ``warmup`` as for :func:`summary`; see
    :meth:`Timer.step_series`.
    """
    return _DEFAULT.step_series(**window)


def export_trace(
    path: str | os.PathLike[str] | Any, *, summary: Summary | None = None, **window: Any
) -> None:
    """Write a Chrome/Perfetto trace (JSON) of the default Timer's last calls, or of
    ``summary.trace`` (e.g. a loaded run); open it in https://ui.perfetto.dev."""
    _DEFAULT.export_trace(path, summary=summary, **window)


def to_csv(
    path: str | os.PathLike[str] | Any,
    *,
    what: str = "regions",
    summary: Summary | None = None,
    **window: Any,
) -> None:
    """Write regions, per-step stats (``what="steps"``) or trace samples (``"trace"``) as CSV,
    of the default Timer or of ``summary``."""
    _DEFAULT.to_csv(path, what=what, summary=summary, **window)


def to_dataframe(*, what: str = "regions", summary: Summary | None = None, **window: Any) -> Any:
    """A pandas DataFrame of regions, per-step stats (``what="steps"``) or trace samples
    (``"trace"``), of the default Timer or of ``summary``. Needs pandas."""
    return _DEFAULT.to_dataframe(what=what, summary=summary, **window)


def plot(
    path: str | os.PathLike[str] | Any,
    *,
    summary: Summary | None = None,
    top: int = 12,
    **window: Any,
) -> None:
    """Write a PNG of where time goes (top regions, GPU vs CPU, time per step) for the default
    Timer or ``summary``. Needs matplotlib."""
    _DEFAULT.plot(path, summary=summary, top=top, **window)


def html(
    path: str | os.PathLike[str] | Any,
    *,
    summary: Summary | RankSummary | None = None,
    base: Summary | None = None,
    top: int = 8,
    title: str | None = None,
    **options: Any,
) -> None:
    """Write one self-contained HTML report (no network needed to open it) of the default
    Timer or ``summary``: the region tree (GPU and CPU time, sortable, collapsible), the
    per-step time of the ``top`` regions, the sync sites, and with ``base`` a comparison.

    ``summary`` may be a cross-rank ``RankSummary`` (``cudatimer.summary(all_ranks=True)``
    on rank 0): the page then leads with the cross-rank table. ``options``: ``stat`` and
    ``tolerance`` of the comparison, ``last``/``steps``/``warmup``, ``timeout_s``; see
    :meth:`Timer.html`.
    """
    _DEFAULT.html(path, summary=summary, base=base, top=top, title=title, **options)


if _exit.ENABLED:
    atexit.register(_exit.report_at_exit)


def mark(
    name: str,
    *,
    color: int | str | None = None,
    category: int | str | None = None,
    payload: float | None = None,
) -> None:
    """An instant NVTX marker in the default Timer's domain: ``cudatimer.mark("checkpoint")``."""
    _DEFAULT.mark(name, color=color, category=category, payload=payload)
