"""The one output path of a Timer: every report, file and table of its results goes through
``output``, as a profiler's renderers go through one ``output(renderer)``::

    options checked -> target checked -> resolve -> render -> write
    (per verb)         (render._write)   (below)    (render/)  (render._write.Target)

``resolve`` is where a window of steps is applied, with one rule for every output (text, JSON,
CSV, DataFrame, trace, PNG, HTML, step series): a window that holds no step is a ValueError
naming the window and the steps there were, never an empty report or file. Every output takes
the same window options (``Window``); a given ``summary=`` is rendered as it is. The Timer's
verbs, the module-level functions and ``cudatimer.distributed`` call the functions here.

>>> import cudatimer, io
>>> t = cudatimer.Timer(name="out")
>>> for _ in range(3):
...     with t.region("it"):
...         pass
...     _ = t.step()
>>> try:
...     t.report(warmup=100, file=io.StringIO())
... except ValueError as exc:
...     print(str(exc).split(": it asks")[0])
report(warmup=100): the window holds no step
"""

from __future__ import annotations

import difflib
import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import IO, Any, Protocol, TypedDict, TypeVar

from ..recorder._recorder import Recorder
from ..records._ranks import RankSummary
from ..records._records import StepStats, Summary
from ..render._write import Target, to_file, to_path, to_print

__all__ = [
    "HtmlOptions",
    "PlotOptions",
    "ReportOptions",
    "SummaryOptions",
    "TableOptions",
    "TraceOptions",
    "Window",
    "export_trace",
    "html",
    "output",
    "plot",
    "report",
    "resolve",
    "save",
    "step_series",
    "summary",
    "to_csv",
    "to_dataframe",
]

R = TypeVar("R")


class Window(TypedDict, total=False):
    """What every output takes: ``timeout_s`` (default 60: how long to wait for GPU work still
    running) and a window of steps, as :meth:`Timer.summary` describes: ``last``, ``steps``,
    ``warmup`` (default 0)."""

    timeout_s: float
    last: int | None
    steps: Iterable[int] | None
    warmup: int


class SummaryOptions(Window, total=False):
    """``Timer.summary``'s: a window, and the extras ``step_stats`` and ``trace``."""

    step_stats: bool
    trace: bool


class TraceOptions(Window, total=False):
    """An output that may render a given ``summary`` instead (a window is then refused)."""

    summary: Summary | None


class ReportOptions(TraceOptions, total=False):
    """``report``'s: where the text goes, and the table's options (``render._report.render``)."""

    file: IO[str] | None
    logger: logging.Logger | None
    level: int
    view: str
    fmt: str
    sort: str
    columns: Sequence[str] | None
    match: str | None
    min_share: float
    top_syncs: int


class TableOptions(TraceOptions, total=False):
    """``to_csv`` and ``to_dataframe``: ``what`` ("regions", "steps" or "trace")."""

    what: str


class PlotOptions(TraceOptions, total=False):
    """``plot``'s: the ``top`` regions drawn (default 12)."""

    top: int


class HtmlOptions(Window, total=False):
    """``html``'s: a Summary or a cross-rank RankSummary, and the page's options."""

    summary: Summary | RankSummary | None
    base: Summary | None
    top: int
    title: str | None
    stat: str
    tolerance: float
    max_slowdown: float | None
    confidence: float
    allow_other_device: bool


class Source(Protocol):
    """What an output reads of a Timer (which imports this module, so it is named by its
    shape): its recorder, and the lines it adds to ``Summary.meta``."""

    recorder: Recorder

    def meta(self) -> tuple[tuple[str, str], ...]: ...


def _checked(verb: str, options: Mapping[str, Any], allowed: Any) -> dict[str, Any]:
    """``options`` as a dict, refused naming the verb and its options (the keys of the
    TypedDict ``allowed``) when one is unknown."""
    names = tuple(allowed.__annotations__)
    unknown = [k for k in options if k not in names]
    if unknown:
        close = [m for k in sorted(unknown) for m in difflib.get_close_matches(k, names, n=1)]
        hint = f" (did you mean {', '.join(f'{m}=' for m in close)}?)" if close else ""
        raise TypeError(
            f"{verb}() got unknown option(s) {', '.join(sorted(unknown))}; its options are "
            f"{', '.join(names)}{hint}"
        )
    return dict(options)


def _seconds(timeout_s: object) -> float:
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)):
        raise TypeError(f"timeout_s must be a number of seconds, got {type(timeout_s).__name__}")
    try:
        seconds = float(timeout_s)
    except OverflowError:  # an int too large for a float
        seconds = math.inf
    if not math.isfinite(seconds):
        raise ValueError(
            f"timeout_s must be a finite number of seconds (a report never waits for ever; "
            f"pass e.g. 3600 to wait long), got {timeout_s!r}"
        )
    if seconds < 0:
        raise ValueError(f"timeout_s must be >= 0, got {timeout_s}")
    return seconds


def _take(
    timer: Source,
    timeout_s: object,
    window: Mapping[str, Any],
    step_stats: object = False,
    trace: object = False,
) -> Summary:
    """The Timer's Summary over ``window`` (empty: the whole run), whatever it holds."""
    seconds = _seconds(timeout_s)
    for arg, flag in (("step_stats", step_stats), ("trace", trace)):
        if not isinstance(flag, bool):
            raise TypeError(f"{arg} must be a bool, got {type(flag).__name__}")
    asked = {key: window.get(key) for key in ("last", "steps")}
    asked["warmup"] = window.get("warmup", 0)
    return timer.recorder.summary(timer.meta(), seconds, asked, bool(step_stats), bool(trace))


def summary(timer: Source, options: Mapping[str, Any]) -> Summary:
    """``Timer.summary``: reading, not an output, so an empty window is returned as it is
    (``Summary.steps`` 0, ``meta["window"]`` "no steps")."""
    given = _checked("summary", options, SummaryOptions)
    timeout_s = given.pop("timeout_s", 60.0)
    step_stats, trace = given.pop("step_stats", False), given.pop("trace", False)
    return _take(timer, timeout_s, given, step_stats, trace)


def _window(given: dict[str, Any]) -> tuple[object, dict[str, Any]]:
    """Pop ``timeout_s`` and the window options out of ``given``; the window keeps only those
    given other than their defaults (None; warmup 0), so ``warmup=0`` asks for no window."""
    timeout_s = given.pop("timeout_s", 60.0)
    window = {}
    for key in ("last", "steps", "warmup"):
        value = given.pop(key, None)
        if value is not None and not (key == "warmup" and type(value) is int and value == 0):
            window[key] = value
    return timeout_s, window


def _count(n: int) -> str:
    return f"{n} step" if n == 1 else f"{n} steps"


def _named(steps: Any) -> str:
    """The steps ``steps=`` names, in words (it was checked: a range, or a list, tuple or set
    of ints)."""
    if isinstance(steps, range) and steps.step == 1:
        if not steps:
            return f"no step ({steps!r} is empty)"
        last = steps[-1]
        return f"step {last}" if steps.start == last else f"steps {steps.start}-{last}"
    if isinstance(steps, range):
        return f"the steps of {steps!r}"
    listed = sorted(steps)
    if not listed:
        return "no step (steps is empty)"
    shown = ", ".join(str(s) for s in listed[:8]) + (", ..." if len(listed) > 8 else "")
    return f"step {shown}" if len(listed) == 1 else f"steps {shown}"


def _empty_window(verb: str, window: Mapping[str, Any], current: int, note: str) -> ValueError:
    """The error of an output whose window holds no step: what it asked for, the steps there
    were (``current`` is the step in progress), and what to do."""
    asked = ", ".join(f"{k}={v!r}" for k, v in window.items())
    if window.get("steps") is not None:
        wanted = _named(window["steps"])
    elif window.get("last") is not None:
        last = window["last"]
        wanted = "the last finished step" if last == 1 else f"the last {last} finished steps"
    else:
        wanted = "the finished steps"
    if window.get("warmup"):
        wanted += f" from step {window['warmup']} on"
    if current == 0:
        ran = (
            "no step has finished: step() was never called, so every call so far is in step 0, "
            "which is still in progress"
        )
        fix = "Call cudatimer.step() (or timer.step()) once after each iteration"
    else:
        span = "step 0" if current == 1 else f"steps 0-{current - 1}"
        ran = f"{_count(current)} finished ({span}; step {current} is in progress)"
        fix = "Ask for steps that ran" + (" and are still kept" if note else "")
    cause = f"; {note}" if note else ""
    return ValueError(
        f"{verb}({asked}): the window holds no step: it asks for {wanted}, but {ran}{cause}. "
        f"{fix}, or leave out last/steps/warmup to use the whole run"
    )


def resolve(
    verb: str,
    timer: Source,
    given: Summary | RankSummary | None,
    timeout_s: object,
    window: Mapping[str, Any],
    *,
    step_stats: bool = False,
    trace: bool = False,
    ranks: bool = False,
) -> Any:
    """The run an output renders: ``given`` as it is (a Summary; a RankSummary too where
    ``ranks``), else the Timer's over ``window``, refused when that window holds no step."""
    if given is None:
        run = _take(timer, timeout_s, window, step_stats, trace)
        if window and run.steps == 0:
            note = dict(run.meta).get("window_note", "")
            raise _empty_window(verb, window, timer.recorder.store.step, note)
        return run
    kinds: tuple[type, ...] = (Summary, RankSummary) if ranks else (Summary,)
    if not isinstance(given, kinds):
        also = " or a cudatimer.distributed.RankSummary" if ranks else ""
        raise TypeError(
            f"summary must be a cudatimer.Summary (e.g. cudatimer.load(path)){also}, got "
            f"{type(given).__name__}"
        )
    if window:
        raise TypeError(
            f"{', '.join(sorted(window))}: a window applies to a Timer's own results; "
            "a given summary is rendered as it is"
        )
    return given


def output(
    verb: str,
    timer: Source,
    given: dict[str, Any],
    render: Callable[[Any, dict[str, Any]], R],
    target: Target | None = None,
    *,
    step_stats: bool = False,
    trace: bool = False,
    ranks: bool = False,
) -> tuple[Any, R]:
    """The one path: resolve the run from ``given`` (its ``summary``, ``timeout_s`` and window
    are taken out of it), ``render(run, rest of given)``, write that to ``target`` (if any);
    returns the run and what was rendered. The caller makes ``target`` before this is called,
    so a bad path fails before a report waits for the GPU."""
    timeout_s, window = _window(given)
    run = resolve(
        verb,
        timer,
        given.pop("summary", None),
        timeout_s,
        window,
        step_stats=step_stats,
        trace=trace,
        ranks=ranks,
    )
    content = render(run, given)
    # Text or bytes; a renderer returns None where there is nothing to write (another rank's).
    if target is not None and isinstance(content, (str, bytes)):
        target.write(content)
    return run, content


# -- the verbs: each names what it renders and where it goes ---------------------------------
def report(timer: Source, options: Mapping[str, Any]) -> str:
    """Print the table (``render._report.render``) and return it."""
    from ..render._report import render

    given = _checked("report", options, ReportOptions)
    target = to_print(
        given.pop("file", None), given.pop("logger", None), given.pop("level", logging.INFO)
    )
    return output("report", timer, given, lambda run, rest: render(run, **rest), target)[1]


def save(timer: Source, path: object, options: Mapping[str, Any]) -> Summary:
    """Write the JSON of the run, per-step rows and trace samples included; returns the run."""
    from ..render._export import dumps

    given = _checked("save", options, Window)
    target = to_path(path)
    run: Summary = output(
        "save", timer, given, lambda run, _: dumps(run), target, step_stats=True, trace=True
    )[0]
    return run


def step_series(timer: Source, options: Mapping[str, Any]) -> tuple[StepStats, ...]:
    """The per-step records of the window.

    >>> import cudatimer
    >>> t = cudatimer.Timer(name="series")
    >>> for i in range(3):
    ...     with t.region("it"):
    ...         pass
    ...     _ = t.step()
    >>> [(s.step, s.name, s.calls) for s in t.step_series(warmup=1)]
    [(1, 'it', 1), (2, 'it', 1)]
    """
    given = _checked("step_series", options, Window)
    rows: tuple[StepStats, ...] = output(
        "step_series", timer, given, lambda run, _: run.step_stats, step_stats=True
    )[1]
    return rows


def export_trace(timer: Source, path: object, options: Mapping[str, Any]) -> None:
    """Write the Chrome/Perfetto trace (``render._trace.render_trace``)."""
    from ..render._trace import render_trace

    given = _checked("export_trace", options, TraceOptions)
    target = to_file(path)
    output("export_trace", timer, given, lambda run, _: render_trace(run), target, trace=True)


def _table(verb: str, options: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    from ..render._export import check_what

    given = _checked(verb, options, TableOptions)
    return given, check_what(given.pop("what", "regions"))


def to_csv(timer: Source, path: object, options: Mapping[str, Any]) -> None:
    """Write one table as CSV (``render._export.render_csv``)."""
    from ..render._export import render_csv

    given, what = _table("to_csv", options)
    target = to_file(path)
    output(
        "to_csv",
        timer,
        given,
        lambda run, _: render_csv(run, what),
        target,
        step_stats=what == "steps",
        trace=what == "trace",
    )


def to_dataframe(timer: Source, options: Mapping[str, Any]) -> Any:
    """One table as a pandas DataFrame (``render._export.to_dataframe``)."""
    from ..render._export import to_dataframe as frame

    given, what = _table("to_dataframe", options)
    return output(
        "to_dataframe",
        timer,
        given,
        lambda run, _: frame(run, what=what),
        step_stats=what == "steps",
        trace=what == "trace",
    )[1]


def plot(timer: Source, path: object, options: Mapping[str, Any]) -> None:
    """Write the picture (``render._plot.render_png``), in the format the path's suffix names."""
    from ..render._plot import format_of, render_png

    given = _checked("plot", options, PlotOptions)
    fmt = format_of(path)
    target = to_file(path, binary=True)
    top = given.pop("top", 12)
    output(
        "plot",
        timer,
        given,
        lambda run, _: render_png(run, top=top, fmt=fmt),
        target,
        step_stats=True,
    )


def html(timer: Source, path: object, options: Mapping[str, Any]) -> None:
    """Write the HTML page (``render._html.render_html``), of a RankSummary too.

    >>> import cudatimer, io
    >>> t = cudatimer.Timer(name="page")
    >>> with t.region("step"):
    ...     pass
    >>> page = io.StringIO()
    >>> t.html(page)
    >>> "</html>" in page.getvalue()
    True
    """
    from ..render._html import render_html

    given = _checked("html", options, HtmlOptions)
    target = to_file(path)
    output(
        "html",
        timer,
        given,
        lambda run, rest: render_html(run, **rest),
        target,
        step_stats=True,
        ranks=True,
    )
