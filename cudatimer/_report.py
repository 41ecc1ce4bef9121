"""Renderers: frozen records in, text out. The only module that imports tabulate."""

from __future__ import annotations

import math
from typing import Any

from tabulate import tabulate

from ._records import RegionStats, Summary

_SORTS = ("total", "mean", "calls", "name", "order")


def _ms(value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.3f}"


def _sort(regions: tuple[RegionStats, ...], sort: str) -> list[RegionStats]:
    if sort == "order":
        return list(regions)
    if sort == "name":
        return sorted(regions, key=lambda r: (r.name, r.clock))
    if sort == "calls":
        return sorted(regions, key=lambda r: -r.calls)
    if sort == "mean":
        return sorted(regions, key=lambda r: -(r.total_ms / r.calls if r.calls else 0.0))
    return sorted(regions, key=lambda r: -r.total_ms)


def render(summary: Summary, *, fmt: str = "simple", sort: str = "total", **_: Any) -> str:
    """The flat table of a Summary: one row per region path and clock.

    GPU columns are the span between each region's start and end events on its stream (idle
    gaps included); CPU columns are host wall time between enter and exit. ``clock`` says which
    clock timed the row ("cuda:0" or "host"; host rows have no GPU columns).
    """
    if not isinstance(fmt, str):
        raise TypeError(f"fmt must be a tabulate format name (str), got {type(fmt).__name__}")
    if sort not in _SORTS:
        raise ValueError(f"sort must be one of {', '.join(_SORTS)}; got {sort!r}")
    headers = [
        "region",
        "clock",
        "calls",
        "gpu total ms",
        "gpu mean ms",
        "gpu p50 ms",
        "gpu p90 ms",
        "gpu p99 ms",
        "gpu max ms",
        "cpu total ms",
        "cpu mean ms",
    ]
    rows = [
        [
            r.name,
            r.clock,
            r.calls,
            _ms(r.gpu_total_ms),
            _ms(r.gpu_mean_ms),
            _ms(r.gpu_p50_ms),
            _ms(r.gpu_p90_ms),
            _ms(r.gpu_p99_ms),
            _ms(r.gpu_max_ms),
            _ms(r.cpu_total_ms),
            _ms(r.cpu_mean_ms),
        ]
        for r in _sort(summary.regions, sort)
    ]
    if not rows:
        text = "cudatimer: no regions recorded"
    else:
        text = tabulate(rows, headers=headers, tablefmt=fmt, disable_numparse=True)
    notes = []
    skipped = sum(r.skipped for r in summary.regions)
    if skipped:
        notes.append(f"{skipped} call(s) had no GPU timing (entered during CUDA graph capture)")
    if summary.pending:
        notes.append(
            f"{summary.pending} sample(s) were still running on the GPU when the report timed "
            "out; they are kept and will appear in a later report"
        )
    if summary.open:
        notes.append(f"{summary.open} region(s) still open on this thread are not included")
    return text + "".join(f"\nnote: {n}" for n in notes)
