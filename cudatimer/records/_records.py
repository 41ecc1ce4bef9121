"""Frozen records: what a report is made from. Plain data, no torch, safe to pickle and compare."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from ._hist import Histogram
from ._values import EMPTY, Values, flop_rates

SCHEMA_VERSION = 1


R = TypeVar("R", bound="_Named")


class _Named(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def clock(self) -> str: ...


def only_row(rows: tuple[R, ...], name: str, where: str = "") -> R:
    """The one row named ``name``; a KeyError that lists the names, or the clocks to pick from."""
    found = [r for r in rows if r.name == name]
    if not found:
        known = ", ".join(sorted({r.name for r in rows})) or "none"
        raise KeyError(f"no region named {name!r}{where}; regions: {known}")
    if len(found) > 1:
        clocks = ", ".join(r.clock for r in found)
        raise KeyError(
            f"region {name!r} was timed on several clocks ({clocks}); "
            f"pick one with .get({name!r}, clock=...)"
        )
    return found[0]


def find_row(rows: tuple[R, ...], name: str, clock: str | None = None) -> R | None:
    """The first row named ``name`` on ``clock`` (any clock if None), or None."""
    return next((r for r in rows if r.name == name and clock in (None, r.clock)), None)


def row_names(rows: tuple[R, ...]) -> tuple[str, ...]:
    """Region names in first-appearance order, each once (a region may have several clocks)."""
    return tuple(dict.fromkeys(r.name for r in rows))


@dataclass(frozen=True)
class RegionStats:
    """Statistics of one region path on one clock.

    ``clock`` is ``"cuda:N"`` when the region was timed with CUDA events on device N, or
    ``"host"`` when it was timed on the host clock (no CUDA, a forked child, ``clock="host"``).
    GPU fields are ``None`` on the host clock. GPU time is the span between the start and end
    events on the region's stream, idle gaps included; CPU time is the host wall time between
    enter and exit. ``values`` holds the row's per-call values other than time, by column
    (``records/_values.py``; empty unless a feature records some).
    """

    name: str
    clock: str
    calls: int
    gpu: Histogram | None
    cpu: Histogram
    skipped: int = 0  # calls with no GPU timing (e.g. entered during CUDA graph capture)
    depth: int = 0
    syncs: int = 0  # host-device synchronisations seen inside it (detect_syncs)
    values: Values = field(default=EMPTY, repr=False)  # per-call values by column name

    # Derived, filled in __post_init__ so they are plain fields in asdict()/DataFrames.
    gpu_total_ms: float | None = field(init=False)
    gpu_mean_ms: float | None = field(init=False)
    gpu_min_ms: float | None = field(init=False)
    gpu_max_ms: float | None = field(init=False)
    gpu_p50_ms: float | None = field(init=False)
    gpu_p90_ms: float | None = field(init=False)
    gpu_p99_ms: float | None = field(init=False)
    cpu_total_ms: float = field(init=False)
    cpu_mean_ms: float = field(init=False)
    cpu_min_ms: float = field(init=False)
    cpu_p50_ms: float = field(init=False)
    cpu_p90_ms: float = field(init=False)
    cpu_p99_ms: float = field(init=False)
    cpu_max_ms: float = field(init=False)
    # flops=True rows (None elsewhere): FLOP a call, achieved TFLOP/s over the row's mean
    # time (GPU where timed on the GPU, else host), MFU (None where the peak is unknown),
    # and whether fewer calls were counted than made (the FLOPs a call then a mean of those).
    flop_mean: float | None = field(init=False, compare=False)
    tflop_per_s: float | None = field(init=False, compare=False)
    mfu: float | None = field(init=False, compare=False)
    flop_sampled: bool = field(init=False, compare=False)

    def __post_init__(self) -> None:
        g = self.gpu
        timed = g is not None and g.count > 0
        put = object.__setattr__
        put(self, "gpu_total_ms", g.total if timed else None)  # type: ignore[union-attr]
        put(self, "gpu_mean_ms", g.mean if timed else None)  # type: ignore[union-attr]
        put(self, "gpu_min_ms", g.min if timed else None)  # type: ignore[union-attr]
        put(self, "gpu_max_ms", g.max if timed else None)  # type: ignore[union-attr]
        put(self, "gpu_p50_ms", g.quantile(0.5) if timed else None)  # type: ignore[union-attr]
        put(self, "gpu_p90_ms", g.quantile(0.9) if timed else None)  # type: ignore[union-attr]
        put(self, "gpu_p99_ms", g.quantile(0.99) if timed else None)  # type: ignore[union-attr]
        c = self.cpu
        put(self, "cpu_total_ms", c.total)
        put(self, "cpu_mean_ms", c.mean)
        put(self, "cpu_min_ms", c.min if c.count else math.nan)
        put(self, "cpu_p50_ms", c.quantile(0.5))  # NaN when empty, as the mean
        put(self, "cpu_p90_ms", c.quantile(0.9))
        put(self, "cpu_p99_ms", c.quantile(0.99))
        put(self, "cpu_max_ms", c.max if c.count else math.nan)
        mean_ms = self.gpu_mean_ms if timed else (c.mean if c.count else None)
        flop, rate, mfu, sampled = flop_rates(self.values, self.calls, mean_ms)
        put(self, "flop_mean", flop)
        put(self, "tflop_per_s", rate)
        put(self, "mfu", mfu)
        put(self, "flop_sampled", sampled)

    @property
    def leaf(self) -> str:
        """The region's own name (the last part of its path)."""
        return self.name.rsplit("/", 1)[-1]

    @property
    def total_ms(self) -> float:
        """GPU total where the region was timed on the GPU, else host total."""
        return self.gpu_total_ms if self.gpu_total_ms is not None else self.cpu_total_ms

    def merge(self, other: RegionStats) -> RegionStats:
        """Combine two records of the same region and clock (e.g. from two runs or ranks)."""
        if (other.name, other.clock) != (self.name, self.clock):
            raise ValueError(
                f"cannot merge region {other.name!r} ({other.clock}) into {self.name!r} "
                f"({self.clock}): names and clocks must match"
            )
        gpu = self.gpu.merge(other.gpu) if self.gpu and other.gpu else (self.gpu or other.gpu)
        return RegionStats(
            name=self.name,
            clock=self.clock,
            calls=self.calls + other.calls,
            gpu=gpu,
            cpu=self.cpu.merge(other.cpu),
            skipped=self.skipped + other.skipped,
            depth=self.depth,
            syncs=self.syncs + other.syncs,
            values=self.values.merge(other.values),
        )


@dataclass(frozen=True)
class SyncSite:
    """Where a host-device synchronisation happened: ``file:line`` of the user's code."""

    location: str
    kind: str  # e.g. "item", "cpu", "synchronize", "event.synchronize", "stream.synchronize"
    region: str  # path of the innermost region open on that thread
    count: int


@dataclass(frozen=True)
class StepStats:
    """One region's time in one step (``cudatimer.step()`` marks the boundaries).

    ``gpu_ms`` and ``cpu_ms`` are sums over the region's ``calls`` in that step; ``gpu_ms`` is
    None on the host clock. ``flop``, ``tflop_per_s`` and ``mfu`` are set on rows counted
    with ``flops=True`` (``step_flops``). Steps are numbered from 0 (what ran before the
    first ``step()``).
    """

    step: int
    name: str
    clock: str
    calls: int
    gpu_ms: float | None
    cpu_ms: float
    # flops=True rows (None elsewhere): the step's FLOP (FLOPs a call x its timed calls),
    # achieved TFLOP/s over its time, MFU.
    flop: float | None = None
    tflop_per_s: float | None = None
    mfu: float | None = None


@dataclass(frozen=True)
class TraceSample:
    """One call of a region, placed on a timeline for trace export.

    Times are milliseconds after the earliest instant of the trace it belongs to. The host span
    is enter to exit on thread ``thread``; GPU samples also carry the span between their start
    and end events on CUDA stream ``stream``, positioned by the elapsed time from a reference
    event recorded on that stream (and the host clock read when it was recorded).
    """

    name: str
    clock: str
    step: int
    thread: int
    thread_name: str
    host_start_ms: float
    cpu_ms: float
    stream: int | None = None
    gpu_start_ms: float | None = None
    gpu_ms: float | None = None


@dataclass(frozen=True)
class Summary:
    """Everything one Timer resolved, as frozen data.

    ``regions`` is ordered by first appearance of each path (parents before children).
    ``pending`` counts samples whose GPU work had not finished when the summary was taken
    (they are kept and appear in a later summary); ``open`` counts regions still entered.
    ``steps`` is the number of steps the statistics cover (``step()`` calls for a whole-run
    summary, the window's length for a window). ``step_stats`` and ``trace`` are filled only
    when asked for (``summary(step_stats=True, trace=True)``; ``save()`` asks for both).
    """

    regions: tuple[RegionStats, ...]
    pending: int = 0
    open: int = 0
    steps: int = 0
    meta: tuple[tuple[str, str], ...] = ()
    sync_sites: tuple[SyncSite, ...] = ()
    step_stats: tuple[StepStats, ...] = ()
    trace: tuple[TraceSample, ...] = ()

    def __getitem__(self, name: str) -> RegionStats:
        """The record of region ``name`` (its full path); KeyError lists what exists."""
        return only_row(self.regions, name)

    def get(self, name: str, clock: str | None = None) -> RegionStats | None:
        """The record of ``name`` on ``clock`` (any clock if None), or None."""
        return find_row(self.regions, name, clock)

    def __contains__(self, name: object) -> bool:
        return any(r.name == name for r in self.regions)

    @property
    def names(self) -> tuple[str, ...]:
        return row_names(self.regions)

    @property
    def backward_coverage(self) -> tuple[Coverage, ...]:
        """Per backward root row (``<Model>.backward``) and clock: its time and the part its
        child rows cover (``Coverage.fraction``); derived from ``regions``."""
        return backward_coverage(self.regions)


# -- backward coverage --------------------------------------------------------------------
# Backward coverage: how much of a backward root row's time its child rows account for.
#
# A backward tree (``instrument(model, backward=True)``) is rooted at ``<Model>.backward``, the
# model's whole backward; its children are the backward rows of the model's top-level modules.
# Autograd work that ran inside the root but in no child (nodes made by the model's own forward
# code between submodules, the parameters' gradient accumulation, the tail after the last
# hooked node) is the uncovered part: ``1 - fraction``. Derived from the rows alone, so a saved
# or merged summary gives the same figure.

#: What names a backward root row: a top-level row ``<name>.backward`` with child rows.
BACKWARD_SUFFIX = ".backward"


@dataclass(frozen=True)
class Coverage:
    """One backward root row on one clock: its time, and the part its child rows cover.

    ``fraction`` is ``covered_ms / total_ms`` (NaN when the root took no time); above 1 when
    children overlap (two calls of one module in flight at once).
    """

    region: str
    clock: str
    total_ms: float
    covered_ms: float
    children: int

    @property
    def fraction(self) -> float:
        return self.covered_ms / self.total_ms if self.total_ms > 0 else math.nan

    @property
    def uncovered_ms(self) -> float:
        return max(0.0, self.total_ms - self.covered_ms)


def backward_coverage(regions: Sequence[RegionStats]) -> tuple[Coverage, ...]:
    """The coverage of every backward root row in ``regions`` (rows without children are
    not trees: a ``cuda_region(..., backward=True)`` row has none)."""
    roots = {
        (r.name, r.clock): r
        for r in regions
        if "/" not in r.name and r.name.endswith(BACKWARD_SUFFIX)
    }
    covered: dict[tuple[str, str], tuple[float, int]] = {}
    for r in regions:
        parent, sep, _ = r.name.rpartition("/")
        if sep and (parent, r.clock) in roots:
            ms, n = covered.get((parent, r.clock), (0.0, 0))
            covered[(parent, r.clock)] = (ms + r.total_ms, n + 1)
    return tuple(
        Coverage(name, clock, roots[(name, clock)].total_ms, ms, n)
        for (name, clock), (ms, n) in covered.items()
    )


def step_flops(
    values: Values, calls: int, gpu_ms: float | None, cpu_ms: float
) -> tuple[float | None, float | None, float | None]:
    """A step row's (FLOP, TFLOP/s, MFU) from the values of its step: FLOPs a call (the
    mean of the step's counts) times its ``calls``, over its summed time."""
    flop_a_call, _, _, _ = flop_rates(values, 1, None)
    if flop_a_call is None:
        return None, None, None
    flop = flop_a_call * calls
    ms = gpu_ms if gpu_ms is not None else cpu_ms
    if not calls or not ms > 0:
        return flop, None, None
    rate = flop / ms * 1e-9
    peak = values.get("flop_peak")
    return flop, rate, (rate / peak.mean if peak is not None and peak.mean > 0 else None)
