"""A picture of where time goes: the top regions' GPU and CPU time, and time per step.

matplotlib is optional and imported only here, when a plot is asked for. We draw on a
``Figure`` with the Agg canvas directly, never through pyplot, so plotting neither changes the
user's backend nor opens a window (and works on machines without a display).
"""

from __future__ import annotations

import io
import os
from typing import IO, Any

from ..records._records import RegionStats, Summary
from ._write import to_file

__all__ = ["FORMATS", "format_of", "plot", "render_png"]

_GPU_COLOR, _CPU_COLOR = "#4363d8", "#f58231"

#: File suffix -> the format written: a path's suffix names its format (a ``.svg`` file must not
#: hold PNG bytes). A binary stream gets PNG.
FORMATS = {".png": "png", ".svg": "svg", ".pdf": "pdf"}


def format_of(path: object) -> str:
    """The format ``plot`` writes to ``path``: its suffix's for a file path (a ValueError for
    another suffix), PNG for a binary stream."""
    if not isinstance(path, (str, os.PathLike)):
        return "png"
    suffix = os.path.splitext(os.fspath(path))[1]
    fmt = FORMATS.get(suffix.lower())
    if fmt is None:
        got = f"{suffix!r}" if suffix else "none"
        raise ValueError(
            f"path {os.fspath(path)!r}: its suffix names the picture's format, one of "
            f"{', '.join(FORMATS)}; got {got}"
        )
    return fmt


def _import_matplotlib() -> tuple[Any, Any]:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ImportError(
            "cudatimer.plot needs matplotlib, which is not installed: pip install matplotlib "
            "(reports, save() and export_trace() need nothing extra)"
        ) from exc
    return Figure, FigureCanvasAgg


def _top(summary: Summary, top: int) -> list[RegionStats]:
    return sorted(summary.regions, key=lambda r: -r.total_ms)[:top]


def plot(
    summary: Summary,
    path: str | os.PathLike[str] | IO[bytes],
    *,
    top: int = 12,
    title: str | None = None,
) -> None:
    """Write ``render_png(summary, top=top, title=title, fmt=format_of(path))`` to ``path``: a
    file path whose suffix names the format (``.png``, ``.svg`` or ``.pdf``; another is
    refused), written atomically (on failure no partial file is left), or a binary stream
    (PNG)."""
    fmt = format_of(path)
    target = to_file(path, binary=True)
    target.write(render_png(summary, top=top, title=title, fmt=fmt))


def render_png(
    summary: Summary, *, top: int = 12, title: str | None = None, fmt: str = "png"
) -> bytes:
    """The picture, PNG by default (``fmt``: ``"svg"`` or ``"pdf"``): the ``top`` regions by
    time (GPU and CPU total side by side), and, when the summary carries per-step stats of 2
    steps or more, their time per step below.

    Times are inclusive (a parent's bar contains its children's).
    """
    if not isinstance(summary, Summary):
        raise TypeError(f"summary must be a cudatimer.Summary, got {type(summary).__name__}")
    if isinstance(top, bool) or not isinstance(top, int):
        raise TypeError(f"top must be an int, got {type(top).__name__}")
    if top < 1:
        raise ValueError(f"top must be >= 1, got {top}")
    if not summary.regions:
        raise ValueError("nothing to plot: the summary has no regions")
    figure_cls, canvas_cls = _import_matplotlib()
    regions = _top(summary, top)
    steps = sorted({s.step for s in summary.step_stats})
    per_step = len(steps) >= 2
    height = 1.2 + 0.42 * len(regions) + (3.2 if per_step else 0.0)
    fig = figure_cls(figsize=(9.0, height), dpi=110, layout="constrained")
    canvas_cls(fig)
    if per_step:
        bars_ax, steps_ax = fig.subplots(
            2, 1, height_ratios=[0.42 * len(regions) + 0.6, 3.0], squeeze=True
        )
    else:
        bars_ax, steps_ax = fig.subplots(1, 1), None
    labels = [f"{r.name} ({r.clock})" if r.clock != "host" else r.name for r in regions]
    y = list(range(len(regions)))
    any_gpu = any(r.gpu_total_ms is not None for r in regions)
    height_bar = 0.4 if any_gpu else 0.7
    if any_gpu:
        gpu = [r.gpu_total_ms or 0.0 for r in regions]
        bars_ax.barh([v - 0.2 for v in y], gpu, height=height_bar, color=_GPU_COLOR, label="GPU")
    cpu = [r.cpu_total_ms for r in regions]
    offset = 0.2 if any_gpu else 0.0
    bars_ax.barh([v + offset for v in y], cpu, height=height_bar, color=_CPU_COLOR, label="CPU")
    bars_ax.set_yticks(y, labels)
    bars_ax.invert_yaxis()
    bars_ax.set_xlabel("total ms (inclusive)")
    bars_ax.legend(loc="lower right")
    timer = dict(summary.meta).get("timer")
    window = dict(summary.meta).get("window")
    default_title = "where time goes" + (f": timer {timer!r}" if timer else "")
    if window:
        default_title += f", {window}"
    bars_ax.set_title(title if title is not None else default_title)
    if steps_ax is not None:
        _plot_steps(steps_ax, summary, regions[: min(5, len(regions))], steps)
    if fmt not in FORMATS.values():
        raise ValueError(f"fmt must be one of {', '.join(FORMATS.values())}, got {fmt!r}")
    picture = io.BytesIO()
    fig.savefig(picture, format=fmt)
    return picture.getvalue()


def _plot_steps(ax: Any, summary: Summary, regions: list[RegionStats], steps: list[int]) -> None:
    for r in regions:
        points = {
            s.step: (s.gpu_ms if s.gpu_ms is not None else s.cpu_ms)
            for s in summary.step_stats
            if s.name == r.name and s.clock == r.clock
        }
        xs = [step for step in steps if step in points]
        ax.plot(xs, [points[x] for x in xs], marker=".", label=r.name)
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("step")
    clocks = {r.clock == "host" for r in regions}
    kind = {frozenset({True}): "host", frozenset({False}): "GPU"}.get(frozenset(clocks))
    ax.set_ylabel(f"{kind} ms per step" if kind else "ms per step (GPU, else host)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")
