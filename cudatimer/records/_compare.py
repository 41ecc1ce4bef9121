"""Frozen records of a performance gate: one verdict per region, and the comparison that holds
them. Plain data; ``cudatimer.compare`` makes them (the statistics are in ``render._gate``).

>>> v = RegionVerdict("step/attention", "cuda:0", "slower", 2.0, 2.3, 1.15, 1.08, 1.22)
>>> v.interval, v in Comparison((v,), stat="p50", max_slowdown=0.05).regressions
((1.08, 1.22), True)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["VERDICTS", "Comparison", "RegionVerdict", "SpeedFactor"]

#: Every verdict a region can get. "only in base" / "only in new" use the comparison's labels.
VERDICTS = ("slower", "faster", "same", "undecided", "only in base", "only in new")


@dataclass(frozen=True)
class RegionVerdict:
    """One region (path and clock, and rank for per-rank runs) of a comparison.

    ``base_ms`` and ``new_ms`` are the gated statistic in each run (NaN where the region did
    not run); ``ratio`` is new / base and ``low``-``high`` its confidence interval (None
    where there is no test). Unless the comparison is absolute, ``ratio`` is normalised: the
    raw ratio ``new_ms / base_ms`` divided by ``factor``, the median raw ratio of the other
    regions of its rank and clock (the run-wide speed factor); ``raw_ratio`` undoes it.
    ``samples`` says what the statistic was taken over: "steps"
    (per-step sums) or "calls" (per-call durations); ``base_n``/``new_n`` count them and
    ``base_runs``/``new_runs`` the runs pooled on each side. ``reason`` says why a region is
    undecided (too few samples, too noisy).
    """

    name: str
    clock: str
    verdict: str
    base_ms: float
    new_ms: float
    ratio: float | None
    low: float | None
    high: float | None
    samples: str = ""
    base_n: int = 0
    new_n: int = 0
    base_runs: int = 1
    new_runs: int = 1
    rank: int | None = None
    reason: str = ""
    factor: float = 1.0

    @property
    def raw_ratio(self) -> float | None:
        """new / base before the speed factor was divided out (``ratio`` when absolute)."""
        return None if self.ratio is None else self.ratio * self.factor

    @property
    def base(self) -> float:
        """The statistic in the base run(s), ms."""
        return self.base_ms

    @property
    def new(self) -> float:
        """The statistic in the new run(s), ms."""
        return self.new_ms

    @property
    def interval(self) -> tuple[float, float] | None:
        """(low, high) of the ratio's confidence interval, or None without a test."""
        if self.low is None or self.high is None:
            return None
        return (self.low, self.high)

    @property
    def change(self) -> float | None:
        """ratio - 1: +0.10 is 10% slower."""
        return None if self.ratio is None else self.ratio - 1.0

    @property
    def missing(self) -> bool:
        """True when the region ran in one of the two runs only."""
        return math.isnan(self.base_ms) or math.isnan(self.new_ms)


@dataclass(frozen=True)
class SpeedFactor:
    """How much faster or slower the whole new run ran than the base, for one rank and clock:
    ``factor`` is the median of the raw ratios new / base of the ``regions`` regions tested
    there (1.05: the new run 5% slower everywhere). ``used`` is False where too few regions
    were tested to normalise by it, or the comparison is absolute (their ratios are then raw).
    ``between_run``: the spread between runs of one region (relative, per run) assumed there
    where one run per side cannot measure it."""

    rank: int | None
    clock: str
    factor: float
    regions: int
    used: bool = True
    between_run: float = 0.0


@dataclass(frozen=True)
class Comparison:
    """Per-region verdicts of a new run against a base run (``cudatimer.compare``).

    ``confidence`` is the family-wise level: every interval holds at ``region_confidence``,
    which is ``1 - (1 - confidence) / tested`` (Bonferroni over the ``tested`` regions), so
    the chance that any region of an unchanged program reads "slower" is at most
    ``(1 - confidence) / 2``. A region is "slower" when its whole interval lies above 1 and
    reaches past ``1 + max_slowdown``; see docs/gate.md for the rest.

    Unless ``absolute``, each region's ratio is divided by a run-wide speed factor (``speed``:
    one per rank and clock), so that the whole machine running faster or slower between the
    runs is no regression. ``between_run`` is the relative spread between runs of one region
    assumed where it cannot be measured (one run on each side).

    ``ok`` is False when some region is slower, or undecided with ``fail_undecided``, or in
    one run only with ``fail_missing``.
    """

    items: tuple[RegionVerdict, ...]
    stat: str
    max_slowdown: float
    confidence: float = 0.95
    region_confidence: float = 0.95
    tested: int = 0
    fail_undecided: bool = False
    fail_missing: bool = False
    labels: tuple[str, str] = ("base", "new")
    notes: tuple[str, ...] = ()
    ignored: int = 0  # regions left out by match / min_ms
    absolute: bool = False
    speed: tuple[SpeedFactor, ...] = ()
    between_run: float = 0.0

    def _with(self, *verdicts: str) -> tuple[RegionVerdict, ...]:
        return tuple(v for v in self.items if v.verdict in verdicts)

    @property
    def regressions(self) -> tuple[RegionVerdict, ...]:
        """Regions significantly slower, possibly by more than ``max_slowdown``."""
        return self._with("slower")

    @property
    def improvements(self) -> tuple[RegionVerdict, ...]:
        return self._with("faster")

    @property
    def same(self) -> tuple[RegionVerdict, ...]:
        return self._with("same")

    @property
    def undecided(self) -> tuple[RegionVerdict, ...]:
        """Regions too noisy, or with too few samples, for a verdict."""
        return self._with("undecided")

    @property
    def missing(self) -> tuple[RegionVerdict, ...]:
        """Regions that ran in one of the two runs only."""
        return tuple(v for v in self.items if v.missing)

    @property
    def failures(self) -> tuple[RegionVerdict, ...]:
        """What makes the gate fail: regressions, and undecided / missing regions where asked."""
        return tuple(
            v
            for v in self.items
            if v.verdict == "slower"
            or (self.fail_undecided and v.verdict == "undecided")
            or (self.fail_missing and v.missing)
        )

    @property
    def ok(self) -> bool:
        return not self.failures
