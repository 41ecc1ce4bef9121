"""Cross-rank records: many ranks' summaries in, one row per region out. Plain data, no torch.

Rows are keyed by region path and clock *kind*: "cuda" (CUDA events, whatever device each rank
used: rank 0 on cuda:0 and rank 1 on cuda:1 time the same region) or "host". Per-rank statistics
come from each rank's totals and means; percentiles come from the ranks' histograms merged
bucket by bucket, so they are the percentiles of every sample of every rank within ``ALPHA``.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from ._hist import Histogram
from ._records import RegionStats, Summary, find_row, only_row, row_names
from ._values import EMPTY, Values

__all__ = ["RankSummary", "RankedRegion", "clock_kind"]


def clock_kind(clock: str) -> str:
    """``"cuda"`` for any ``"cuda:N"`` clock, else the clock itself (``"host"``)."""
    return "cuda" if clock.startswith("cuda") else clock


def _fold(records: list[RegionStats]) -> RegionStats:
    """One record from a rank's records of one path on several devices of one kind (rare: a
    process driving two GPUs); the clock lists the devices, e.g. ``"cuda:0+cuda:1"``."""
    if len(records) == 1:
        return records[0]
    gpus = [r.gpu for r in records if r.gpu is not None]
    gpu = None
    for h in gpus:
        gpu = h if gpu is None else gpu.merge(h)
    cpu = records[0].cpu
    values = records[0].values
    for r in records[1:]:
        cpu = cpu.merge(r.cpu)
        values = values.merge(r.values)
    return RegionStats(
        name=records[0].name,
        clock="+".join(r.clock for r in records),
        calls=sum(r.calls for r in records),
        gpu=gpu,
        cpu=cpu,
        skipped=sum(r.skipped for r in records),
        depth=records[0].depth,
        syncs=sum(r.syncs for r in records),
        values=values,
    )


def _timed(r: RegionStats | None, kind: str) -> Histogram | None:
    """The histogram a row's numbers come from: GPU on "cuda" rows, host time on "host" rows."""
    if r is None:
        return None
    h = r.gpu if kind == "cuda" else r.cpu
    return h if h is not None and h.count else None


@dataclass(frozen=True)
class RankedRegion:
    """One region path on one clock kind, across the ranks of a report.

    ``per_rank`` holds each rank's own record, aligned with ``ranks`` (``None`` where the region
    never ran: that rank is listed in ``absent``). Totals and means are GPU time on "cuda" rows
    and host time on "host" rows; their min / median / max are taken over the ranks that timed
    the region (absent ranks are not counted as zero). ``skew`` is max / median of the per-rank
    totals (1.0 when every rank spent the same; ``inf`` when the median is 0), ``slowest_rank``
    the rank with the largest total. ``gpu``/``cpu`` are the ranks' histograms merged exactly,
    so ``p50_ms``... are percentiles of all samples of all ranks (within ``ALPHA``);
    ``values`` the ranks' per-call values merged.

    >>> from cudatimer import Histogram, RegionStats, Summary
    >>> def one(ms):
    ...     return Summary((RegionStats("step", "host", 2, None, Histogram.of([ms, ms])),))
    >>> row = RankSummary((0, 1), (one(1.0), one(3.0)))["step"]
    >>> row.calls, row.total_max_ms, row.slowest_rank, row.skew
    (4, 6.0, 1, 1.5)
    """

    name: str
    clock: str  # "cuda" or "host"
    ranks: tuple[int, ...]
    per_rank: tuple[RegionStats | None, ...]

    depth: int = field(init=False, compare=False)
    calls: int = field(init=False, compare=False)
    calls_per_rank: tuple[int, ...] = field(init=False, compare=False)
    absent: tuple[int, ...] = field(init=False, compare=False)
    gpu: Histogram | None = field(init=False, compare=False)
    cpu: Histogram = field(init=False, compare=False)
    values: Values = field(init=False, compare=False, repr=False)
    total_min_ms: float = field(init=False, compare=False)
    total_median_ms: float = field(init=False, compare=False)
    total_max_ms: float = field(init=False, compare=False)
    mean_min_ms: float = field(init=False, compare=False)
    mean_median_ms: float = field(init=False, compare=False)
    mean_max_ms: float = field(init=False, compare=False)
    slowest_rank: int | None = field(init=False, compare=False)
    skew: float = field(init=False, compare=False)
    p50_ms: float = field(init=False, compare=False)
    p90_ms: float = field(init=False, compare=False)
    p99_ms: float = field(init=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.ranks) != len(self.per_rank):
            raise ValueError(
                f"ranks ({len(self.ranks)}) and per_rank ({len(self.per_rank)}) must have the "
                "same length"
            )
        put = object.__setattr__
        present = [r for r in self.per_rank if r is not None]
        put(self, "depth", present[0].depth if present else self.name.count("/"))
        put(self, "calls_per_rank", tuple(r.calls if r else 0 for r in self.per_rank))
        put(self, "calls", sum(self.calls_per_rank))
        put(
            self,
            "absent",
            tuple(k for k, r in zip(self.ranks, self.per_rank, strict=True) if r is None),
        )
        gpu: Histogram | None = None
        cpu = Histogram()
        values = EMPTY
        for r in present:
            if r.gpu is not None:
                gpu = r.gpu if gpu is None else gpu.merge(r.gpu)
            cpu = cpu.merge(r.cpu)
            values = values.merge(r.values)
        put(self, "gpu", gpu)
        put(self, "cpu", cpu)
        put(self, "values", values)
        timed = [
            (rank, h)
            for rank, r in zip(self.ranks, self.per_rank, strict=True)
            if (h := _timed(r, self.clock))
        ]
        totals = [h.total for _, h in timed]
        means = [h.mean for _, h in timed]
        nan = math.nan
        put(self, "total_min_ms", min(totals, default=nan))
        put(self, "total_median_ms", statistics.median(totals) if totals else nan)
        put(self, "total_max_ms", max(totals, default=nan))
        put(self, "mean_min_ms", min(means, default=nan))
        put(self, "mean_median_ms", statistics.median(means) if means else nan)
        put(self, "mean_max_ms", max(means, default=nan))
        # Ties go to the lowest rank: max() keeps the first maximum.
        put(self, "slowest_rank", max(timed, key=lambda t: t[1].total)[0] if timed else None)
        median = self.total_median_ms
        if not totals:
            skew = nan
        elif median > 0:
            skew = self.total_max_ms / median
        else:
            skew = 1.0 if self.total_max_ms == 0 else math.inf
        put(self, "skew", skew)
        merged = gpu if self.clock == "cuda" else cpu
        ok = merged is not None and merged.count > 0
        put(self, "p50_ms", merged.quantile(0.5) if ok else nan)  # type: ignore[union-attr]
        put(self, "p90_ms", merged.quantile(0.9) if ok else nan)  # type: ignore[union-attr]
        put(self, "p99_ms", merged.quantile(0.99) if ok else nan)  # type: ignore[union-attr]

    @property
    def leaf(self) -> str:
        """The region's own name (the last part of its path)."""
        return self.name.rsplit("/", 1)[-1]

    def rank(self, rank: int) -> RegionStats | None:
        """This region's record on ``rank`` (None where absent); KeyError for an unknown rank."""
        try:
            return self.per_rank[self.ranks.index(rank)]
        except ValueError:
            raise KeyError(f"rank {rank!r} is not in this report (ranks: {self.ranks})") from None


@dataclass(frozen=True)
class RankSummary:
    """The summaries of several ranks and, per region, the cross-rank view.

    ``ranks`` are global rank ids (ascending) and ``summaries`` each rank's own Summary, aligned
    with them. ``regions`` has one :class:`RankedRegion` per region path and clock kind, in order
    of first appearance (rank by rank), so parents come before their children.

    >>> import cudatimer
    >>> both = RankSummary((0, 1), (cudatimer.Summary(()), cudatimer.Summary(())))
    >>> both.ranks, both.regions
    ((0, 1), ())
    """

    ranks: tuple[int, ...]
    summaries: tuple[Summary, ...]
    regions: tuple[RankedRegion, ...] = field(init=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.ranks, tuple) or not all(
            isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in self.ranks
        ):
            raise TypeError(f"ranks must be a tuple of ints >= 0, got {self.ranks!r}")
        if not isinstance(self.summaries, tuple) or not all(
            isinstance(s, Summary) for s in self.summaries
        ):
            raise TypeError("summaries must be a tuple of cudatimer.Summary")
        if len(self.ranks) != len(self.summaries):
            raise ValueError(
                f"got {len(self.ranks)} rank ids for {len(self.summaries)} summaries; "
                "give one rank id per summary"
            )
        if len(set(self.ranks)) != len(self.ranks):
            raise ValueError(f"rank ids must be unique, got {self.ranks}")
        if list(self.ranks) != sorted(self.ranks):
            order = sorted(range(len(self.ranks)), key=self.ranks.__getitem__)
            object.__setattr__(self, "ranks", tuple(self.ranks[i] for i in order))
            object.__setattr__(self, "summaries", tuple(self.summaries[i] for i in order))
        # {(path, kind): {rank index: [records]}}, in first-appearance order.
        table: dict[tuple[str, str], dict[int, list[RegionStats]]] = {}
        for i, s in enumerate(self.summaries):
            for r in s.regions:
                table.setdefault((r.name, clock_kind(r.clock)), {}).setdefault(i, []).append(r)
        rows = tuple(
            RankedRegion(
                name=name,
                clock=kind,
                ranks=self.ranks,
                per_rank=tuple(_fold(per[i]) if i in per else None for i in range(len(self.ranks))),
            )
            for (name, kind), per in table.items()
        )
        object.__setattr__(self, "regions", rows)

    def __getitem__(self, name: str) -> RankedRegion:
        """The row of region ``name`` (its full path); KeyError lists what exists."""
        return only_row(self.regions, name, " on any rank")

    def get(self, name: str, clock: str | None = None) -> RankedRegion | None:
        """The row of ``name`` on clock kind ``clock`` ("cuda"/"host", any if None), or None."""
        return find_row(self.regions, name, None if clock is None else clock_kind(clock))

    def __contains__(self, name: object) -> bool:
        return any(r.name == name for r in self.regions)

    @property
    def names(self) -> tuple[str, ...]:
        return row_names(self.regions)

    def rank(self, rank: int) -> Summary:
        """The Summary of ``rank``; KeyError for a rank that is not in the report."""
        try:
            return self.summaries[self.ranks.index(rank)]
        except ValueError:
            raise KeyError(f"rank {rank!r} is not in this report (ranks: {self.ranks})") from None

    @property
    def pending(self) -> int:
        """Samples still running on some rank's GPU when its summary was taken (all ranks)."""
        return sum(s.pending for s in self.summaries)

    @property
    def open(self) -> int:
        return sum(s.open for s in self.summaries)

    def merged(self) -> Summary:
        """All ranks folded into one flat Summary (clocks become "cuda"/"host"): what a single
        process would have recorded had it run every rank's work. ``cudatimer.save`` writes it."""
        regions: list[RegionStats] = []
        for row in self.regions:
            present = [r for r in row.per_rank if r is not None]
            regions.append(
                RegionStats(
                    name=row.name,
                    clock=row.clock,
                    calls=row.calls,
                    gpu=row.gpu,
                    cpu=row.cpu,
                    skipped=sum(r.skipped for r in present),
                    depth=row.depth,
                    syncs=sum(r.syncs for r in present),
                    values=row.values,
                )
            )
        return Summary(
            regions=tuple(regions),
            pending=self.pending,
            open=self.open,
            steps=max((s.steps for s in self.summaries), default=0),
            meta=(("ranks", ",".join(map(str, self.ranks))),),
        )
