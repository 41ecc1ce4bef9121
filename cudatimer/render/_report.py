"""Renderers: frozen records in, text out. The only module that imports tabulate.

Two views of one Summary: ``flat`` (a row per region path and clock) and ``tree`` (regions
nested under their parents, with inclusive and self time, % of parent and % of total).
Each row's *time* is its GPU time where it was timed on the GPU, else its host time.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase

from tabulate import tabulate, tabulate_formats

from ..records._hist import Histogram
from ..records._records import BACKWARD_SUFFIX, RegionStats, Summary
from ..records._values import flop_rates

__all__ = [
    "COLUMNS",
    "COMPARE_STATS",
    "FLOP_COLUMNS",
    "HOST_BOUND_RATIO",
    "MEMORY_COLUMNS",
    "MIB",
    "SORTS",
    "VIEWS",
    "Compared",
    "compare_note",
    "compare_unit",
    "compared",
    "folded_ranks",
    "has_flops",
    "has_memory",
    "mem_mib",
    "mem_sampled",
    "per_step_note",
    "per_step_title",
    "render",
    "render_compare",
]

#: A GPU-timed region is flagged host-bound when its host time is at least this many times its
#: GPU time: the host spends longer issuing the region's work than the GPU spends running it,
#: so in a loop the GPU waits for Python and kernel launches. A GPU-bound region shows the
#: opposite (host time well under GPU time: the host runs ahead and the queue fills).
HOST_BOUND_RATIO = 1.5

VIEWS = ("flat", "tree")
SORTS = ("total", "mean", "calls", "name", "order")
# Tree glyphs: ASCII (a report at exit may print to a cp1252 pipe), no '|' (it splits Markdown
# table cells) and no leading spaces (tabulate strips them).
_BRANCH, _TRUNK = "+- ", ":  "
# Text shows at most this many parts of a path, and the tree indents this many levels: a region
# nested 3000 deep made a 225 MB flat report when every row spelt its whole path. The data
# (JSON, CSV, DataFrame, the Summary) keep whole paths.
_PATH_PARTS = 8
TREE_LEVELS = 24


def elide(path: str) -> str:
    """``path`` with its middle parts left out past ``_PATH_PARTS`` parts, for text:
    ``a/b/.../(2993 more)/x/y/z``."""
    if path.count("/") < _PATH_PARTS:
        return path
    parts = path.split("/")
    return "/".join([*parts[:2], f".../({len(parts) - 5} more)", *parts[-3:]])


@dataclass(eq=False)
class _Row:
    """One region with what the views derive from the whole summary."""

    r: RegionStats
    index: int
    parent: _Row | None = None  # the row of the parent path on the same clock
    shown_under: _Row | None = None  # where the tree view places it (any clock)
    children: list[_Row] = field(default_factory=list)  # same clock
    kids: list[_Row] = field(default_factory=list)  # tree placement
    gpu_self: float | None = None
    cpu_self: float = 0.0
    clamped: bool = False
    share: float = math.nan  # of the clock's total
    of_parent: float | None = None

    @property
    def time_ms(self) -> float:
        return self.r.total_ms


def analyse(regions: Sequence[RegionStats]) -> list[_Row]:
    rows = [_Row(r, i) for i, r in enumerate(regions)]
    by_key = {(row.r.name, row.r.clock): row for row in rows}
    by_name: dict[str, _Row] = {}
    for row in rows:
        by_name.setdefault(row.r.name, row)
    for row in rows:
        if "/" not in row.r.name:
            continue
        parent_path = row.r.name.rsplit("/", 1)[0]
        row.parent = by_key.get((parent_path, row.r.clock))
        row.shown_under = row.parent or by_name.get(parent_path)
        if row.parent is not None:
            row.parent.children.append(row)
        if row.shown_under is not None:
            row.shown_under.kids.append(row)
    totals: dict[str, float] = {}
    for row in rows:
        r = row.r
        if row.parent is None:  # a root of its clock: its time counts once in the total
            totals[r.clock] = totals.get(r.clock, 0.0) + row.time_ms
        # Children can add up to more than their parent when they overlap (on other streams,
        # or async regions). Rounding can too, by far less than the margins here: host sums
        # are of float64 ms, GPU spans are float32 (~6e-8 relative) from cudaEventElapsedTime.
        cpu_self = r.cpu_total_ms - sum(c.r.cpu_total_ms for c in row.children)
        row.cpu_self = max(0.0, cpu_self)
        row.clamped = cpu_self < -1e-9 * r.cpu_total_ms
        if r.gpu_total_ms is not None:
            gpu_self = r.gpu_total_ms - sum(c.r.gpu_total_ms or 0.0 for c in row.children)
            row.gpu_self = max(0.0, gpu_self)
            row.clamped = row.clamped or gpu_self < -1e-6 * r.gpu_total_ms
        if row.parent is not None and row.parent.time_ms > 0:
            row.of_parent = row.time_ms / row.parent.time_ms
    for row in rows:
        total = totals.get(row.r.clock, 0.0)
        row.share = row.time_ms / total if total > 0 else math.nan
    return rows


def _ms(value: float | None) -> str:
    if value is None or math.isnan(value):
        return "-"
    return f"{value:.3f}"


def _mib_cell(value: float | None) -> str:
    if value is None or math.isnan(value):
        return "-"
    return f"{value:.2f}"


def _pct(value: float | None) -> str:
    if value is None or math.isnan(value):
        return "-"
    return f"{100.0 * value:.1f}%"


def _ratio(r: RegionStats) -> float | None:
    if r.gpu_total_ms is None or r.gpu_total_ms <= 0:
        return None
    return r.cpu_total_ms / r.gpu_total_ms


#: Bytes per MiB: the memory columns (``mem_delta``, ``mem_peak``) are in MiB.
MIB = float(2**20)


def mem_mib(r: RegionStats, name: str, stat: str) -> float | None:
    """``stat`` (mean, max...) of the value column ``name`` of ``r`` in MiB; None when the row
    has no such value (not measured, or no CUDA allocator)."""
    tally = r.values.get(name)
    return None if tally is None else float(tally.stat(stat)) / MIB


def host_bound(r: RegionStats) -> bool:
    """True when ``r`` was timed on the GPU and its host time is >= HOST_BOUND_RATIO x GPU."""
    ratio = _ratio(r)
    return ratio is not None and ratio >= HOST_BOUND_RATIO


@dataclass(frozen=True)
class _Ctx:
    steps: int
    ranks: int = 1  # folded together into the summary (RankSummary.merged())


def folded_ranks(summary: Summary) -> int:
    """How many ranks ``summary`` holds folded together (``RankSummary.merged()``, ``merge
    --flat``): its totals are sums over them. 1 for the run of one process."""
    ranks = dict(summary.meta).get("ranks")
    return max(1, len(ranks.split(","))) if ranks else 1


def per_step_title(ranks: int) -> str:
    """The per-step column's title: per rank when ranks were folded together (a sum over 2
    ranks of 25 ms a step each must not read as 50 ms a step)."""
    return "ms/step/rank" if ranks > 1 else "ms/step"


def per_step_note(ranks: int) -> str:
    return (
        f"ms/step/rank: a region's time per step on one rank, the mean over the {ranks} ranks "
        f"folded together (total / steps / {ranks})"
    )


_Cell = Callable[[_Row, _Ctx], str]

#: Column key -> (header, cell). ``render(columns=[...])`` picks from these keys.
COLUMNS: dict[str, tuple[str, _Cell]] = {
    "region": ("region", lambda row, _: elide(row.r.name)),
    "clock": ("clock", lambda row, _: row.r.clock),
    "calls": ("calls", lambda row, _: str(row.r.calls)),
    "gpu_total": ("gpu total ms", lambda row, _: _ms(row.r.gpu_total_ms)),
    "gpu_self": ("gpu self ms", lambda row, _: _ms(row.gpu_self)),
    "gpu_mean": ("gpu mean ms", lambda row, _: _ms(row.r.gpu_mean_ms)),
    "gpu_min": ("gpu min ms", lambda row, _: _ms(row.r.gpu_min_ms)),
    "gpu_p50": ("gpu p50 ms", lambda row, _: _ms(row.r.gpu_p50_ms)),
    "gpu_p90": ("gpu p90 ms", lambda row, _: _ms(row.r.gpu_p90_ms)),
    "gpu_p99": ("gpu p99 ms", lambda row, _: _ms(row.r.gpu_p99_ms)),
    "gpu_max": ("gpu max ms", lambda row, _: _ms(row.r.gpu_max_ms)),
    "cpu_total": ("cpu total ms", lambda row, _: _ms(row.r.cpu_total_ms)),
    "cpu_self": ("cpu self ms", lambda row, _: _ms(row.cpu_self)),
    "cpu_mean": ("cpu mean ms", lambda row, _: _ms(row.r.cpu_mean_ms)),
    "cpu_min": ("cpu min ms", lambda row, _: _ms(row.r.cpu_min_ms)),
    "cpu_max": ("cpu max ms", lambda row, _: _ms(row.r.cpu_max_ms)),
    "cpu_p50": ("cpu p50 ms", lambda row, _: _ms(row.r.cpu_p50_ms)),
    "cpu_p90": ("cpu p90 ms", lambda row, _: _ms(row.r.cpu_p90_ms)),
    "cpu_p99": ("cpu p99 ms", lambda row, _: _ms(row.r.cpu_p99_ms)),
    "pct_parent": ("% parent", lambda row, _: _pct(row.of_parent)),
    "pct_total": ("% total", lambda row, _: _pct(row.share)),
    "per_step": (
        "ms/step",  # "ms/step/rank" for ranks folded together (per_step_title)
        lambda row, ctx: _ms(row.time_ms / ctx.steps / ctx.ranks) if ctx.steps else "-",
    ),
    "cpu_gpu": (
        "cpu/gpu",
        lambda row, _: "-" if (x := _ratio(row.r)) is None else f"{x:.2f}",
    ),
    "bound": ("bound", lambda row, _: "host" if host_bound(row.r) else ""),
    "syncs": ("syncs", lambda row, _: str(row.r.syncs)),
    "skipped": ("skipped", lambda row, _: str(row.r.skipped)),
    # Memory (memory=True): the mean a call leaves allocated, the highest a call held.
    "mem_delta": ("mem delta MiB", lambda row, _: _mib_cell(mem_mib(row.r, "mem_delta", "mean"))),
    "mem_peak": ("mem peak MiB", lambda row, _: _mib_cell(mem_mib(row.r, "mem_peak", "max"))),
    # The calls that carry memory values (memory_every=N measures one episode in N).
    "mem_calls": ("mem calls", lambda row, _: _mem_calls(row.r)),
    # FLOPs (flops=True): FLOP a call, achieved TFLOP/s ("*": counted on a sample of calls),
    # MFU (a % of the peak of the device and dtype the row's FLOPs mostly ran in).
    "flop": ("GFLOP", lambda row, _: _gflop_cell(row.r.flop_mean)),
    "tflop_per_s": ("TFLOP/s", lambda row, _: _tflops_cell(row.r)),
    "mfu": ("MFU", lambda row, _: _pct(row.r.mfu)),
}
#: The columns added to the default ones when some row holds memory values.
MEMORY_COLUMNS = ("mem_delta", "mem_peak")
#: The columns added to the default ones when some row was counted (flops=True).
FLOP_COLUMNS = ("tflop_per_s", "mfu")


def has_flops(summary: Summary) -> bool:
    """True when some region of ``summary`` holds FLOP counts (``flops=True``)."""
    return any("flop" in r.values for r in summary.regions)


def _gflop_cell(flop: float | None) -> str:
    if flop is None:
        return "-"
    return f"{flop / 1e9:.3g}"


def _rate_cell(rate: float | None) -> str:
    return "-" if rate is None or math.isnan(rate) else f"{rate:.3g}"


def _tflops_cell(r: RegionStats) -> str:
    rate = r.tflop_per_s
    if rate is None:
        return "-"
    return f"{rate:.3g}" + ("*" if r.flop_sampled else "")


def _mem_calls(r: RegionStats) -> str:
    tally = r.values.get("mem_delta")
    return "-" if tally is None else str(tally.count)


def mem_sampled(summary: Summary) -> bool:
    """True when some row's memory values cover fewer calls than it has (memory_every)."""
    return any(
        (t := r.values.get("mem_delta")) is not None and t.count < r.calls for r in summary.regions
    )


_TEXT_COLUMNS = ("region", "clock", "bound")
_FLAT = (
    "region",
    "clock",
    "calls",
    "gpu_total",
    "gpu_mean",
    "gpu_p50",
    "gpu_p90",
    "gpu_p99",
    "gpu_max",
    "cpu_total",
    "cpu_mean",
)
_TREE = (
    "region",
    "clock",
    "calls",
    "gpu_total",
    "gpu_self",
    "cpu_total",
    "cpu_self",
    "pct_parent",
    "pct_total",
)


def _check_fmt(fmt: object) -> str:
    if not isinstance(fmt, str):
        raise TypeError(f"fmt must be a tabulate format name (str), got {type(fmt).__name__}")
    if fmt not in tabulate_formats:
        raise ValueError(
            f"fmt must be a tabulate format, one of {', '.join(tabulate_formats)}; got {fmt!r}"
        )
    return fmt


def _sort_key(sort: str, view: str) -> Callable[[_Row], tuple[object, ...]]:
    if sort == "order":
        return lambda row: (row.index,)
    if sort == "name":
        if view == "tree":
            return lambda row: (row.r.leaf, row.r.clock)
        return lambda row: (row.r.name, row.r.clock)
    if sort == "calls":
        return lambda row: (-row.r.calls, row.index)
    if sort == "mean":
        return lambda row: (-(row.time_ms / row.r.calls if row.r.calls else 0.0), row.index)
    return lambda row: (-row.time_ms, row.index)


def matches(name: str, pattern: str) -> bool:
    if not any(ch in pattern for ch in "*?["):
        return pattern in name
    return fnmatchcase(name, pattern) or fnmatchcase(name.rsplit("/", 1)[-1], pattern)


def _columns(
    columns: Sequence[str] | None, view: str, rows: Sequence[_Row], summary: Summary
) -> list[str]:
    if columns is None:
        chosen = list(_TREE if view == "tree" else _FLAT)
        if not any(row.r.gpu_total_ms is not None for row in rows):
            # Nothing ran on a GPU: the host distribution takes the GPU columns' place.
            chosen = [c for c in chosen if not c.startswith("gpu_")]
            if view == "flat":
                chosen += ["cpu_p50", "cpu_p90", "cpu_p99", "cpu_max"]
        if any(host_bound(row.r) for row in rows):
            chosen.append("bound")
        if any(r.syncs for r in summary.regions):
            chosen.append("syncs")
        if has_memory(summary):
            chosen += MEMORY_COLUMNS
            if mem_sampled(summary):
                chosen.append("mem_calls")
        if has_flops(summary):
            chosen += FLOP_COLUMNS
        return chosen
    if isinstance(columns, str) or not isinstance(columns, Sequence):
        raise TypeError(
            f"columns must be a list of column names, got {type(columns).__name__} ({columns!r})"
        )
    unknown = [c for c in columns if c not in COLUMNS]
    if unknown or not columns:
        raise ValueError(f"columns must name some of {', '.join(COLUMNS)}; got {list(columns)!r}")
    return list(columns)


def has_memory(summary: Summary) -> bool:
    """True when some region of ``summary`` holds memory values (``memory=True``)."""
    return any(name in r.values for r in summary.regions for name in MEMORY_COLUMNS)


def render(
    summary: Summary,
    *,
    view: str = "flat",
    fmt: str = "simple",
    sort: str = "total",
    columns: Sequence[str] | None = None,
    match: str | None = None,
    min_share: float = 0.0,
    top_syncs: int = 10,
) -> str:
    """The table of a Summary, then notes (and the top sync sites when there are any).

    >>> import cudatimer
    >>> s = cudatimer.Summary(regions=(cudatimer.RegionStats(
    ...     "step", "host", 2, None, cudatimer.Histogram.of([1.0, 3.0])),))
    >>> print(render(s, columns=["region", "calls", "cpu_total"], fmt="plain"))
    region      calls    cpu total ms
    step            2           4.000

    ``view``: "flat" (one row per region path and clock) or "tree" (nested under parents, with
    self time = inclusive time minus that of the children on the same clock, % of parent and
    % of the clock's total). ``sort``: total, mean, calls, name or order (first seen); the
    tree sorts siblings. ``fmt``: any tabulate format ("github" for Markdown, "plain", ...).
    ``columns``: keys of ``COLUMNS`` (default: a set per view; when nothing ran on a GPU the
    GPU columns give way to host percentiles; ``bound``, ``syncs`` and the memory columns
    ``mem_delta``, ``mem_peak`` are added when some row has them).
    ``match``: keep regions whose path (or leaf name) matches this glob; text without
    wildcards matches paths containing it. ``min_share``: keep regions with at least this
    fraction (0-1) of their clock's total time. The tree keeps the ancestors of kept rows.
    GPU time is the span between a region's start and end events on its stream (idle gaps
    included); CPU time is host wall time between enter and exit.
    """
    if not isinstance(summary, Summary):
        raise TypeError(f"summary must be a cudatimer.Summary, got {type(summary).__name__}")
    if view not in VIEWS:
        raise ValueError(f"view must be one of {', '.join(VIEWS)}; got {view!r}")
    fmt = _check_fmt(fmt)
    if sort not in SORTS:
        raise ValueError(f"sort must be one of {', '.join(SORTS)}; got {sort!r}")
    if match is not None and not isinstance(match, str):
        raise TypeError(f"match must be a glob pattern (str), got {type(match).__name__}")
    if isinstance(min_share, bool) or not isinstance(min_share, (int, float)):
        raise TypeError(f"min_share must be a fraction (float), got {type(min_share).__name__}")
    if not 0.0 <= min_share <= 1.0:
        raise ValueError(f"min_share must be between 0 and 1 (a fraction), got {min_share!r}")
    if isinstance(top_syncs, bool) or not isinstance(top_syncs, int):
        raise TypeError(f"top_syncs must be an int, got {type(top_syncs).__name__}")
    if top_syncs < 0:
        raise ValueError(f"top_syncs must be >= 0, got {top_syncs}")

    rows = analyse(summary.regions)
    keep = [
        row
        for row in rows
        if (match is None or matches(row.r.name, match))
        and (min_share == 0.0 or (not math.isnan(row.share) and row.share >= min_share))
    ]
    key = _sort_key(sort, view)
    if view == "tree":
        wanted = {id(row) for row in keep}
        for row in keep:
            up = row.shown_under
            while up is not None and id(up) not in wanted:
                wanted.add(id(up))
                up = up.shown_under
        shown = _tree_order(rows, wanted, key)
    else:
        shown = [(row, elide(row.r.name)) for row in sorted(keep, key=key)]
    chosen = _columns(columns, view, rows, summary)
    ctx = _Ctx(steps=summary.steps, ranks=folded_ranks(summary))
    table = [
        [label if c == "region" else COLUMNS[c][1](row, ctx) for c in chosen]
        for row, label in shown
    ]
    if not summary.regions:
        text = "cudatimer: no regions recorded"
    elif not table:
        text = "cudatimer: no region matches the filters"
    else:
        headers = [per_step_title(ctx.ranks) if c == "per_step" else COLUMNS[c][0] for c in chosen]
        align = ["left" if c in _TEXT_COLUMNS else "right" for c in chosen]
        text = tabulate(table, headers=headers, tablefmt=fmt, disable_numparse=True, colalign=align)
    text += _sync_table(summary, fmt, top_syncs)
    return text + "".join(f"\nnote: {n}" for n in summary_notes(summary, rows, shown, chosen))


def _tree_order(
    rows: list[_Row], wanted: set[int], key: Callable[[_Row], tuple[object, ...]]
) -> list[tuple[_Row, str]]:
    """Rows parents first, children sorted by ``key``, with their tree labels. A loop over an
    explicit stack, not recursion: a run of regions nested 2000 deep renders too."""
    out: list[tuple[_Row, str]] = []
    roots = sorted((r for r in rows if r.shown_under is None and id(r) in wanted), key=key)
    todo: list[tuple[_Row, str, int]] = [(root, "", 0) for root in reversed(roots)]
    while todo:
        row, prefix, level = todo.pop()
        label = elide(row.r.name) if row.shown_under is None else row.r.leaf
        if level > TREE_LEVELS:  # the indent stops growing; the level is written instead
            label = f"[level {level}] {label}"
        out.append((row, prefix + _BRANCH + label if level else label))
        below = prefix + _TRUNK if 0 < level <= TREE_LEVELS else prefix
        kids = sorted((k for k in row.kids if id(k) in wanted), key=key)
        todo.extend((kid, below, level + 1) for kid in reversed(kids))
    return out


def _sync_table(summary: Summary, fmt: str, top: int) -> str:
    sites = sorted(summary.sync_sites, key=lambda s: (-s.count, s.location, s.kind, s.region))
    if not sites or top == 0:
        return ""
    rows = [[s.location, s.kind, str(s.count), elide(s.region)] for s in sites[:top]]
    table = tabulate(
        rows,
        headers=["location", "kind", "count", "region"],
        tablefmt=fmt,
        disable_numparse=True,
        colalign=("left", "left", "right", "left"),
    )
    more = len(sites) - top
    tail = f"\n... and {more} more site(s)" if more > 0 else ""
    return f"\n\ntop sync sites (host waited for the GPU here)\n{table}{tail}"


def summary_notes(
    summary: Summary, rows: list[_Row], shown: list[tuple[_Row, str]], chosen: list[str]
) -> list[str]:
    notes = []
    meta = dict(summary.meta)
    if meta.get("disabled_note"):  # first: it explains an empty table
        notes.append(meta["disabled_note"])
    if meta.get("core_note"):  # before the notes on the rows, which some readers take last
        notes.append(meta["core_note"])
    if meta.get("window") == "no steps":
        notes.append(
            "this summary's window holds no step, so it has no regions: a window covers "
            "finished steps only (each step() call ends one), unless steps= names them"
        )
    elif "window" in meta:
        window = f"statistics cover {meta['window']} ({summary.steps} step(s))"
        if any(r.syncs for r in summary.regions):
            window += "; sync counts cover the whole run"
        notes.append(window)
    if meta.get("window_note"):
        notes.append(meta["window_note"])
    if meta.get("compile_note"):
        notes.append(meta["compile_note"])
    if meta.get("graph_note"):
        notes.append(meta["graph_note"])
    ranks = folded_ranks(summary)
    if "per_step" in chosen and ranks > 1 and summary.steps:
        notes.append(per_step_note(ranks))
    if any(c in chosen for c in MEMORY_COLUMNS) and has_memory(summary):
        notes.append(
            "mem delta MiB: what a call leaves allocated (bytes at exit minus at enter, mean "
            "over calls, < 0 where it frees); mem peak MiB: the most a call held above its "
            "enter level while open (max over calls); bytes tensors asked the CUDA caching "
            "allocator for (docs/memory.md)"
        )
    if meta.get("memory_note"):
        notes.append(meta["memory_note"])
    notes += flop_notes(summary, chosen, [row.r for row, _ in shown])
    if meta.get("memory_oom_note"):
        notes.append(meta["memory_oom_note"])
    hidden = len(rows) - len(shown)
    if hidden > 0:
        notes.append(f"{hidden} region(s) hidden by match/min_share")
    if "bound" in chosen and any(host_bound(row.r) for row, _ in shown):
        notes.append(
            f"bound=host: host time >= {HOST_BOUND_RATIO:g}x GPU time, the host issues this "
            "region's work slower than the GPU runs it (launch/Python bound)"
        )
    clamped = [elide(row.r.name) for row, _ in shown if row.clamped]
    if clamped and any(c in chosen for c in ("gpu_self", "cpu_self")):
        notes.append(
            f"children of {', '.join(clamped)} add up to more than the region itself "
            "(they overlap, e.g. on other streams or threads); its self time is shown as 0"
        )
    skipped = sum(r.skipped for r in summary.regions)
    if skipped:
        notes.append(f"{skipped} call(s) had no GPU timing (entered during CUDA graph capture)")
    sampled = [elide(r.name) for r in summary.regions if r.calls > r.cpu.count + _counting(r)]
    if sampled:  # every=N: calls counts all of them, the histograms only the timed ones
        notes.append(
            f"{', '.join(dict.fromkeys(sampled))}: sampled (every=N); times cover the timed "
            "calls only (estimate a total as mean x calls)"
        )
    for c in summary.backward_coverage:
        model = elide(c.region.removesuffix(BACKWARD_SUFFIX))
        notes.append(
            f"backward coverage: {elide(c.region)} ({c.clock}): its {c.children} child row(s) "
            f"cover {_pct(c.fraction)} of its {_ms(c.total_ms)} ms ({_ms(c.uncovered_ms)} ms "
            f"ran in no child row: the backward of {model}'s own forward code "
            "after its last submodule call, such as a loss computed in forward)"
        )
    if summary.pending:
        notes.append(
            f"{summary.pending} sample(s) were still running on the GPU when the report timed "
            "out; they are kept and will appear in a later report"
        )
    if summary.open:
        notes.append(f"{summary.open} region(s) still open on this thread are not included")
    return notes


def _counting(r: RegionStats) -> int:
    """Calls of ``r`` left untimed because they were counting FLOPs (flops=True)."""
    tally = r.values.get("flop_untimed")
    return 0 if tally is None else tally.count


def flop_notes(summary: Summary, chosen: Sequence[str], shown: Sequence[RegionStats]) -> list[str]:
    """The notes under a table that shows FLOP columns: what they mean, the sampled and the
    host-bound rows, the peaks used, the rows with ops left uncounted."""
    if not any(c in chosen for c in ("flop", *FLOP_COLUMNS)) or not has_flops(summary):
        return []
    meta = dict(summary.meta)
    notes = [
        "TFLOP/s: a row's FLOPs a call (counted from its ops, children included) over its "
        "mean time a call (GPU time where timed on the GPU, else host); MFU: that over the "
        "dense peak of the device and dtype most of its FLOPs ran in (docs/flops.md)"
    ]
    sampled = [r.name for r in shown if "flop" in r.values and r.flop_sampled]
    if sampled:
        notes.append(
            f"*: FLOPs counted on a sample of calls (the mean of the counted ones): "
            f"{', '.join(elide(n) for n in sampled[:8])}"
            + (f" and {len(sampled) - 8} more" if len(sampled) > 8 else "")
        )
    bound = [r.name for r in shown if "flop" in r.values and host_bound(r)]
    if bound:
        notes.append(
            f"{len(bound)} counted row(s) are host-bound (bound=host): their GPU waited for "
            "launches, so their TFLOP/s and MFU read low for launch reasons, not kernel speed"
        )
    untimed = sum(_counting(r) for r in shown)
    if untimed:
        notes.append(
            f"{untimed} call(s) counted their FLOPs under a dispatch mode (slower) and are left "
            "out of the times (each signature's first call; a sample of the others)"
        )
    if meta.get("flop_peaks"):
        notes.append(f"peaks (TFLOP/s) used for MFU: {meta['flop_peaks']}")
    if meta.get("flop_note"):
        notes.append(meta["flop_note"])
    if meta.get("flop_uncounted"):
        notes.append(
            "ops with no FLOP formula, left out of the counts (register one with "
            f"torch.utils.flop_counter.register_flop_formula): {meta['flop_uncounted']}"
        )
    return notes


# -- comparing two runs ----------------------------------------------------------------------
COMPARE_STATS = (
    "mean",
    "total",
    "per_step",
    "p50",
    "p90",
    "p99",
    "min",
    "max",
    "mem_delta",
    "mem_peak",
    "tflop_per_s",
    "mfu",
)
# The FLOP stats compared (flops=True rows): higher is faster.
_FLOP_STATS = ("tflop_per_s", "mfu")
# The memory stats compared: (value column, its statistic): the mean a call leaves, the
# highest a call held.
_MEMORY_STATS = {"mem_delta": ("mem_delta", "mean"), "mem_peak": ("mem_peak", "max")}


def compare_unit(stat: str) -> str:
    """The unit of a comparison's columns: ``mean ms``, ``ms/step``, ``mem peak MiB``."""
    if stat in _MEMORY_STATS:
        return f"{stat.replace('_', ' ')} MiB"
    if stat in _FLOP_STATS:
        return "TFLOP/s" if stat == "tflop_per_s" else "MFU"
    return "ms/step" if stat == "per_step" else f"{stat} ms"


def _stat(r: RegionStats, stat: str, steps: int) -> float:
    memory = _MEMORY_STATS.get(stat)
    if memory is not None:
        mib = mem_mib(r, *memory)
        return math.nan if mib is None else mib
    if stat in _FLOP_STATS:
        value = r.tflop_per_s if stat == "tflop_per_s" else r.mfu
        return math.nan if value is None else value
    hist: Histogram = r.gpu if r.gpu is not None and r.gpu.count else r.cpu
    if hist.count == 0:
        return math.nan
    if stat == "total":
        return hist.total
    if stat == "mean":
        return hist.mean
    if stat == "per_step":
        return hist.total / steps if steps else math.nan
    if stat == "min":
        return hist.min
    if stat == "max":
        return hist.max
    return hist.quantile(int(stat[1:]) / 100.0)


@dataclass(frozen=True)
class Compared:
    """One region of a comparison: its ``stat`` in both runs (NaN where absent or untimed),
    new / base (None where either is missing or not positive) and the verdict's text."""

    name: str
    clock: str
    base_ms: float
    new_ms: float
    ratio: float | None
    change: str


def compared(
    base: Summary,
    new: Summary,
    *,
    stat: str = "mean",
    tolerance: float = 0.02,
    labels: tuple[str, str] = ("base", "new"),
) -> list[Compared]:
    """The rows of :func:`render_compare` as data (base's regions first, then new's own), after
    the same checks; the HTML report's comparison reads them too."""
    for name, value in (("base", base), ("new", new)):
        if not isinstance(value, Summary):
            raise TypeError(f"{name} must be a cudatimer.Summary, got {type(value).__name__}")
    if stat not in COMPARE_STATS:
        raise ValueError(f"stat must be one of {', '.join(COMPARE_STATS)}; got {stat!r}")
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)):
        raise TypeError(f"tolerance must be a fraction (float), got {type(tolerance).__name__}")
    if tolerance < 0:
        raise ValueError(f"tolerance must be a fraction >= 0, got {tolerance!r}")
    if stat == "per_step" and not (base.steps and new.steps):
        raise ValueError("stat='per_step' needs both runs to have marked steps (step())")
    old_rows = {(r.name, r.clock): r for r in base.regions}
    new_rows = {(r.name, r.clock): r for r in new.regions}
    out = []
    for key in list(old_rows) + [k for k in new_rows if k not in old_rows]:
        a, b = old_rows.get(key), new_rows.get(key)
        x = _stat(a, stat, base.steps) if a else math.nan
        y = _stat(b, stat, new.steps) if b else math.nan
        ratio: float | None = None
        if a is None:
            verdict = f"only in {labels[1]}"
        elif b is None:
            verdict = f"only in {labels[0]}"
        elif stat in _MEMORY_STATS:
            verdict, ratio = _memory_change(x, y, tolerance)
        elif math.isnan(x) or math.isnan(y) or x <= 0 or y <= 0:
            verdict = "-"
        else:
            ratio = y / x
            if abs(ratio - 1.0) <= tolerance:
                verdict = "same"
            elif stat in _FLOP_STATS:  # more FLOP/s: faster
                verdict = f"{ratio:.2f}x faster" if ratio > 1.0 else f"{1.0 / ratio:.2f}x slower"
            elif ratio < 1.0:
                verdict = f"{1.0 / ratio:.2f}x faster"
            else:
                verdict = f"{ratio:.2f}x slower"
        out.append(Compared(key[0], key[1], x, y, ratio, verdict))
    return out


def _memory_change(x: float, y: float, tolerance: float) -> tuple[str, float | None]:
    """The verdict on two memory values (MiB) and their ratio (None unless both > 0): by
    ratio where both are positive, else by difference (a delta may be 0 or negative)."""
    if math.isnan(x) or math.isnan(y):
        return "-", None
    if x > 0 and y > 0:
        ratio = y / x
        if abs(ratio - 1.0) <= tolerance:
            return "same", ratio
        return (f"{1.0 / ratio:.2f}x less" if ratio < 1.0 else f"{ratio:.2f}x more"), ratio
    if abs(y - x) <= tolerance * max(abs(x), abs(y)):
        return "same", None
    return (f"{y - x:+.2f} MiB", None)


def compare_note(stat: str, tolerance: float) -> str:
    if stat in _MEMORY_STATS:
        what = (
            "bytes a call leaves allocated (mean)"
            if stat == "mem_delta"
            else "the most a call held above its enter level (max)"
        )
        return (
            f"{stat} per region in MiB: {what}; regions measured with memory=True only; "
            f"'same' = within {100 * tolerance:g}%"
        )
    if stat in _FLOP_STATS:
        return (
            f"{compare_unit(stat)} per region (flops=True rows only; higher is faster); "
            f"'same' = within {100 * tolerance:g}%"
        )
    return (
        f"{stat} per region; GPU time where timed on the GPU, else host time; "
        f"'same' = within {100 * tolerance:g}%"
    )


def render_compare(
    base: Summary,
    new: Summary,
    *,
    stat: str = "mean",
    fmt: str = "simple",
    tolerance: float = 0.02,
    labels: tuple[str, str] = ("base", "new"),
) -> str:
    """Per-region comparison of two runs: base and new times, new/base and faster/slower.

    Regions are matched by path and clock; each row compares the GPU time where the region
    was timed on the GPU, else host time. ``stat``: mean (per call, the default: runs of
    different lengths compare fairly), total, per_step (total / steps), p50, p90, p99, min or
    max; or memory (``memory=True`` regions, MiB): mem_delta (the mean a call leaves
    allocated) or mem_peak (the most a call held). Changes within ``tolerance`` (a fraction,
    default 2%) read "same".
    """
    for name, value in (("base", base), ("new", new)):
        if not isinstance(value, Summary):
            raise TypeError(f"{name} must be a cudatimer.Summary, got {type(value).__name__}")
    if stat not in COMPARE_STATS:
        raise ValueError(f"stat must be one of {', '.join(COMPARE_STATS)}; got {stat!r}")
    fmt = _check_fmt(fmt)
    rows = compared(base, new, stat=stat, tolerance=tolerance, labels=labels)
    cell: Callable[[float | None], str] = _mib_cell if stat in _MEMORY_STATS else _ms
    if stat in _FLOP_STATS:
        cell = _pct if stat == "mfu" else _rate_cell
    table = [
        [
            elide(c.name),
            c.clock,
            cell(c.base_ms),
            cell(c.new_ms),
            "-" if c.ratio is None else f"{c.ratio:.3f}",
            c.change,
        ]
        for c in rows
    ]
    if not table:
        return "cudatimer: no regions in either run"
    unit = compare_unit(stat)
    headers = [
        "region",
        "clock",
        f"{labels[0]} {unit}",
        f"{labels[1]} {unit}",
        f"{labels[1]}/{labels[0]}",
        "change",
    ]
    align = ("left", "left", "right", "right", "right", "left")
    text: str = tabulate(
        table, headers=headers, tablefmt=fmt, disable_numparse=True, colalign=align
    )
    return text + f"\nnote: {compare_note(stat, tolerance)}"


# -- the performance gate (cudatimer compare --max-slowdown) ---------------------------------
# Imported here, not at the top, so that this addition stays local to the compare section.
from ..records._compare import Comparison, RegionVerdict  # noqa: E402

__all__ += ["gate_headline", "gate_notes", "level_text", "normalised", "render_gate", "speed_notes"]

# The table lists what needs a look first: what fails, what cannot be told, then the rest.
_VERDICT_ORDER = {"slower": 0, "undecided": 1, "faster": 3, "same": 4}


def level_text(level: float) -> str:
    """A confidence level as a percentage with the digits that tell it from 100%:
    0.95 -> "95%", 0.99375 -> "99.38%"."""
    digits = max(2, math.ceil(-math.log10(max(1e-12, 1.0 - level)))) + 1
    return f"{100.0 * level:.{digits}g}%"


def _interval_text(v: RegionVerdict) -> str:
    if v.low is None or v.high is None:
        return "-"
    high = "inf" if math.isinf(v.high) else f"{v.high:.3f}"
    return f"{v.low:.3f}-{high}"


def _ratio_text(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.3f}"


def _verdict_text(v: RegionVerdict) -> str:
    return f"{v.verdict} ({v.reason})" if v.reason else v.verdict


def _samples_text(v: RegionVerdict) -> str:
    if not v.samples:
        return "-"
    runs = ""
    if v.base_runs > 1 or v.new_runs > 1:
        runs = f" ({v.base_runs}+{v.new_runs} runs)"
    return f"{v.base_n}/{v.new_n} {v.samples}{runs}"


def gate_headline(c: Comparison) -> str:
    """One line: passed or failed, and how many regions got each verdict."""
    counts = [
        (len(c.regressions), "slower"),
        (len(c.undecided), "undecided"),
        (len(c.missing), "in one run only"),
        (len(c.improvements), "faster"),
        (len(c.same), "same"),
    ]
    told = ", ".join(f"{n} {what}" for n, what in counts if n) or "no regions"
    state = "passed" if c.ok else "FAILED"
    used = [f for f in c.speed if f.used]
    speed = f", speed factor {used[0].factor:.3f}" if len(used) == 1 else ""
    return f"cudatimer: gate {state} (max slowdown {100 * c.max_slowdown:g}%{speed}): {told}"


def normalised(c: Comparison) -> bool:
    """True when some region's ratio was divided by a run-wide speed factor."""
    return any(f.used for f in c.speed)


def speed_notes(c: Comparison) -> list[str]:
    """What the run-wide speed factors were, and what dividing them out means."""
    base, new = c.labels
    notes = []
    for f in c.speed:
        where = f"rank {f.rank}, {f.clock}" if f.rank is not None else f.clock
        if f.used:
            notes.append(
                f"speed factor {new}/{base} ({where}): {f.factor:.3f}, the median ratio of "
                f"{f.regions} regions; each region is gated on its ratio divided by the median "
                "ratio of the others (vs speed), so the whole machine running faster or "
                "slower is no regression (absolute: raw ratios)"
            )
            if abs(math.log(f.factor)) > math.log1p(c.max_slowdown):
                slower = "slower" if f.factor > 1.0 else "faster"
                notes.append(
                    f"warning: the whole {new} run ({where}) ran {abs(f.factor - 1):.1%} "
                    f"{slower} than {base}: divided out, so a slowdown of every region alike "
                    "passes; gate with absolute to see it"
                )
        elif c.absolute:
            notes.append(
                f"absolute: raw ratios ({where}; the median ratio of {f.regions} regions was "
                f"{f.factor:.3f})"
            )
        else:
            notes.append(
                f"raw ratios ({where}): {f.regions} region(s) tested, fewer than 4, too few for "
                "a run-wide speed factor"
            )
    floors = sorted({f.between_run for f in c.speed})
    if floors:
        notes.append(
            "between runs: a region's statistic is taken to vary by "
            + " / ".join(f"{x:.1%}" for x in floors)
            + " from run to run where one run per side cannot measure it (between_run); "
            "pooled base runs measure it, never below that"
        )
    return notes


def gate_notes(c: Comparison) -> list[str]:
    """The notes under a gate's table: the method and level, then what the comparison found."""
    kinds = {v.samples for v in c.items if v.samples}
    over = " and ".join(
        {"steps": "per-step sums", "calls": "per-call durations"}[k]
        for k in sorted(kinds, reverse=True)
    )
    notes = [
        f"{c.stat} of {over or 'the samples'}, GPU time where timed on the GPU, else host time; "
        f"intervals of {c.labels[1]}/{c.labels[0]} at {level_text(c.region_confidence)} each, "
        f"{level_text(c.confidence)} for all {c.tested} tested together (Bonferroni); slower = "
        f"the interval lies above 1 and reaches past {1 + c.max_slowdown:g}, same = within "
        f"{1 / (1 + c.max_slowdown):.3f}-{1 + c.max_slowdown:g} (docs/gate.md)"
    ]
    if "calls" in kinds:
        notes.append(
            "calls: per-call durations from the whole-run histograms (within 1%), where a run "
            "kept no steps of the region; steps: per-step sums of the steps each run kept"
        )
    if c.ignored:
        notes.append(f"{c.ignored} region(s) not gated (match / min_ms)")
    failing = []
    if c.fail_undecided and c.undecided:
        failing.append("undecided regions fail (fail_undecided)")
    if c.fail_missing and c.missing:
        failing.append("regions in one run only fail (fail_missing)")
    notes.extend(failing)
    notes.extend(speed_notes(c))
    notes.extend(c.notes)
    return notes


def render_gate(c: Comparison, *, fmt: str = "simple") -> str:
    """The gate's table: a headline, one row per region (base, new, ratio, its interval, the
    verdict), then notes on the method. ``fmt="github"`` makes a pull-request comment.

    >>> from cudatimer.records._compare import Comparison, RegionVerdict
    >>> v = RegionVerdict("fwd", "host", "same", 2.0, 2.02, 1.01, 0.99, 1.03, "steps", 50, 50)
    >>> text = render_gate(Comparison((v,), stat="p50", max_slowdown=0.05), fmt="plain")
    >>> text.splitlines()[0]
    'cudatimer: gate passed (max slowdown 5%): 1 same'
    """
    if not isinstance(c, Comparison):
        raise TypeError(f"comparison must be a cudatimer.Comparison, got {type(c).__name__}")
    fmt = _check_fmt(fmt)
    base, new = c.labels
    ranked = any(v.rank is not None for v in c.items)
    order = sorted(
        range(len(c.items)),
        key=lambda i: (_VERDICT_ORDER.get(c.items[i].verdict, 2), i),
    )
    unit = "ms/step" if c.stat == "per_step" else f"{c.stat} ms"
    normal = normalised(c)
    headers = [
        *(["rank"] if ranked else []),
        "region",
        "clock",
        f"{base} {unit}",
        f"{new} {unit}",
        f"{new}/{base}",
        *(["vs speed"] if normal else []),
        f"{level_text(c.region_confidence)} interval",
        "verdict",
        "samples",
    ]
    table = []
    for i in order:
        v = c.items[i]
        table.append(
            [
                *([str(v.rank)] if ranked else []),
                elide(v.name),
                v.clock,
                _ms(v.base_ms),
                _ms(v.new_ms),
                _ratio_text(v.raw_ratio),
                *([_ratio_text(v.ratio)] if normal else []),
                _interval_text(v),
                _verdict_text(v),
                _samples_text(v),
            ]
        )
    headline = gate_headline(c)
    if fmt == "github":
        headline = f"**{headline}**\n"
    if not table:
        text = "cudatimer: no regions to gate in either run"
    else:
        align = [
            *(["right"] if ranked else []),
            "left",
            "left",
            "right",
            "right",
            "right",
            *(["right"] if normal else []),
            "left",
            "left",
            "left",
        ]
        text = tabulate(table, headers=headers, tablefmt=fmt, disable_numparse=True, colalign=align)
    notes = gate_notes(c)
    if fmt == "github":
        return headline + "\n" + text + "\n\n" + "".join(f"- {n}\n" for n in notes).rstrip("\n")
    return headline + "\n" + text + "".join(f"\nnote: {n}" for n in notes)


# -- cross-rank table (cudatimer.distributed) -------------------------------------------------
# Imported here, not at the top, so that this addition stays an append to the module.
from ..records._ranks import RankedRegion, RankSummary  # noqa: E402

__all__ += ["render_ranks"]
_RANK_SORTS = ("total", "max", "mean", "skew", "calls", "name", "order")


def _values_mib(r: RankedRegion, name: str, stat: str) -> float | None:
    tally = r.values.get(name)
    return None if tally is None else float(tally.stat(stat)) / MIB


def _rank_flops(r: RankedRegion) -> list[str]:
    """TFLOP/s and MFU of a cross-rank row: the ranks' counts over their merged mean time."""
    hist = r.gpu if r.gpu is not None and r.gpu.count else r.cpu
    mean_ms = hist.mean if hist.count else None
    _, rate, mfu, sampled = flop_rates(r.values, r.calls, mean_ms)
    cell = "-" if rate is None else f"{rate:.3g}" + ("*" if sampled else "")
    return [cell, _pct(mfu)]


def rank_ranges(ranks: tuple[int, ...]) -> str:
    """``(0, 1, 2, 5)`` -> ``"0-2,5"``: absent ranks of a large job stay one short cell."""
    parts: list[str] = []
    i = 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        parts.append(str(ranks[i]) if i == j else f"{ranks[i]}-{ranks[j]}")
        i = j + 1
    return ",".join(parts)


def _rank_key(sort: str) -> Callable[[RankedRegion], tuple[object, ...]] | None:
    """Sort key of a RankedRegion for ``sort`` (None: first-appearance order); largest first,
    NaN last, ties in first-appearance order (the sort is stable)."""

    def high(value: float) -> float:
        return -value if not math.isnan(value) else math.inf

    keys: dict[str, Callable[[RankedRegion], tuple[object, ...]]] = {
        "total": lambda r: (high(r.total_median_ms),),
        "max": lambda r: (high(r.total_max_ms),),
        "mean": lambda r: (high(r.mean_median_ms),),
        "skew": lambda r: (high(r.skew),),
        "calls": lambda r: (-r.calls,),
        "name": lambda r: (r.name, r.clock),
    }
    return keys.get(sort)


def render_ranks(
    ranked: RankSummary, *, fmt: str = "simple", sort: str = "total", **_: object
) -> str:
    """The cross-rank table: one row per region path and clock kind ("cuda" or "host").

    ``total``/``mean`` columns are the min / median / max over ranks of each rank's total and
    mean (GPU time on cuda rows, host time on host rows), over the ranks that ran the region;
    ``slowest`` is the rank with the largest total and ``skew`` its total / the median total.
    Percentiles are those of every sample of every rank (histograms merged, within ALPHA).
    ``ranks`` says on how many ranks the region ran and lists the ranks where it did not.
    """
    if not isinstance(ranked, RankSummary):
        raise TypeError(f"ranked must be a RankSummary, got {type(ranked).__name__}")
    fmt = _check_fmt(fmt)
    if sort not in _RANK_SORTS:
        raise ValueError(f"sort must be one of {', '.join(_RANK_SORTS)}; got {sort!r}")
    n = len(ranked.ranks)
    headers = [
        "region",
        "clock",
        "ranks",
        "calls",
        "calls/rank",
        "total ms min",
        "total ms median",
        "total ms max",
        "slowest",
        "skew",
        "mean ms min",
        "mean ms median",
        "mean ms max",
        "p50 ms",
        "p90 ms",
        "p99 ms",
    ]

    def row(r: RankedRegion) -> list[object]:
        ran = [c for c in r.calls_per_rank if c]
        present = f"{len(ran)}/{n}" + (f" (not on {rank_ranges(r.absent)})" if r.absent else "")
        per_rank = (
            "-" if not ran else (str(ran[0]) if min(ran) == max(ran) else f"{min(ran)}-{max(ran)}")
        )
        return [
            elide(r.name),
            r.clock,
            present,
            r.calls,
            per_rank,
            _ms(r.total_min_ms),
            _ms(r.total_median_ms),
            _ms(r.total_max_ms),
            "-" if r.slowest_rank is None else r.slowest_rank,
            "-" if math.isnan(r.skew) else f"{r.skew:.2f}",
            _ms(r.mean_min_ms),
            _ms(r.mean_median_ms),
            _ms(r.mean_max_ms),
            _ms(r.p50_ms),
            _ms(r.p90_ms),
            _ms(r.p99_ms),
            *(
                [
                    _mib_cell(_values_mib(r, "mem_delta", "mean")),
                    _mib_cell(_values_mib(r, "mem_peak", "max")),
                ]
                if memory
                else []
            ),
            *(_rank_flops(r) if flops else []),
        ]

    # flops=True rows: every rank's counts and times merged.
    flops = any("flop" in r.values for r in ranked.regions)
    if flops:
        headers += ["TFLOP/s", "MFU"]
    # memory=True rows: every rank's calls merged (the mean a call leaves, the most one held).
    memory = any(name in r.values for r in ranked.regions for name in MEMORY_COLUMNS)
    if memory:
        headers += ["mem delta MiB", "mem peak MiB"]
    key = _rank_key(sort)
    regions = list(ranked.regions) if key is None else sorted(ranked.regions, key=key)
    if not regions:
        text = f"cudatimer: no regions recorded on any of {n} rank(s)"
    else:
        text = tabulate(
            [row(r) for r in regions], headers=headers, tablefmt=fmt, disable_numparse=True
        )
    notes = [
        f"{n} rank(s): {rank_ranges(ranked.ranks)}; totals and means are GPU time on cuda rows and "
        "host time on host rows; skew = max / median of the per-rank totals"
    ]
    for rank, s in zip(ranked.ranks, ranked.summaries, strict=True):
        if s.pending:
            notes.append(
                f"rank {rank}: {s.pending} sample(s) still running on the GPU were not included"
            )
        if s.open:
            notes.append(f"rank {rank}: {s.open} region(s) still open were not included")
    skipped = sum(r.skipped for s in ranked.summaries for r in s.regions)
    if skipped:
        notes.append(f"{skipped} call(s) had no GPU timing (entered during CUDA graph capture)")
    return text + "".join(f"\nnote: {note}" for note in notes)
