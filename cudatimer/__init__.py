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
import sys
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Literal, overload

from ._version import __version__ as __version__
from .features import _exit
from .records._compare import Comparison, RegionVerdict, SpeedFactor
from .records._hist import ALPHA, Histogram
from .records._records import (
    SCHEMA_VERSION,
    Coverage,
    RegionStats,
    StepStats,
    Summary,
    SyncSite,
    TraceSample,
)
from .render._export import load

# Importing torch takes 2-4 s, and reading saved runs (the command line, load(), the
# renderers) needs none of it: so the names that need torch are bound on first use, all at
# once, by ``__getattr__`` below. Type checkers see them imported here.
if TYPE_CHECKING:
    from .distributed import RankSummary
    from .features._feed import StepFeed, StepTimes
    from .features._graphs import timed_replay
    from .features._instrument import Instrumented, instrument
    from .features._live import live
    from .features._nsight import nsight_capture
    from .features._syncs import SyncDetection, detect_syncs
    from .regions._timer import Region, Timer, default_timer

    cuda_region = default_timer().region

__all__ = [
    "ALPHA",
    "SCHEMA_VERSION",
    "Comparison",
    "Coverage",
    "Histogram",
    "Instrumented",
    "Region",
    "RegionStats",
    "RegionVerdict",
    "SpeedFactor",
    "StepFeed",
    "StepStats",
    "StepTimes",
    "Summary",
    "SyncDetection",
    "SyncSite",
    "Timer",
    "TraceSample",
    "compare",
    "compare_report",
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

#: The names whose modules import torch: bound together on first use of any of them.
_LAZY = frozenset(
    {
        "Instrumented",
        "Region",
        "StepFeed",
        "StepTimes",
        "SyncDetection",
        "Timer",
        "cuda_region",
        "default_timer",
        "detect_syncs",
        "instrument",
        "live",
        "nsight_capture",
        "timed_replay",
    }
)
_DEFAULT: Timer | None = None
#: Held while the lazy names load (by whichever thread uses one first).
_LOADING = threading.RLock()


def _load() -> Timer:
    """Import the modules that need torch, bind the lazy names, return the default Timer."""
    with _LOADING:
        return _DEFAULT if _DEFAULT is not None else _load_now()


def _load_now() -> Timer:
    global _DEFAULT
    from .features._feed import StepFeed, StepTimes
    from .features._graphs import timed_replay
    from .features._instrument import Instrumented, instrument
    from .features._live import live
    from .features._nsight import nsight_capture
    from .features._syncs import SyncDetection, detect_syncs
    from .regions._timer import Region, Timer, default_timer

    timer = default_timer()
    globals().update(
        Instrumented=Instrumented,
        Region=Region,
        StepFeed=StepFeed,
        StepTimes=StepTimes,
        SyncDetection=SyncDetection,
        Timer=Timer,
        # A region of the default Timer: ``with cuda_region("fwd"):`` or
        # ``@cuda_region("fwd")``, with the options of :meth:`Timer.region`. It is the Timer's
        # own bound method, so ``with cuda_region("x"):`` in a loop costs one call and one
        # dict hit, no wrapper frame (and, bound here, no ``__getattr__`` call either).
        cuda_region=timer.region,
        default_timer=default_timer,
        detect_syncs=detect_syncs,
        instrument=instrument,
        live=live,
        nsight_capture=nsight_capture,
        timed_replay=timed_replay,
    )
    _DEFAULT = timer
    return timer


def _timer() -> Timer:
    """The default Timer (importing torch the first time)."""
    return _DEFAULT if _DEFAULT is not None else _load()


if not TYPE_CHECKING:  # type checkers read the imports above instead

    def __getattr__(name: str) -> Any:
        if name in _LAZY:
            _load()
            return globals()[name]
        raise AttributeError(f"module 'cudatimer' has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(globals()) | set(__all__))


def cuda_timed(fn: Any = None, /, name: str | None = None, **options: Any) -> Any:
    """Decorator: ``@cuda_timed``, ``@cuda_timed("name")`` or ``@cuda_timed(name=..., **opts)``.

    Works on functions, methods, class and static methods, ``nn.Module.forward`` (or a module
    instance, or an nn.Module subclass), async functions (timed until the coroutine finishes),
    generator functions (each resume is one call), ``@contextmanager`` functions and context
    manager classes (timed from ``__enter__`` to ``__exit__``). The default name is the
    function's ``__qualname__``. ``every=N`` times one call in N and counts them all.
    """
    return _timer().timed(fn, name=name, **options)


def report(
    *positional: object, all_ranks: bool = False, summary: Summary | None = None, **options: Any
) -> str:
    """Print the default Timer's table and return it (reading never clears results).

    Options: see :meth:`Timer.report` (``view="tree"``, ``sort``, ``fmt``, ``columns``,
    ``match``, ``min_share``, ``last``/``steps``/``warmup``, ``file``, ``logger``).
    ``summary=``: render that Summary instead (e.g. ``cudatimer.load("run.json")``); it is a
    keyword, and a positional argument is refused with that hint.

    ``all_ranks=True``: the cross-rank table of a torch.distributed job, printed on rank 0;
    every rank must call it (options: see ``cudatimer.distributed.report``).
    """
    if positional:
        what = type(positional[0]).__name__
        raise TypeError(
            f"report() takes keyword arguments only, got {len(positional)} positional "
            f"({what}); to print a saved or computed run, pass it as "
            "report(summary=cudatimer.load(path))"
        )
    if not isinstance(all_ranks, bool):
        raise TypeError(f"all_ranks must be True or False, got {type(all_ranks).__name__}")
    if all_ranks:
        from . import distributed

        return distributed.report(_timer() if summary is None else summary, **options)
    timer = _timer()
    return timer.report(summary=summary, **options)


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

        return distributed.summary(_timer(), timeout_s=timeout_s, **options)
    return _timer().summary(timeout_s=timeout_s, **options)


def reset() -> None:
    """Clear the default Timer's results."""
    _timer().reset()


def enable() -> None:
    """Turn the default Timer on."""
    _timer().enable()


def disable() -> None:
    """Turn the default Timer off: regions do no timing and emit no NVTX."""
    _timer().disable()


def is_enabled() -> bool:
    return _timer().enabled


def compiled() -> bool:
    """True when the recorder runs its C core (``cudatimer.core._speedups``, built at install where
    a C compiler is present; it records events through the CUDA runtime torch loaded); False
    means its Python reference runs (not built, or ``CUDATIMER_PURE_PYTHON=1``).

    >>> import cudatimer
    >>> isinstance(cudatimer.compiled(), bool)
    True
    """
    from .core import _core

    return bool(_core.IMPL == "c")


def step() -> int:
    """Mark an iteration boundary of the default Timer; returns the new step number."""
    return _timer().step()


def save(path: str | os.PathLike[str], *, timeout_s: float = 60.0, **window: Any) -> Summary:
    """Write the default Timer's summary as JSON, with per-step stats and trace samples;
    ``cudatimer.load(path)`` reads it back exactly. ``window``: ``last``/``steps``/``warmup``."""
    return _timer().save(path, timeout_s=timeout_s, **window)


def step_series(**window: Any) -> tuple[StepStats, ...]:
    """Per-step time of every region of the default Timer (``StepStats`` records).

    ``window``: ``last``, ``steps``, ``warmup`` as for :func:`summary`; see
    :meth:`Timer.step_series`.
    """
    return _timer().step_series(**window)


def export_trace(
    path: str | os.PathLike[str] | Any, *, summary: Summary | None = None, **window: Any
) -> None:
    """Write a Chrome/Perfetto trace (JSON) of the default Timer's last calls, or of
    ``summary.trace`` (e.g. a loaded run); open it in https://ui.perfetto.dev."""
    _timer().export_trace(path, summary=summary, **window)


def to_csv(
    path: str | os.PathLike[str] | Any,
    *,
    what: str = "regions",
    summary: Summary | None = None,
    **window: Any,
) -> None:
    """Write regions, per-step stats (``what="steps"``) or trace samples (``"trace"``) as CSV,
    of the default Timer or of ``summary``."""
    _timer().to_csv(path, what=what, summary=summary, **window)


def to_dataframe(*, what: str = "regions", summary: Summary | None = None, **window: Any) -> Any:
    """A pandas DataFrame of regions, per-step stats (``what="steps"``) or trace samples
    (``"trace"``), of the default Timer or of ``summary``. Needs pandas."""
    return _timer().to_dataframe(what=what, summary=summary, **window)


def plot(
    path: str | os.PathLike[str] | Any,
    *,
    summary: Summary | None = None,
    top: int = 12,
    **window: Any,
) -> None:
    """Write a picture of where time goes (top regions, GPU vs CPU, time per step) for the
    default Timer or ``summary``, in the format the path's suffix names: ``.png``, ``.svg`` or
    ``.pdf`` (another is refused). Needs matplotlib."""
    _timer().plot(path, summary=summary, top=top, **window)


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
    _timer().html(path, summary=summary, base=base, top=top, title=title, **options)


def compare(
    base: Any,
    new: Any,
    *,
    max_slowdown: float = 0.05,
    stat: str = "p50",
    confidence: float = 0.95,
    match: str | None = None,
    min_ms: float = 0.0,
    fail_undecided: bool = False,
    fail_missing: bool = False,
    allow_other_device: bool = False,
    labels: tuple[str, str] = ("base", "new"),
    absolute: bool = False,
    between_run: float | None = None,
) -> Comparison:
    """The performance gate: per-region verdicts of ``new`` against ``base`` (docs/gate.md).

    ``base`` and ``new``: a Summary, a path to a saved run, a folder of runs, or a list of
    them (pooled: e.g. earlier runs of the main branch); folders of ``rank{N}.json`` files
    compare rank by rank. A region is "slower" when ``new / base`` of its ``stat`` (p50, p90,
    p99, mean or per_step) is significantly above 1 and its interval reaches past
    ``1 + max_slowdown``; intervals hold at ``confidence`` for all regions together. Runs of
    different devices are refused unless ``allow_other_device``. Each region's ratio is
    divided by the run-wide speed factor (the median ratio of the other regions of its rank
    and clock, where 4 or more are tested), so that the whole machine running slower is no
    regression; ``absolute=True`` gates raw ratios. ``between_run``: the spread between runs
    assumed with one run on each side (default 0.005).

    >>> import cudatimer
    >>> def run(ms):
    ...     return cudatimer.Summary((cudatimer.RegionStats(
    ...         "fwd", "host", 50, None, cudatimer.Histogram.of([ms] * 50)),))
    >>> result = cudatimer.compare(run(2.0), run(2.5), max_slowdown=0.05)
    >>> result.ok, [(v.name, v.verdict) for v in result.regressions]
    (False, [('fwd', 'slower')])
    """
    from .render._gate import as_side, compare_sides

    return compare_sides(
        as_side(base),
        as_side(new),
        max_slowdown=max_slowdown,
        stat=stat,
        confidence=confidence,
        match=match,
        min_ms=min_ms,
        fail_undecided=fail_undecided,
        fail_missing=fail_missing,
        allow_other_device=allow_other_device,
        labels=labels,
        absolute=absolute,
        between_run=between_run,
    )


def compare_report(comparison: Comparison, *, fmt: str = "simple") -> str:
    """The table of a :func:`compare` result: base, new, ratio, its interval and the verdict
    per region, then the method's notes; ``fmt="github"`` makes a pull-request comment."""
    from .render._report import render_gate

    return render_gate(comparison, fmt=fmt)


def _report_at_exit() -> None:
    """The opt-in report at exit, of the Timers there are: none if nothing imported the
    regions (a program that only read saved runs), which then do not import torch at exit."""
    if "cudatimer.regions._timer" in sys.modules:
        _exit.report_at_exit()


if _exit.ENABLED:
    atexit.register(_report_at_exit)


def mark(
    name: str,
    *,
    color: int | str | None = None,
    category: int | str | None = None,
    payload: float | None = None,
) -> None:
    """An instant NVTX marker in the default Timer's domain: ``cudatimer.mark("checkpoint")``."""
    _timer().mark(name, color=color, category=category, payload=payload)


def _wait_for_a_load() -> None:
    """Before ``os.fork``: wait for a thread that is loading the lazy names. Forked in the
    middle, the child inherits its import locks held by a thread it does not have, and hangs
    at its first region (torch's import is a 2 s window)."""
    with _LOADING:
        pass


if "torch" in sys.modules:  # imported first, as usual: waiting saves nothing
    _load()
elif hasattr(os, "register_at_fork"):
    # Fork hooks run last-registered first. logging's and concurrent.futures' take a lock
    # before a fork and release it after (torch imports both): registered while ours waits,
    # theirs would be released without being taken ("release unlocked lock"); registered
    # after ours, logging's would hold its lock while ours waits for a thread whose torch
    # import needs it. Imported first (3 ms and 2 ms), their hooks run after ours.
    import concurrent.futures.thread  # noqa: F401
    import logging  # noqa: F401

    os.register_at_fork(before=_wait_for_a_load)
