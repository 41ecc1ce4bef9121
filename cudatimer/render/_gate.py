"""The performance gate: per-region verdicts of a new run against a base run, each with a
confidence interval of the ratio new / base, and a family-wise error rate it states.

The method (docs/gate.md says it for users):

- Samples. Where both runs marked steps (``cudatimer.step()``) and kept them
  (``Summary.step_stats``, the last ``keep_steps`` steps, 1000 by default), a region's samples
  are its per-step sums, in step order; the step still in progress is left out. Where not, they
  are its per-call durations, read from the whole-run histogram (values within 1%: ``ALPHA``).
  Steps before the kept ones are in no test: their times are in the whole-run histograms only.
- Statistic (``stat``): p50 (the default), p90, p99, mean, or per_step (the mean of the
  per-step sums). All are per step or per call, so runs of different lengths compare fairly;
  ``total`` (which grows with the run) and ``min``/``max`` (which have no interval) are refused.
- Interval of one run's statistic, on the log scale. A quantile's spread is read from the
  order statistics around it (the distribution-free interval of a quantile, i.e. the inverted
  sign test): ranks ``nq -+ 1.96 sqrt(nq(1-q))``, whose log distance / (2 x 1.96) is the
  standard error; a mean's is ``sd / (sqrt(n) mean)``. Per-step samples are in time order,
  and a machine whose load drifts makes neighbouring steps alike: the variance is multiplied
  by the batch-means factor (10 batches of consecutive steps: their means' variance against
  what independent steps would give; never below 1). Per-call durations from a histogram have
  no order (no such factor) and add their bucket's error, ``ALPHA^2 / 3``.
- Pooled runs (several base files, or a folder of them): their samples pool into one
  statistic, and the spread between the runs' own statistics beyond what their within-run
  spread explains is the between-run variance, added to both sides (a new run is one more
  draw from it); its degrees of freedom (runs - 1 on each side, pooled) turn the normal
  quantile into Student's t (Welch-Satterthwaite). One run per side: none can be measured;
  ``between_run`` (BETWEEN_RUN per run) is assumed, and a note says so. Measured, it is never
  read below that.
- The run-wide speed factor (unless ``absolute``), per rank and clock with MIN_FACTOR_REGIONS
  or more regions tested: each region's log ratio less the median log ratio of the others.
  Its variance adds the median's (asymptotic: pi/2 / (m mean(1/s)^2)), the others' spread
  around their median beyond their own variances (robust: the median of squares), and
  (SENSITIVITY_SPREAD x log factor)^2 for the regions' unlike sensitivities to the machine's
  speed. Pooled runs are first divided by their own factor (the median over regions of the
  run's deviation from the side's mean) and their between-run variance is pooled over the
  regions. What it cannot see: a slowdown of every region alike (``absolute`` gates that).
- Many regions: every interval is taken at ``1 - (1 - confidence) / k`` for the k regions
  tested (Bonferroni), so all k hold together with probability ``confidence``; an unchanged
  program then reads "slower" anywhere with probability at most ``(1 - confidence) / 2``.
- Verdicts, with ``m = max_slowdown`` and the interval ``[low, high]`` of new / base:
  slower: ``low > 1`` and ``high > 1 + m`` (significantly slower, and not shown to be within
  m); faster: ``high < 1`` and ``low < 1 / (1 + m)``; same: the interval lies within
  ``[1 / (1 + m), 1 + m]`` (a change, if any, smaller than m); undecided: anything else (too
  noisy), or fewer than ``MIN_SAMPLES`` samples (too few).
"""

from __future__ import annotations

import functools
import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any, cast

from ..records._compare import Comparison, RegionVerdict, SpeedFactor
from ..records._hist import ALPHA, GAMMA, Histogram
from ..records._records import Summary
from ._export import load
from ._report import matches
from ._write import write_atomic

__all__ = [
    "BATCHES",
    "DEFAULT_STAT",
    "GATE_STATS",
    "MIN_SAMPLES",
    "RANK_FILE",
    "Side",
    "as_side",
    "check_options",
    "compare_sides",
    "comparison_to_dict",
    "load_side",
    "write_json",
]

#: Statistics the gate can test (each has a confidence interval and is per step or per call).
GATE_STATS = ("p50", "mean", "per_step", "p25", "p10", "p90", "p99")
#: The median: a few steps preempted by another process move a mean, not a median.
DEFAULT_STAT = "p50"
#: Fewer samples than this on a side: undecided (too few samples). At 5 samples the median's
#: distribution-free 95% interval spans the 1st to the 5th of them.
MIN_SAMPLES = 5
#: Batches of consecutive steps for the batch-means factor: 10 keep 9 degrees of freedom for
#: the factor at 50 steps (batches of 5) and average over 100 steps at 1000.
BATCHES = 10
#: Per-run relative standard error never read below 0.1%: identical per-step sums (a clock's
#: resolution: 1 us of host clock on a 1 ms region) would otherwise make any change certain.
SE_FLOOR = 1e-3
#: Regions of one rank and clock tested before their ratios are divided by the run-wide speed
#: factor: 4 give each region the median of 3 others, which one slowed region cannot carry.
MIN_FACTOR_REGIONS = 4
#: The relative spread between runs of one region's statistic (a standard deviation per run)
#: assumed where it cannot be measured, i.e. one run on each side; pooled runs measure it and
#: it is never read below this. With the speed factor divided out, A/A pairs of quiet runs of
#: benchmarks/gate.py left about 0.5% per run unexplained by the steps' own spread. Raw ratios
#: also carry the whole machine's drift (2-4% between quiet runs there, far more under load):
#: that needs pooled base runs, or a larger between_run.
BETWEEN_RUN = 0.005
#: How unlike each other regions follow the whole machine's speed: the standard deviation of
#: their sensitivities (the slope of a region's log time on the run's log speed factor). On a
#: shared 2-core CPU the 8 regions of benchmarks/gate.py had slopes from 0.04 (a 4 ms sleep)
#: to 1.3 (JSON), spread 0.4; so a factor of 1.5 leaves each region +-16% (1 sd) unexplained.
SENSITIVITY_SPREAD = 0.4
#: The median of chi-square with 1 degree of freedom.
_CHI2_1_MEDIAN = 0.45493642311957283
#: The normal quantile at which a quantile's order-statistic spread is read (95% two-sided).
_Z0 = NormalDist().inv_cdf(0.975)
#: Per-rank files of a folder: ``rank3.json`` (what ``save(f"timings/rank{rank}.json")`` and
#: ``cudatimer.distributed`` write).
RANK_FILE = re.compile(r"rank(\d+)\.json")

#: One side of a comparison: rank (None for one process) -> the runs pooled for it.
Side = dict[int | None, list[Summary]]


# -- options ------------------------------------------------------------------------------------
def _fraction(name: str, value: object, *, low: float, high: float, example: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number ({example}), got {type(value).__name__}")
    number = float(value)
    if not (low < number < high):
        raise ValueError(
            f"{name} must be between {low:g} and {high:g}, exclusive ({example}), got {value!r}"
        )
    return number


def check_options(
    *,
    stat: object,
    max_slowdown: object,
    confidence: object,
    min_ms: object = 0.0,
    match: object = None,
    labels: object = ("base", "new"),
    between_run: object = None,
) -> None:
    """Refuse a gate option that cannot be used, with a TypeError/ValueError naming it."""
    if between_run is not None:
        if isinstance(between_run, bool) or not isinstance(between_run, (int, float)):
            raise TypeError(
                "between_run must be a number (0.01 = 1% spread between runs) or None, got "
                f"{type(between_run).__name__}"
            )
        if not (0.0 <= float(between_run) < 1.0):
            raise ValueError(
                "between_run must be >= 0 and < 1 (0.01 = 1% spread between runs), got "
                f"{between_run!r}"
            )
    if stat not in GATE_STATS:
        why = {
            "total": "total grows with the run's length; per_step compares runs of any length",
            "min": "min has no confidence interval",
            "max": "max has no confidence interval",
        }.get(str(stat), "")
        raise ValueError(
            f"stat must be one of {', '.join(GATE_STATS)} for the gate; got {stat!r}"
            + (f" ({why})" if why else "")
        )
    _fraction("max_slowdown", max_slowdown, low=0.0, high=100.0, example="0.05 = 5% slower")
    _fraction("confidence", confidence, low=0.0, high=1.0, example="0.95 for 95%")
    if isinstance(min_ms, bool) or not isinstance(min_ms, (int, float)):
        raise TypeError(f"min_ms must be a number of milliseconds, got {type(min_ms).__name__}")
    if not (0.0 <= float(min_ms) < math.inf):
        raise ValueError(f"min_ms must be a finite number of milliseconds >= 0, got {min_ms!r}")
    if match is not None and not isinstance(match, str):
        raise TypeError(f"match must be a glob pattern (str) or None, got {type(match).__name__}")
    if (
        not isinstance(labels, tuple)
        or len(labels) != 2
        or not all(isinstance(x, str) and x for x in labels)
    ):
        raise TypeError(f"labels must be a tuple of two non-empty str, got {labels!r}")


# -- reading runs -------------------------------------------------------------------------------
def _folder(path: str) -> Side:
    names = sorted(n for n in os.listdir(path) if n.lower().endswith(".json"))
    ranked = {int(m.group(1)): n for n in names if (m := RANK_FILE.fullmatch(n))}
    if ranked:
        return {rank: [load(os.path.join(path, n))] for rank, n in sorted(ranked.items())}
    if not names:
        raise ValueError(f"{path}: a folder with no .json run in it")
    return {None: [load(os.path.join(path, n)) for n in names]}


def load_side(paths: Sequence[str | os.PathLike[str]]) -> Side:
    """The runs of one side of a comparison: each path a run saved with ``save()``, or a folder
    of them (pooled), or a folder of per-rank files ``rank{N}.json`` (compared rank by rank;
    several such folders pool rank by rank)."""
    parts: list[Summary | Side] = []
    for path in paths:
        text = os.fspath(path)
        parts.append(_folder(text) if os.path.isdir(text) else load(text))
    return as_side(parts)


def as_side(value: object) -> Side:
    """A side from a Summary, a path, a folder, or a list of them (pooled)."""
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    if not items:
        raise ValueError("a side of a comparison needs at least one run; got an empty list")
    side: Side = {}
    for item in items:
        if isinstance(item, Summary):
            part: Side = {None: [item]}
        elif isinstance(item, dict):
            part = item
        elif isinstance(item, (str, os.PathLike)):
            part = load_side([item])
        else:
            raise TypeError(
                "a run must be a cudatimer.Summary, a path to a saved run, or a folder of them; "
                f"got {type(item).__name__}"
            )
        for rank, runs in part.items():
            side.setdefault(rank, []).extend(runs)
    if None in side and len(side) > 1:
        raise ValueError(
            "a side mixes per-rank files (rank{N}.json) with runs of one process; give folders "
            "of rank files on both sides, or single runs"
        )
    return side


# -- samples of one run -------------------------------------------------------------------------
@dataclass(frozen=True)
class _Samples:
    """One region in one run: per-step sums in step order (maybe none) and per-call durations."""

    steps: tuple[float, ...]
    calls: Histogram
    run: int = 0  # which run of its side


def _run_samples(summary: Summary, run: int = 0) -> dict[tuple[str, str], _Samples]:
    # A whole-run summary's step ``steps`` is the one in progress when it was taken.
    limit = math.inf if "window" in dict(summary.meta) else summary.steps
    steps: dict[tuple[str, str], list[float]] = {}
    series = steps.setdefault
    for s in summary.step_stats:
        if s.step < limit:
            gpu_ms = s.gpu_ms
            series((s.name, s.clock), []).append(s.cpu_ms if gpu_ms is None else gpu_ms)
    out = {}
    for r in summary.regions:
        hist = r.gpu if r.gpu is not None and r.gpu.count else r.cpu
        out[(r.name, r.clock)] = _Samples(tuple(steps.get((r.name, r.clock), ())), hist, run)
    return out


# -- one run's statistic and its spread ---------------------------------------------------------
@dataclass(frozen=True)
class _Estimate:
    value_ms: float  # the statistic
    log_var: float  # variance of its log (inf: no interval)
    n: int


def _q(stat: str) -> float:
    """The quantile a statistic names: "p90" -> 0.9."""
    return int(stat[1:]) / 100.0


def _ranks(n: int, q: float) -> tuple[int, int] | None:
    """1-based order statistics bracketing the q-quantile at about 95%, or None if n is too
    small for them (p99 needs a few hundred samples)."""
    centre, spread = n * q, _Z0 * math.sqrt(n * q * (1.0 - q))
    low, high = math.floor(centre - spread), math.ceil(centre + spread)
    if low < 1 or high > n or high <= low:
        return None
    return low, high


def _batch_factor(logs: Sequence[float]) -> float:
    """Variance inflation of the mean of ``logs`` (in time order) by batch means: >= 1."""
    n = len(logs)
    batches = min(BATCHES, n // MIN_SAMPLES)
    if batches < 2:
        return 1.0
    size = n // batches
    start = n - size * batches  # the oldest few steps are left out of the factor only
    means = [
        math.fsum(logs[start + i * size : start + (i + 1) * size]) / size for i in range(batches)
    ]
    mean_all = math.fsum(logs) / n
    var_all = math.fsum([(x - mean_all) ** 2 for x in logs]) / (n - 1)
    if var_all <= 0.0:
        return 1.0
    centre = math.fsum(means) / batches
    var_means = math.fsum([(m - centre) ** 2 for m in means]) / (batches - 1)
    return max(1.0, size * var_means / var_all)


def _interp(values: Sequence[float], q: float) -> float:
    """The q-quantile of sorted ``values``, linearly interpolated (as numpy's default)."""
    at = q * (len(values) - 1)
    low = math.floor(at)
    high = min(low + 1, len(values) - 1)
    return values[low] + (values[high] - values[low]) * (at - low)


def _log_spread(low: float, high: float) -> float:
    if low <= 0.0:
        return math.inf
    return ((math.log(high) - math.log(low)) / (2.0 * _Z0)) ** 2


def _from_steps(values: Sequence[float], stat: str) -> _Estimate | None:
    n = len(values)
    if n < MIN_SAMPLES:
        return None
    factor = _batch_factor(list(map(math.log, values))) if min(values) > 0.0 else 1.0
    if stat in ("mean", "per_step"):
        value = math.fsum(values) / n
        if value <= 0.0:
            return _Estimate(value, math.inf, n)
        var = math.fsum([(v - value) ** 2 for v in values]) / (n - 1)
        log_var = var / (n * value * value)
    else:
        ranks = _ranks(n, _q(stat))
        ordered = sorted(values)
        value = _interp(ordered, _q(stat))
        if ranks is None:
            return _Estimate(value, math.inf, n)
        log_var = _log_spread(ordered[ranks[0] - 1], ordered[ranks[1] - 1])
    return _Estimate(value, max(log_var * factor, SE_FLOOR**2), n)


def _hist_points(h: Histogram) -> list[tuple[float, int]]:
    """(value, count) of a histogram in ascending order: zeros, then bucket centres clamped to
    the exact min and max (as ``Histogram.quantile`` reads them)."""
    points = [(0.0, h.zeros)] if h.zeros else []
    for index, n in h.buckets:
        centre = 2.0 * GAMMA**index / (GAMMA + 1.0)
        points.append((min(max(centre, h.min), h.max), n))
    return points


def _hist_rank(points: Sequence[tuple[float, int]], rank: int) -> float:
    seen = 0
    for value, n in points:
        seen += n
        if seen >= rank:
            return value
    return points[-1][0]


def _from_calls(h: Histogram, stat: str) -> _Estimate | None:
    n = h.count
    if n < MIN_SAMPLES or stat == "per_step":
        return None
    points = _hist_points(h)
    quantization = ALPHA * ALPHA / 3.0  # a bucket's value is off by up to ALPHA, evenly
    if stat == "mean":
        mean = h.mean
        if mean <= 0.0:
            return _Estimate(mean, math.inf, n)
        var = math.fsum(c * (v - mean) ** 2 for v, c in points) / (n - 1)
        return _Estimate(mean, max(var / (n * mean * mean), SE_FLOOR**2), n)
    value = h.quantile(_q(stat))
    ranks = _ranks(n, _q(stat))
    if ranks is None:
        return _Estimate(value, math.inf, n)
    spread = _log_spread(_hist_rank(points, ranks[0]), _hist_rank(points, ranks[1]))
    return _Estimate(value, max(spread + quantization, SE_FLOOR**2), n)


# -- quantiles of the normal and Student's t ----------------------------------------------------
def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularized incomplete beta function (Lentz's method)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c if abs(1.0 + aa / c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c if abs(1.0 + aa / c) > tiny else tiny
        step = d * c
        h *= step
        if abs(step - 1.0) < 1e-14:
            break
    return h


def _t_sf(t: float, df: float) -> float:
    """P(T > t) for t >= 0 and Student's T with ``df`` degrees of freedom."""
    x = df / (df + t * t)
    a, b = df / 2.0, 0.5
    front = math.exp(
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1.0) / (a + b + 2.0):
        ibeta = front * _betacf(a, b, x) / a
    else:
        ibeta = 1.0 - front * _betacf(b, a, 1.0 - x) / b
    return 0.5 * ibeta


@functools.lru_cache(maxsize=4096)
def _critical(p: float, df: float) -> float:
    """The ``p`` quantile (p > 0.5) of Student's t with ``df`` degrees of freedom (normal when
    df is infinite), by bisection on the exact tail."""
    z = NormalDist().inv_cdf(p)
    if math.isinf(df):
        return z
    tail = 1.0 - p
    low, high = z, max(2.0 * z, 1.0)
    while _t_sf(high, df) > tail:
        high *= 2.0
    for _ in range(200):
        mid = 0.5 * (low + high)
        if _t_sf(mid, df) > tail:
            low = mid
        else:
            high = mid
        if high - low < 1e-9 * high:
            break
    return 0.5 * (low + high)


# -- one region across the two sides ------------------------------------------------------------
@dataclass(frozen=True)
class _Test:
    """A region's statistic on both sides, ready for its interval."""

    samples: str
    base: _Estimate
    new: _Estimate
    base_var: float  # within-run variance of log(base statistic), runs pooled
    new_var: float
    base_runs: tuple[tuple[int, _Estimate], ...]  # each run's own statistic (pooled sides)
    new_runs: tuple[tuple[int, _Estimate], ...]
    weight_sq: float  # sum over both sides of (run share of the side's samples)^2


def _pooled(
    parts: Sequence[_Samples], kind: str, stat: str
) -> tuple[_Estimate, float, list[tuple[int, _Estimate]]] | None:
    """The pooled statistic of one side, its within-run variance, and each run's estimate."""
    if kind == "steps":
        runs = [_from_steps(p.steps, stat) for p in parts]
        pooled = (
            runs[0] if len(parts) == 1 else _from_steps([v for p in parts for v in p.steps], stat)
        )
    else:
        runs = [_from_calls(p.calls, stat) for p in parts]
        pooled = runs[0] if len(parts) == 1 else _from_calls(_merged(parts), stat)
    if pooled is None:
        return None
    total = sum(r.n for r in runs if r is not None)
    if len(parts) == 1 or any(r is None for r in runs) or total == 0:
        return pooled, pooled.log_var, []
    kept = [(p.run, r) for p, r in zip(parts, runs, strict=True) if r is not None]
    within = math.fsum((r.n / total) ** 2 * r.log_var for _, r in kept)
    return pooled, within, kept


def _log(value: float) -> float:
    return math.log(value) if value > 0.0 else math.nan


def _between(
    runs: Sequence[tuple[int, _Estimate]], offsets: Mapping[int, float]
) -> tuple[float, int, float]:
    """(squared deviations of the runs' log statistics, each less its run's ``offsets`` (the
    log speed factor of that run against its side), their degrees of freedom, the mean
    within-run variance) of one side; zeros for one run."""
    if len(runs) < 2:
        return 0.0, 0, 0.0
    logs = [_log(r.value_ms) - offsets.get(j, 0.0) for j, r in runs]
    if any(math.isnan(x) for x in logs) or any(math.isinf(r.log_var) for _, r in runs):
        return 0.0, 0, 0.0
    centre = math.fsum(logs) / len(logs)
    ss = math.fsum((x - centre) ** 2 for x in logs)
    return ss, len(runs) - 1, math.fsum(r.log_var for _, r in runs) / len(runs)


def _weights_sq(parts: Sequence[_Samples], kind: str) -> float:
    sizes = [len(p.steps) if kind == "steps" else p.calls.count for p in parts]
    total = sum(sizes)
    return math.fsum((s / total) ** 2 for s in sizes) if total else 1.0


def _kind(*sides: Sequence[_Samples]) -> str:
    """ "steps" where every run of every given side kept at least 2 steps of the region and each
    side has MIN_SAMPLES of them, else "calls"."""
    if all(len(p.steps) >= 2 for side in sides for p in side) and all(
        sum(len(p.steps) for p in side) >= MIN_SAMPLES for side in sides
    ):
        return "steps"
    return "calls"


def _merged(parts: Sequence[_Samples]) -> Histogram:
    merged = parts[0].calls
    for p in parts[1:]:
        merged = merged.merge(p.calls)
    return merged


def _point(parts: Sequence[_Samples], stat: str, kind: str) -> float:
    """The statistic of one side, shown whether or not it can be tested (NaN: none)."""
    if kind == "steps":
        values = sorted([v for p in parts for v in p.steps])
        if stat in ("mean", "per_step"):
            return math.fsum(values) / len(values)
        return _interp(values, _q(stat))
    merged = _merged(parts)
    if merged.count == 0 or stat == "per_step":
        return math.nan
    return merged.mean if stat == "mean" else merged.quantile(_q(stat))


def _test(base: Sequence[_Samples], new: Sequence[_Samples], stat: str, kind: str) -> _Test | str:
    """The test of one region, or the reason there is none."""
    if stat == "per_step" and kind != "steps":
        return "per_step needs steps marked (cudatimer.step()) and kept in both runs"
    b = _pooled(base, kind, stat)
    n = _pooled(new, kind, stat)
    if b is None or n is None:
        counts = [
            sum(len(p.steps) if kind == "steps" else p.calls.count for p in side)
            for side in (base, new)
        ]
        return (
            f"too few samples ({counts[0]} and {counts[1]} {kind}; at least {MIN_SAMPLES} "
            "on each side)"
        )
    return _Test(
        samples=kind,
        base=b[0],
        new=n[0],
        base_var=b[1],
        new_var=n[1],
        base_runs=tuple(b[2]),
        new_runs=tuple(n[2]),
        weight_sq=_weights_sq(base, kind) + _weights_sq(new, kind),
    )


@dataclass(frozen=True)
class _LogRatio:
    """log(new / base) of one region and its variance, before or after the speed factor."""

    shift: float
    var: float  # the whole variance
    extra: float  # its between-run part, whose degrees of freedom are few
    df: float  # degrees of freedom of ``extra`` (inf: assumed, not measured)
    measured: bool  # ``extra`` was measured from pooled runs (else the assumed spread)


def _between_parts(
    t: _Test, base_offsets: Mapping[int, float], new_offsets: Mapping[int, float]
) -> tuple[float, int, float]:
    """(squared deviations, degrees of freedom, df x mean within-run variance) of the runs'
    own statistics, both sides together."""
    ss_b, df_b, within_b = _between(t.base_runs, base_offsets)
    ss_n, df_n, within_n = _between(t.new_runs, new_offsets)
    return ss_b + ss_n, df_b + df_n, within_b * df_b + within_n * df_n


def _log_ratio(
    t: _Test,
    between_run: float,
    base_offsets: Mapping[int, float],
    new_offsets: Mapping[int, float],
    common: tuple[float, int] | None = None,
) -> _LogRatio:
    """The raw log ratio of a test, its within-run variance, and the between-run variance:
    measured where a side pooled runs (their statistics less each run's speed factor, given as
    ``*_offsets``; ``common``: (variance, df) measured over all regions of the group instead),
    never read below ``between_run`` (a relative spread per run)."""
    shift = _log(t.new.value_ms) - _log(t.base.value_ms)
    var = t.base_var + t.new_var
    ss, df, within = _between_parts(t, base_offsets, new_offsets)
    floor = between_run * between_run * t.weight_sq
    if not df:
        return _LogRatio(shift, var + floor, floor, math.inf, False)
    tau2 = max(0.0, (ss - within) / df)
    if common is not None:
        tau2, df = common
    measured = tau2 * t.weight_sq
    if measured <= floor:
        return _LogRatio(shift, var + floor, floor, math.inf, True)
    return _LogRatio(shift, var + measured, measured, float(df), True)


def _bounds(r: _LogRatio, alpha: float) -> tuple[float, float, float]:
    """(ratio, low, high) of exp(shift) at two-sided level 1 - alpha."""
    if math.isnan(r.shift) or math.isinf(r.var):
        ratio = math.exp(r.shift) if not math.isnan(r.shift) else math.nan
        return ratio, 0.0, math.inf
    df = math.inf
    if r.extra > 0.0 and math.isfinite(r.df):  # Welch-Satterthwaite: only the between-run
        df = max(1.0, r.var * r.var / (r.extra * r.extra / r.df))  # part has few degrees
    half = _critical(1.0 - alpha / 2.0, round(df, 2) if math.isfinite(df) else df) * math.sqrt(
        r.var
    )
    return math.exp(r.shift), math.exp(r.shift - half), math.exp(r.shift + half)


# -- the run-wide speed factor ------------------------------------------------------------------
def _median(values: Sequence[float]) -> float:
    return _interp(sorted(values), 0.5)


def _run_offsets(tests: Sequence[_Test], side: str) -> dict[int, float]:
    """Each pooled run's log speed factor against its side: over the regions every run of the
    side timed, the median of (that run's log statistic - the runs' mean of it)."""
    devs: dict[int, list[float]] = {}
    for t in tests:
        runs = t.base_runs if side == "base" else t.new_runs
        logs = [(j, _log(r.value_ms)) for j, r in runs]
        if len(logs) < 2 or any(math.isnan(x) for _, x in logs):
            continue
        centre = math.fsum(x for _, x in logs) / len(logs)
        for j, x in logs:
            devs.setdefault(j, []).append(x - centre)
    if not devs or min(map(len, devs.values())) < MIN_FACTOR_REGIONS:
        return {}
    return {j: _median(d) for j, d in devs.items()}


def _normalised(ratios: Sequence[_LogRatio]) -> list[tuple[_LogRatio, float]]:
    """Each region's log ratio less the median of the others' (its speed factor, returned as
    a ratio with it), with the variance of that median, and the regions' own spread around
    it (beyond what their variances explain) where it exceeds the between-run part already
    there. Needs MIN_FACTOR_REGIONS regions with a finite ratio and variance."""
    out = []
    for i, r in enumerate(ratios):
        others = [o for j, o in enumerate(ratios) if j != i]
        m = len(others)
        centre = _median([o.shift for o in others])
        # The median of m values of spreads s_j: its variance is about pi/2 / (m f(0)^2 ...),
        # i.e. (pi/2) / (m mean(1/s_j)^2) (the asymptotic variance of a sample median).
        inv = math.fsum(1.0 / math.sqrt(o.var) for o in others) / m
        centre_var = (math.pi / 2.0) / (m * inv * inv)
        # The others' own spread around their median, beyond their variances: how unlike
        # each other the regions moved between the runs (robust: the median of squares, which
        # one slowed region cannot move far; 0.4549 is the median of chi-square with 1 degree).
        squares = [(o.shift - centre) ** 2 for o in others]
        spread = max(
            0.0,
            _median(squares) / _CHI2_1_MEDIAN * m / (m - 1) - _median([o.var for o in others]),
        )
        extra, df = r.extra, r.df
        if spread > extra:
            extra, df = spread, math.inf
        # Regions follow the machine's speed with sensitivities of their own (a sleep hardly,
        # interpreted code fully): dividing by the factor leaves (sensitivity - 1) x log factor.
        sensitivity = (SENSITIVITY_SPREAD * centre) ** 2
        var = r.var - r.extra + extra + centre_var + sensitivity
        out.append((_LogRatio(r.shift - centre, var, extra, df, r.measured), math.exp(centre)))
    return out


def _verdict(low: float, high: float, margin: float) -> str:
    top, bottom = 1.0 + margin, 1.0 / (1.0 + margin)
    if low > 1.0:
        return "slower" if high > top else "same"
    if high < 1.0:
        return "faster" if low < bottom else "same"
    return "same" if bottom <= low and high <= top else "undecided"


# -- the comparison ---------------------------------------------------------------------------
def _meta_values(runs: Iterable[Summary], key: str) -> tuple[list[str], int]:
    known, unknown = [], 0
    for run in runs:
        value = dict(run.meta).get(key)
        if value:
            known.append(value)
        else:
            unknown += 1
    return list(dict.fromkeys(known)), unknown


def _machine_notes(
    base: Sequence[Summary], new: Sequence[Summary], labels: tuple[str, str], allow: bool
) -> list[str]:
    """Notes on where the runs ran; a ValueError when their devices differ, unless ``allow``."""
    notes = []
    base_dev, base_unknown = _meta_values(base, "device")
    new_dev, new_unknown = _meta_values(new, "device")
    if len(set(base_dev) | set(new_dev)) > 1:
        text = f"{labels[0]} ran on {' + '.join(base_dev) or '?'}, {labels[1]} on " + (
            " + ".join(new_dev) or "?"
        )
        if not allow:
            raise ValueError(
                f"{text}: times from different devices do not compare; pass "
                "--allow-other-device (allow_other_device=True) to compare them anyway"
            )
        notes.append(f"warning: {text}; compared anyway (allow_other_device)")
    if base_unknown or new_unknown:
        notes.append(
            f"the device is not recorded in {base_unknown + new_unknown} run(s) (saved by an "
            "older cudatimer): not checked"
        )
    base_host, _ = _meta_values(base, "host")
    new_host, _ = _meta_values(new, "host")
    if base_host and new_host and set(base_host) != set(new_host):
        notes.append(
            f"{labels[0]} ran on host {', '.join(base_host)}, {labels[1]} on {', '.join(new_host)}"
        )
    return notes


def compare_sides(
    base: Mapping[int | None, Sequence[Summary]],
    new: Mapping[int | None, Sequence[Summary]],
    *,
    max_slowdown: float = 0.05,
    stat: str = DEFAULT_STAT,
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
    """The gate's verdict of ``new`` against ``base`` (see the module's docstring)."""
    check_options(
        stat=stat,
        max_slowdown=max_slowdown,
        confidence=confidence,
        min_ms=min_ms,
        match=match,
        labels=labels,
        between_run=between_run,
    )
    for name, flag in (
        ("fail_undecided", fail_undecided),
        ("fail_missing", fail_missing),
        ("allow_other_device", allow_other_device),
        ("absolute", absolute),
    ):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be True or False, got {type(flag).__name__}")
    if (None in base) != (None in new):
        per_rank = labels[0] if None not in base else labels[1]
        raise ValueError(
            f"{per_rank} is a folder of per-rank files (rank{{N}}.json) and the other side is "
            "one run: compare folders of rank files with folders of rank files"
        )
    notes = _machine_notes(
        [r for runs in base.values() for r in runs],
        [r for runs in new.values() for r in runs],
        labels,
        allow_other_device,
    )
    ranks = list(dict.fromkeys([*base, *new]))
    missing_ranks = [r for r in ranks if r not in base or r not in new]
    if missing_ranks:
        for r in missing_ranks:
            notes.append(f"rank {r} is in {labels[0] if r in base else labels[1]} only")
    Key = tuple[int | None, str, str]
    rows: list[tuple[Key, list[_Samples], list[_Samples]]] = []
    ignored = 0
    for rank in ranks:
        if rank not in base or rank not in new:
            continue
        b_runs = [_run_samples(s, j) for j, s in enumerate(base[rank])]
        n_runs = [_run_samples(s, j) for j, s in enumerate(new[rank])]
        keys = dict.fromkeys(k for run in [*b_runs, *n_runs] for k in run)
        for name, clock in keys:
            if match is not None and not matches(name, match):
                ignored += 1
                continue
            b = [run[(name, clock)] for run in b_runs if (name, clock) in run]
            n = [run[(name, clock)] for run in n_runs if (name, clock) in run]
            rows.append(((rank, name, clock), b, n))
    kept: list[tuple[Key, int, int, float, float, _Test | str | None]] = []
    for key, b, n in rows:
        kind = _kind(*(side for side in (b, n) if side))
        test = _test(b, n, stat, kind) if b and n else None
        if isinstance(test, _Test):  # the same numbers the test read
            base_ms, new_ms = test.base.value_ms, test.new.value_ms
        else:
            base_ms = _point(b, stat, kind) if b else math.nan
            new_ms = _point(n, stat, kind) if n else math.nan
        if min_ms and not (base_ms >= min_ms or new_ms >= min_ms):  # NaN compares False
            ignored += 1
            continue
        kept.append((key, len(b), len(n), base_ms, new_ms, test))
    tested = sum(1 for *_, t in kept if isinstance(t, _Test))
    alpha = (1.0 - confidence) / max(1, tested)
    spread = float(BETWEEN_RUN if between_run is None else between_run)
    # Group the tests by rank and clock: the whole machine's speed moves the regions of one
    # process and one clock together.
    groups: dict[tuple[int | None, str], list[int]] = {}
    for index, ((rank, _, clock), *_, test) in enumerate(kept):
        if isinstance(test, _Test):
            groups.setdefault((rank, clock), []).append(index)
    ratios: dict[int, tuple[_LogRatio, float]] = {}
    factors: dict[tuple[int | None, str], float] = {}
    speed = []
    for (rank, clock), members in groups.items():
        group_tests = [cast(_Test, kept[i][5]) for i in members]
        offsets = (
            ({}, {})
            if absolute
            else tuple(_run_offsets(group_tests, side) for side in ("base", "new"))
        )
        usable = [
            i
            for i, t in zip(members, group_tests, strict=True)
            if math.isfinite(_log(t.new.value_ms) - _log(t.base.value_ms))
            and math.isfinite(t.base_var + t.new_var)
        ]
        normalise = not absolute and len(usable) >= MIN_FACTOR_REGIONS
        if not normalise:
            offsets = ({}, {})
        shared = None
        if normalise:
            # With the speed factor divided out, the regions' spreads between runs are taken to
            # be alike (as the regions' spread around the factor is): pooled over the regions,
            # their estimate has k (runs - 1) degrees of freedom, not runs - 1.
            parts = [_between_parts(kept_test, offsets[0], offsets[1]) for kept_test in group_tests]
            total_df = sum(df for _, df, _ in parts)
            if total_df:
                ss_all = math.fsum(ss - within for ss, _, within in parts)
                shared = (max(0.0, ss_all / total_df), total_df)
        raw = {
            i: _log_ratio(t, spread, offsets[0], offsets[1], shared)
            for i, t in zip(members, group_tests, strict=True)
        }
        for i in members:
            ratios[i] = (raw[i], 1.0)
        if not usable:
            continue
        factor = math.exp(_median([raw[i].shift for i in usable]))
        speed.append(SpeedFactor(rank, clock, factor, len(usable), normalise, spread))
        if normalise:
            factors[(rank, clock)] = factor
            for i, result in zip(usable, _normalised([raw[i] for i in usable]), strict=True):
                ratios[i] = result
    items = []
    for index, ((rank, name, clock), b_runs_n, n_runs_n, base_ms, new_ms, test) in enumerate(kept):
        common: dict[str, Any] = {
            "name": name,
            "clock": clock,
            "rank": rank,
            "base_ms": base_ms,
            "new_ms": new_ms,
            "base_runs": b_runs_n,
            "new_runs": n_runs_n,
        }
        if test is None:
            verdict = f"only in {labels[0] if b_runs_n else labels[1]}"
            items.append(RegionVerdict(verdict=verdict, ratio=None, low=None, high=None, **common))
        elif isinstance(test, str):
            factor = factors.get((rank, clock), 1.0)
            ratio = new_ms / base_ms / factor if base_ms > 0 and new_ms > 0 else None
            items.append(
                RegionVerdict(
                    verdict="undecided",
                    ratio=ratio,
                    low=None,
                    high=None,
                    reason=test,
                    factor=factor,
                    **common,
                )
            )
        else:
            log_ratio, factor = ratios[index]
            ratio, low, high = _bounds(log_ratio, alpha)
            verdict = _verdict(low, high, max_slowdown)
            reason = ""
            if verdict == "undecided":
                reason = (
                    f"too few samples for {stat} (or times of 0)"
                    if math.isinf(high)
                    else "too noisy"
                )
            items.append(
                RegionVerdict(
                    verdict=verdict,
                    ratio=ratio,
                    low=low,
                    high=high,
                    samples=test.samples,
                    base_n=test.base.n,
                    new_n=test.new.n,
                    reason=reason,
                    factor=factor,
                    **common,
                )
            )
    single = all(len(runs) == 1 for runs in base.values()) and all(
        len(runs) == 1 for runs in new.values()
    )
    if single and tested:
        notes.append(
            "one run on each side: the spread between runs is assumed (between_run), not "
            "measured; a shift of a whole run reads as a change unless divided out by the "
            "speed factor; pool several base runs (a folder, or several files) to measure it"
        )
    return Comparison(
        items=tuple(items),
        stat=stat,
        max_slowdown=float(max_slowdown),
        confidence=float(confidence),
        region_confidence=1.0 - alpha,
        tested=tested,
        fail_undecided=fail_undecided,
        fail_missing=fail_missing,
        labels=labels,
        notes=tuple(notes),
        ignored=ignored,
        absolute=absolute,
        speed=tuple(speed),
        between_run=spread,
    )


# -- for machines -------------------------------------------------------------------------------
FORMAT = "cudatimer.gate"


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def comparison_to_dict(c: Comparison) -> dict[str, Any]:
    """Plain data of a comparison for JSON (NaN and infinity as null)."""
    return {
        "format": FORMAT,
        "ok": c.ok,
        "stat": c.stat,
        "max_slowdown": c.max_slowdown,
        "confidence": c.confidence,
        "region_confidence": c.region_confidence,
        "tested": c.tested,
        "ignored": c.ignored,
        "fail_undecided": c.fail_undecided,
        "fail_missing": c.fail_missing,
        "labels": list(c.labels),
        "absolute": c.absolute,
        "between_run": c.between_run,
        "speed": [
            {
                "rank": f.rank,
                "clock": f.clock,
                "factor": _finite(f.factor),
                "regions": f.regions,
                "used": f.used,
                "between_run": f.between_run,
            }
            for f in c.speed
        ],
        "counts": {
            "slower": len(c.regressions),
            "faster": len(c.improvements),
            "same": len(c.same),
            "undecided": len(c.undecided),
            "missing": len(c.missing),
        },
        "regions": [
            {
                "name": v.name,
                "clock": v.clock,
                "rank": v.rank,
                "verdict": v.verdict,
                "base_ms": _finite(v.base_ms),
                "new_ms": _finite(v.new_ms),
                "ratio": _finite(v.ratio),
                "raw_ratio": _finite(v.raw_ratio),
                "factor": _finite(v.factor),
                "low": _finite(v.low),
                "high": _finite(v.high),
                "samples": v.samples,
                "base_n": v.base_n,
                "new_n": v.new_n,
                "base_runs": v.base_runs,
                "new_runs": v.new_runs,
                "reason": v.reason,
            }
            for v in c.items
        ],
        "notes": list(c.notes),
    }


def write_json(c: Comparison, path: str | os.PathLike[str]) -> None:
    """Write ``comparison_to_dict(c)`` as JSON to ``path`` (atomically)."""
    import json

    text = json.dumps(comparison_to_dict(c), indent=1, allow_nan=False) + "\n"
    write_atomic(path, text.encode())
