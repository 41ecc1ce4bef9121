"""The HTML report: one self-contained page (no network, no CDN) of a run, a comparison of two
runs, or a cross-rank run. Frozen records in, text out, like the other renderers.

The page holds its data as one JSON document in a ``<script type="application/json">`` block
and a small script written for it (tables, sorting, collapsing, the per-step chart drawn as
inline SVG); a Content-Security-Policy with the script's hash lets nothing else run and
nothing load from anywhere. Region names are user text: in the JSON every ``<``, ``>`` and
``&`` is escaped (so no ``</script>`` can end the block) and the script writes them with
``textContent`` only.

Size is bounded by construction: the per-step chart covers the ``top`` regions only (8 by
default) and at most ``CHART_STEPS`` points per line, and numbers keep 6 significant digits
in the tables and 4 in the chart (a 10^4-step run of 200 regions: see benchmarks/RESULTS.md).

>>> import cudatimer
>>> s = cudatimer.Summary(regions=(cudatimer.RegionStats(
...     "step", "host", 2, None, cudatimer.Histogram.of([1.0, 3.0])),))
>>> page = render_html(s)
>>> page.startswith("<!DOCTYPE html>") and '"step"' in page
True
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import math
import os
from collections.abc import Sequence
from typing import IO, Any

from ..records._compare import Comparison
from ..records._ranks import RankSummary
from ..records._records import RegionStats, Summary
from ._gate import DEFAULT_STAT, compare_sides
from ._report import (
    COMPARE_STATS,
    FLOP_COLUMNS,
    MEMORY_COLUMNS,
    TREE_LEVELS,
    analyse,
    compare_note,
    compare_unit,
    compared,
    elide,
    folded_ranks,
    gate_headline,
    gate_notes,
    has_flops,
    has_memory,
    host_bound,
    level_text,
    mem_mib,
    normalised,
    per_step_title,
    rank_ranges,
    summary_notes,
)
from ._write import to_file

__all__ = ["CHART_STEPS", "render_html", "write_html"]

#: Points per line of the per-step chart at most: a longer run is drawn as the mean of
#: consecutive steps (the chart says how many). A chart is ~1000 px wide, so 10^4 points per
#: line already draw 10 per pixel; 10^4 steps x 8 lines is ~0.5 MB of numbers.
CHART_STEPS = 10_000
#: Sync sites listed at most (they are code locations, rarely more than a few dozen).
_SYNC_ROWS = 1000
# Significant digits kept: tables show 3 decimals of ms; the chart is read by eye.
_TABLE_DIGITS, _CHART_DIGITS = 6, 4


def _num(value: float | None, digits: int = _TABLE_DIGITS) -> float | None:
    """``value`` rounded to ``digits`` significant digits; None for None, NaN and infinities
    (JSON has none of them; the page shows "-")."""
    if value is None or not math.isfinite(value):
        return None
    return float(f"{value:.{digits}g}")


def _placement(keys: Sequence[tuple[str, str]]) -> list[tuple[int, int, str]]:
    """(parent index or -1, level, label) of each (path, clock) row: under the row of the
    parent path on the same clock, else under the parent path on any clock (as the text tree
    places rows). Levels past ``TREE_LEVELS`` stop indenting and say their level."""
    index = {key: i for i, key in enumerate(keys)}
    by_name: dict[str, int] = {}
    for i, (name, _) in enumerate(keys):
        by_name.setdefault(name, i)
    parents = []
    for name, clock in keys:
        parent = -1
        if "/" in name:
            up = name.rsplit("/", 1)[0]
            parent = index.get((up, clock), by_name.get(up, -1))
        parents.append(parent)
    levels = [-1] * len(keys)
    for i in range(len(keys)):  # a loop, not recursion: runs nest thousands deep
        chain = []
        j = i
        while j >= 0 and levels[j] < 0:
            chain.append(j)
            j = parents[j]
        level = levels[j] if j >= 0 else -1
        for k in reversed(chain):
            level += 1
            levels[k] = level
    out = []
    for (name, _), parent, level in zip(keys, parents, levels, strict=True):
        label = name.rsplit("/", 1)[-1] if parent >= 0 else elide(name)
        if level > TREE_LEVELS:
            label = f"[level {level}] {label}"
        out.append((parent, min(level, TREE_LEVELS), label))
    return out


def _table(
    table_id: str,
    columns: list[tuple[str, str, str]],
    keys: Sequence[tuple[str, str]] | None,
    rows: list[tuple[str, str, list[Any]]],
    sort: tuple[str, int],
) -> dict[str, Any]:
    """A table for the page: ``columns`` are (key, title, type), ``rows`` (title, css class,
    values) with the first column's value its label; ``keys`` (path, clock) nest the rows
    into a tree, None keeps them flat. ``sort``: the first sort (column key, 1 up / -1 down)."""
    placed = _placement(keys) if keys is not None else [(-1, 0, None)] * len(rows)
    body = []
    for (parent, level, label), (title, cls, values) in zip(placed, rows, strict=True):
        body.append([parent, level, title, cls, label if label is not None else values[0]])
        body[-1] += values[1:]
    keys_only = [c[0] for c in columns]
    return {
        "id": table_id,
        "columns": [list(c) for c in columns],
        "rows": body,
        "sort": [keys_only.index(sort[0]), sort[1]],
    }


def _regions(summary: Summary) -> dict[str, Any]:
    rows = analyse(summary.regions)
    gpu = any(r.gpu_total_ms is not None for r in summary.regions)
    syncs = any(r.syncs for r in summary.regions)
    steps = summary.steps
    ranks = folded_ranks(summary)  # the cross-rank page's tree: per_step is per rank
    columns = [("region", "region", "text"), ("clock", "clock", "text"), ("calls", "calls", "int")]
    for key in ("total", "self", "mean", "p99"):  # GPU and CPU side by side
        if gpu:
            columns.append((f"gpu_{key}", f"GPU {key} ms", "ms"))
        columns.append((f"cpu_{key}", f"CPU {key} ms", "ms"))
    columns += [("pct_parent", "% parent", "pct"), ("pct_total", "% total", "pct")]
    if steps:
        columns.append(("per_step", per_step_title(ranks), "ms"))
    if gpu:
        columns.append(("cpu_gpu", "CPU/GPU", "x2"))
    if syncs:
        columns.append(("syncs", "syncs", "int"))
    memory = has_memory(summary)
    if memory:  # MiB with 2 decimals (the page's "x2" numbers)
        columns += [("mem_delta", "mem delta MiB", "x2"), ("mem_peak", "mem peak MiB", "x2")]
    flops = has_flops(summary)
    if flops:  # flops=True: achieved TFLOP/s (3 digits) and MFU with a bar per row
        columns += [("tflop_per_s", "TFLOP/s", "g3"), ("mfu", "MFU", "mfu")]
    body = []
    for row in rows:
        r = row.r
        values: dict[str, Any] = {
            "region": r.name,
            "clock": r.clock,
            "calls": r.calls,
            "gpu_total": _num(r.gpu_total_ms),
            "cpu_total": _num(r.cpu_total_ms),
            "gpu_self": _num(row.gpu_self),
            "cpu_self": _num(row.cpu_self),
            "gpu_mean": _num(r.gpu_mean_ms),
            "cpu_mean": _num(r.cpu_mean_ms),
            "gpu_p99": _num(r.gpu_p99_ms),
            "cpu_p99": _num(r.cpu_p99_ms),
            "pct_parent": _num(row.of_parent),
            "pct_total": _num(row.share),
            "per_step": _num(row.time_ms / steps / ranks) if steps else None,
            "cpu_gpu": _num(r.cpu_total_ms / r.gpu_total_ms)
            if r.gpu_total_ms is not None and r.gpu_total_ms > 0
            else None,
            "syncs": r.syncs,
        }
        if memory:
            values["mem_delta"] = _num(mem_mib(r, "mem_delta", "mean"))
            values["mem_peak"] = _num(mem_mib(r, "mem_peak", "max"))
        if flops:
            values["tflop_per_s"] = _num(r.tflop_per_s)
            values["mfu"] = _num(r.mfu)
        cls = "bound" if host_bound(r) else ""
        body.append((r.name, cls, [values[c[0]] for c in columns]))
    keys = [(r.name, r.clock) for r in summary.regions]
    return _table("regions", columns, keys, body, ("gpu_total" if gpu else "cpu_total", -1))


def _chart(summary: Summary, top: int) -> dict[str, Any] | None:
    """The per-step time of the ``top`` regions by total (GPU time where timed on the GPU,
    else host time), or None with fewer than 2 steps."""
    if not summary.step_stats:
        return None
    chosen: list[RegionStats] = sorted(summary.regions, key=lambda r: -r.total_ms)[:top]
    wanted = {(r.name, r.clock): i for i, r in enumerate(chosen)}
    names = {r.name for r in chosen}
    points: list[dict[int, float]] = [{} for _ in chosen]
    for s in summary.step_stats:  # one pass: a 10^4-step run of 200 regions has 2e6 rows
        if s.name in names:
            i = wanted.get((s.name, s.clock))
            if i is not None:
                points[i][s.step] = s.gpu_ms if s.gpu_ms is not None else s.cpu_ms
    # A top region without per-step rows (it ran before the window only) draws no line.
    drawn = [(r, got) for r, got in zip(chosen, points, strict=True) if got]
    steps = sorted(set().union(*(got for _, got in drawn)))
    if len(steps) < 2:
        return None
    stride = -(-len(steps) // CHART_STEPS)  # ceil
    groups = [steps[k : k + stride] for k in range(0, len(steps), stride)]
    series = []
    for r, got in drawn:
        values = []
        for group in groups:
            have = [got[s] for s in group if s in got]
            values.append(_num(sum(have) / len(have), _CHART_DIGITS) if have else None)
        series.append({"name": r.name, "clock": r.clock, "values": values})
    kinds = {r.clock == "host" for r, _ in drawn}
    unit = "ms per step" if len(kinds) > 1 else ("host" if True in kinds else "GPU") + " ms"
    note = (
        f"each point is the mean of {stride} consecutive steps ({len(steps)} steps)"
        if stride > 1
        else ""
    )
    if len(kinds) > 1:
        note = "; ".join(filter(None, [note, "GPU time where timed on the GPU, else host time"]))
    return {"unit": unit, "steps": [g[0] for g in groups], "series": series, "note": note}


def _syncs(summary: Summary) -> dict[str, Any] | None:
    sites = sorted(summary.sync_sites, key=lambda s: (-s.count, s.location, s.kind, s.region))
    if not sites:
        return None
    columns = [
        ("location", "location", "text"),
        ("kind", "kind", "text"),
        ("count", "count", "int"),
        ("region", "region", "text"),
    ]
    rows = [
        (s.region, "", [s.location, s.kind, s.count, elide(s.region)]) for s in sites[:_SYNC_ROWS]
    ]
    table = _table("syncs", columns, None, rows, ("count", -1))
    table["more"] = max(0, len(sites) - _SYNC_ROWS)
    return table


def _meta(summary: Summary) -> list[list[str]]:
    meta = dict(summary.meta)
    shown = [[k, v] for k, v in summary.meta if not k.endswith("_note") and k != "window"]
    if summary.steps:
        window = meta.get("window", "")
        shown.append(["steps", f"{summary.steps}" + (f" ({window})" if window else "")])
    clocks = ", ".join(dict.fromkeys(r.clock for r in summary.regions))
    if clocks:
        shown.append(["clocks", clocks])
    return shown


def _run(summary: Summary, top: int, label: str) -> dict[str, Any]:
    rows = analyse(summary.regions)
    shown = ["gpu_self", "cpu_self", "bound", *(["per_step"] if summary.steps else [])]
    notes = summary_notes(summary, rows, [(row, "") for row in rows], shown)
    return {
        "label": label,
        "meta": _meta(summary),
        "notes": notes,
        "regions": _regions(summary) if summary.regions else None,
        "chart": _chart(summary, top),
        "syncs": _syncs(summary),
    }


def _compare(
    base: Summary, new: Summary, stat: str, tolerance: float, labels: tuple[str, str]
) -> dict[str, Any]:
    rows = compared(base, new, stat=stat, tolerance=tolerance, labels=labels)
    unit = compare_unit(stat)
    kind = "x2" if stat in MEMORY_COLUMNS else "ms"  # MiB with 2 decimals, or ms
    if stat in FLOP_COLUMNS:  # achieved TFLOP/s (3 digits), MFU (a %)
        kind = "pct" if stat == "mfu" else "g3"
    columns = [
        ("region", "region", "text"),
        ("clock", "clock", "text"),
        ("base", f"{labels[0]} {unit}", kind),
        ("new", f"{labels[1]} {unit}", kind),
        ("ratio", f"{labels[1]}/{labels[0]}", "x3"),
        ("change", "change", "text"),
    ]
    body = []
    for c in rows:
        if c.ratio is None or c.change == "same":
            cls = ""
        else:
            cls = "faster" if c.ratio < 1.0 else "slower"
        values = [c.name, c.clock, _num(c.base_ms), _num(c.new_ms), _num(c.ratio), c.change]
        body.append((c.name, cls, values))
    keys = [(c.name, c.clock) for c in rows]
    table = _table("compare", columns, keys, body, ("base", -1))
    table["note"] = compare_note(stat, tolerance)
    return table


def _gate(c: Comparison) -> dict[str, Any]:
    """The comparison table of the gate (``max_slowdown``): the verdicts of ``compare``."""
    base, new = c.labels
    unit = "ms/step" if c.stat == "per_step" else f"{c.stat} ms"
    normal = normalised(c)
    columns = [
        ("region", "region", "text"),
        ("clock", "clock", "text"),
        ("base", f"{base} {unit}", "ms"),
        ("new", f"{new} {unit}", "ms"),
        ("ratio", f"{new}/{base}", "x3"),
        *([("normal", "vs speed", "x3")] if normal else []),
        ("interval", f"{level_text(c.region_confidence)} interval", "text"),
        ("verdict", "verdict", "text"),
    ]
    css = {"slower": "slower", "faster": "faster", "same": ""}
    body = []
    for v in c.items:
        interval = "-"
        if v.low is not None and v.high is not None:
            interval = f"{v.low:.3f}-" + ("inf" if math.isinf(v.high) else f"{v.high:.3f}")
        verdict = f"{v.verdict} ({v.reason})" if v.reason else v.verdict
        values = [
            v.name,
            v.clock,
            _num(v.base_ms),
            _num(v.new_ms),
            _num(v.raw_ratio),
            *([_num(v.ratio)] if normal else []),
            interval,
            verdict,
        ]
        body.append((v.name, css.get(v.verdict, "absent"), values))
    keys = [(v.name, v.clock) for v in c.items]
    table = _table("compare", columns, keys, body, ("base", -1))
    table["note"] = gate_headline(c)
    table["notes"] = [gate_headline(c), *gate_notes(c)]
    return table


def _ranks(ranked: RankSummary) -> dict[str, Any]:
    n = len(ranked.ranks)
    columns = [
        ("region", "region", "text"),
        ("clock", "clock", "text"),
        ("ranks", "ranks", "text"),
        ("calls", "calls", "int"),
        ("calls_rank", "calls/rank", "text"),
        ("total_min", "total ms min", "ms"),
        ("total_median", "total ms median", "ms"),
        ("total_max", "total ms max", "ms"),
        ("slowest", "slowest rank", "int"),
        ("skew", "skew", "x2"),
        ("mean_min", "mean ms min", "ms"),
        ("mean_median", "mean ms median", "ms"),
        ("mean_max", "mean ms max", "ms"),
        ("p50", "p50 ms", "ms"),
        ("p90", "p90 ms", "ms"),
        ("p99", "p99 ms", "ms"),
    ]
    body = []
    for r in ranked.regions:
        ran = [c for c in r.calls_per_rank if c]
        present = f"{len(ran)}/{n}" + (f" (not on {rank_ranges(r.absent)})" if r.absent else "")
        per_rank = (
            "-" if not ran else f"{min(ran)}" + (f"-{max(ran)}" if min(ran) != max(ran) else "")
        )
        values = [
            r.name,
            r.clock,
            present,
            r.calls,
            per_rank,
            _num(r.total_min_ms),
            _num(r.total_median_ms),
            _num(r.total_max_ms),
            r.slowest_rank,
            _num(r.skew),
            _num(r.mean_min_ms),
            _num(r.mean_median_ms),
            _num(r.mean_max_ms),
            _num(r.p50_ms),
            _num(r.p90_ms),
            _num(r.p99_ms),
        ]
        body.append((r.name, "absent" if r.absent else "", values))
    keys = [(r.name, r.clock) for r in ranked.regions]
    table = _table("ranks", columns, keys, body, ("total_median", -1))
    table["note"] = (
        f"{n} rank(s): {rank_ranges(ranked.ranks)}; totals and means are GPU time on cuda rows and "
        "host time on host rows; skew = max / median of the per-rank totals"
    )
    return table


def _check(top: object, title: object, labels: object) -> None:
    if isinstance(top, bool) or not isinstance(top, int):
        raise TypeError(
            f"top must be an int (regions in the per-step chart), got {type(top).__name__}"
        )
    if top < 1:
        raise ValueError(f"top must be >= 1 (regions in the per-step chart), got {top}")
    if title is not None and not isinstance(title, str):
        raise TypeError(f"title must be a str or None, got {type(title).__name__}")
    if (
        not isinstance(labels, tuple)
        or len(labels) != 2
        or not all(isinstance(x, str) and x for x in labels)
    ):
        raise TypeError(f"labels must be a tuple of two non-empty str, got {labels!r}")


def render_html(
    run: Summary | RankSummary,
    *,
    base: Summary | None = None,
    top: int = 8,
    title: str | None = None,
    stat: str | None = None,
    tolerance: float = 0.02,
    labels: tuple[str, str] = ("base", "new"),
    max_slowdown: float | None = None,
    confidence: float = 0.95,
    allow_other_device: bool = False,
    absolute: bool = False,
) -> str:
    """The HTML page of ``run``: its region tree (GPU and CPU time side by side, sortable and
    collapsible), the per-step time of its ``top`` regions, its sync sites; with ``base``, a
    comparison of the two first (``run`` is the new run: as ``cudatimer compare BASE NEW``,
    by ``stat`` with ``tolerance``); for a ``RankSummary``, the cross-rank table and the tree
    of all ranks folded together (``RankSummary.merged()``). With ``max_slowdown`` the
    comparison is the gate's (``cudatimer.compare``): each region's interval and verdict, by
    ``stat`` (default p50) at ``confidence``, ratios divided by the run-wide speed factor
    unless ``absolute``.

    Opening the page needs no network. ``render_html`` only reads its records.
    """
    if isinstance(run, RankSummary):
        if base is not None:
            raise ValueError(
                "base: a cross-rank run is not compared; fold it into one Summary first "
                "(RankSummary.merged(), or `python -m cudatimer.distributed merge --flat`)"
            )
    elif not isinstance(run, Summary):
        raise TypeError(
            f"run must be a cudatimer.Summary or a cudatimer.distributed.RankSummary, got "
            f"{type(run).__name__}"
        )
    if base is not None and not isinstance(base, Summary):
        raise TypeError(f"base must be a cudatimer.Summary or None, got {type(base).__name__}")
    gate = None
    if max_slowdown is not None:
        if base is None or not isinstance(run, Summary):
            raise ValueError("max_slowdown gates a comparison: give base= (a Summary) too")
        gate = compare_sides(
            {None: [base]},
            {None: [run]},
            max_slowdown=max_slowdown,
            stat=DEFAULT_STAT if stat is None else stat,
            confidence=confidence,
            allow_other_device=allow_other_device,
            labels=labels,
            absolute=absolute,
        )
    elif stat is not None and stat not in COMPARE_STATS:
        raise ValueError(f"stat must be one of {', '.join(COMPARE_STATS)}; got {stat!r}")
    _check(top, title, labels)
    doc: dict[str, Any] = {"compare": None, "ranks": None}
    if isinstance(run, RankSummary):
        doc["ranks"] = _ranks(run)
        folded = run.merged()
        runs = [_run(folded, top, f"all {len(run.ranks)} rank(s) folded together")]
        default = f"cudatimer: {len(run.ranks)} rank(s)"
    elif base is not None:
        doc["compare"] = (
            _gate(gate)
            if gate is not None
            else _compare(base, run, stat or "mean", tolerance, labels)
        )
        runs = [_run(run, top, labels[1]), _run(base, top, labels[0])]
        default = f"cudatimer: {labels[1]} against {labels[0]}"
    else:
        runs = [_run(run, top, "")]
        timer = dict(run.meta).get("timer")
        default = "cudatimer report" + (f": timer {timer!r}" if timer else "")
    doc["runs"] = runs
    heading = default if title is None else title
    return _page(heading, doc)


def _version() -> str:
    from .._version import __version__

    return __version__


def _page(heading: str, doc: dict[str, Any]) -> str:
    data = json.dumps(doc, ensure_ascii=True, allow_nan=False, separators=(",", ":"))
    # Inside <script> only "</script" (or "<!--") could end the block early: with every "<"
    # written as \u003c no user text can; ">" and "&" too, for readers that look for them.
    data = data.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    digest = base64.b64encode(hashlib.sha256(_SCRIPT.encode("ascii")).digest()).decode("ascii")
    policy = f"default-src 'none'; style-src 'unsafe-inline'; script-src 'sha256-{digest}'"
    text = html.escape(heading)
    return (
        (
            "<!DOCTYPE html>\n"
            '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            f'<meta http-equiv="Content-Security-Policy" content="{policy}">\n'
            '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f"<title>{text}</title>\n<style>{_STYLE}</style>\n</head>\n<body>\n"
            f"<header><h1>{text}</h1></header>\n"
            '<main id="app"><noscript>This report draws its tables with JavaScript; '
            "turn it on to read them.</noscript></main>\n"
            f"<footer>cudatimer {html.escape(_version())}</footer>\n"
            f'<script type="application/json" id="cudatimer-data">{data}</script>\n'
            f"<script>{_SCRIPT}</script>\n</body>\n</html>\n"
        )
        .encode("ascii", "xmlcharrefreplace")
        .decode("ascii")
    )


def write_html(
    run: Summary | RankSummary, path: str | os.PathLike[str] | IO[str], **options: Any
) -> None:
    """Write ``render_html(run, **options)`` to a path (atomically: a failure leaves no partial
    file) or a text stream."""
    target = to_file(path)
    target.write(render_html(run, **options))


_STYLE = """
:root{--gpu:#4363d8;--cpu:#f58231;--bar:#dfe6fb;--mfu:#c8ecd0;--line:#d8dbe2;--muted:#5b6270}
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0 1.5em 2em;color:#1d2330}
h1{font-size:1.4em;margin:.8em 0 .2em}h2{font-size:1.15em;margin:1.4em 0 .4em}
h3{font-size:1em;margin:1em 0 .3em}
dl.meta{display:flex;flex-wrap:wrap;gap:.2em 1.4em;margin:.3em 0;color:var(--muted)}
dl.meta dt{font-weight:600}dl.meta dt::after{content:":"}dl.meta dd{margin:0 0 0 .3em}
dl.meta div{display:flex}
ul.notes{color:var(--muted);margin:.3em 0;padding-left:1.2em}
.tools{display:flex;gap:.5em;align-items:center;margin:.4em 0}
.tools input{font:inherit;padding:.15em .4em;min-width:16em}
button{font:inherit;cursor:pointer}
.tablewrap{overflow-x:auto;max-width:100%}
table.grid{border-collapse:collapse;font-size:13px;font-variant-numeric:tabular-nums;white-space:nowrap}
table.grid th{position:sticky;top:0;background:#f3f4f7;cursor:pointer;user-select:none;
padding:.3em .5em;border-bottom:2px solid var(--line);text-align:right;white-space:normal;
vertical-align:bottom}
table.grid th.text,table.grid td.text{text-align:left}
table.grid th[aria-sort=ascending]::after{content:" \\25b2"}
table.grid th[aria-sort=descending]::after{content:" \\25bc"}
table.grid th.gpu{color:var(--gpu)}table.grid th.cpu{color:var(--cpu)}
table.grid td{padding:.2em .5em;border-bottom:1px solid #eceef2;text-align:right}
table.grid tr:hover td{background:#f7f8fb}
table.grid tr.bound td:first-child .name::after{content:" host-bound";color:#b03a2e;
font-size:.8em}
table.grid tr.faster td{color:#1e7b34}table.grid tr.slower td{color:#b03a2e}
table.grid tr.absent td{color:var(--muted)}
button.toggle{border:0;background:none;padding:0 .3em 0 0;width:1.3em;color:var(--muted)}
span.pad{display:inline-block;width:1.3em}
.chart{width:100%;max-width:1000px;height:auto;display:block}
.chart text{font-size:11px;fill:var(--muted)}.chart .grid{stroke:#eceef2}
.chart .axis{stroke:#9aa0ab}.chart path.series{fill:none;stroke-width:1.4}
.chart .cursor{stroke:#9aa0ab;stroke-dasharray:3 3}
.legend{display:flex;flex-wrap:wrap;gap:.3em .8em;margin:.3em 0}
.legend button{border:1px solid var(--line);background:#fff;border-radius:3px;padding:.1em .5em}
.legend button[aria-pressed=false]{opacity:.4}
.legend i{display:inline-block;width:.9em;height:.9em;margin-right:.35em;vertical-align:-.1em}
.tip{min-height:1.4em;color:var(--muted);font-size:.9em}
footer{margin-top:2em;color:var(--muted);font-size:.85em}
"""

# The page's script. Plain ES2017, written for this page (no library). Data comes from the
# JSON block; user text goes into the page through textContent and attributes only.
_SCRIPT = r"""
"use strict";
(function () {
  const doc = JSON.parse(document.getElementById("cudatimer-data").textContent);
  const app = document.getElementById("app");
  const NS = "http://www.w3.org/2000/svg";
  const COLORS = ["#4363d8", "#f58231", "#3cb44b", "#e6194b", "#911eb4", "#42d4f4",
    "#f032e6", "#9a6324", "#469990", "#808000", "#000075", "#a9a9a9"];

  function el(tag, attrs, text) {
    const node = document.createElement(tag);
    for (const k in attrs || {}) node.setAttribute(k, attrs[k]);
    if (text !== undefined) node.textContent = text;
    return node;
  }
  function svg(tag, attrs, text) {
    const node = document.createElementNS(NS, tag);
    for (const k in attrs || {}) node.setAttribute(k, attrs[k]);
    if (text !== undefined) node.textContent = text;
    return node;
  }
  function fmt(type, v) {
    if (v === null || v === undefined) return "-";
    if (type === "ms") return v.toFixed(3);
    if (type === "pct" || type === "mfu") return (100 * v).toFixed(1) + "%";
    if (type === "g3") return v.toPrecision(3);
    if (type === "x2") return v.toFixed(2);
    if (type === "x3") return v.toFixed(3);
    return String(v);
  }

  // A table whose rows may nest: rows are [parent, level, title, class, ...values].
  function table(spec, run) {
    const cols = spec.columns, rows = spec.rows, n = rows.length, V = 4;
    const kids = rows.map(() => []), roots = [];
    rows.forEach((r, i) => (r[0] < 0 ? roots : kids[r[0]]).push(i));
    const nested = kids.some((k) => k.length > 0);
    const collapsed = new Uint8Array(n);
    let keep = null;  // rows the filter keeps (null: all)
    let sortCol = spec.sort[0], sortDir = spec.sort[1], shown = [];
    const box = el("div", {class: "tablebox"});
    const tools = el("div", {class: "tools"});
    const filter = el("input", {type: "search", placeholder: "filter by path",
      "aria-label": "filter by path"});
    tools.append(filter);
    if (nested) {
      const all = el("button", {type: "button", "data-action": "expand"}, "expand all");
      const none = el("button", {type: "button", "data-action": "collapse"}, "collapse all");
      all.addEventListener("click", () => { collapsed.fill(0); syncToggles(); render(); });
      none.addEventListener("click", () => {
        kids.forEach((k, i) => { collapsed[i] = k.length ? 1 : 0; });
        syncToggles(); render();
      });
      tools.append(all, none);
    }
    const wrap = el("div", {class: "tablewrap"});
    const t = el("table", {class: "grid", "data-table": spec.id, "data-run": String(run)});
    const head = el("tr");
    const ths = cols.map((c, j) => {
      const side = c[0].startsWith("gpu_") ? " gpu" : c[0].startsWith("cpu_") ? " cpu" : "";
      const th = el("th", {class: (c[2] === "text" ? "text" : "num") + side, "data-key": c[0],
        scope: "col", tabindex: "0", title: "sort by " + c[1]}, c[1]);
      const sort = () => {
        if (sortCol === j) sortDir = -sortDir;
        else { sortCol = j; sortDir = c[2] === "text" ? 1 : -1; }
        render();
      };
      th.addEventListener("click", sort);
      th.addEventListener("keydown", (e) => {
        if (e.key === "Enter" || e.key === " ") { e.preventDefault(); sort(); }
      });
      head.append(th);
      return th;
    });
    const thead = el("thead"), tbody = el("tbody");
    thead.append(head);
    const toggles = [];
    const trs = rows.map((r, i) => {
      const tr = el("tr", {"data-row": String(i)});
      if (r[3]) tr.className = r[3];
      cols.forEach((c, j) => {
        const v = r[V + j];
        const td = el("td", {class: c[2] === "text" ? "text" : "num"});
        if (j === 0) {
          if (nested) td.style.paddingLeft = (0.4 + 1.2 * r[1]) + "em";
          if (kids[i].length) {
            const b = el("button", {type: "button", class: "toggle", "aria-expanded": "true",
              title: "collapse / expand"}, "\u25be");
            b.addEventListener("click", (e) => {
              e.stopPropagation();
              collapsed[i] ^= 1;
              syncToggles(); render();
            });
            toggles[i] = b;
            td.append(b);
          } else if (nested) td.append(el("span", {class: "pad"}));
          td.append(el("span", {class: "name", title: r[2]}, v));
        } else {
          td.textContent = fmt(c[2], v);
          if ((c[2] === "pct" || c[2] === "mfu") && v !== null) {
            const w = Math.max(0, Math.min(100, 100 * v)).toFixed(1);
            const bar = c[2] === "mfu" ? "var(--mfu)" : "var(--bar)";
            if (c[2] === "mfu") td.className = "mfu-bar";
            td.style.background =
              "linear-gradient(90deg," + bar + " " + w + "%,transparent " + w + "%)";
          }
        }
        tr.append(td);
      });
      return tr;
    });
    function syncToggles() {
      toggles.forEach((b, i) => {
        if (!b) return;
        b.textContent = collapsed[i] ? "\u25b8" : "\u25be";
        b.setAttribute("aria-expanded", collapsed[i] ? "false" : "true");
      });
    }
    function cmp(a, b) {
      const x = rows[a][V + sortCol], y = rows[b][V + sortCol];
      if (x === y) return a - b;
      if (x === null) return 1;  // missing values last, whichever the direction
      if (y === null) return -1;
      const d = typeof x === "string" ? (x < y ? -1 : 1) : x - y;
      return d * sortDir || a - b;
    }
    function order() {  // parents first, siblings sorted; a loop: trees nest thousands deep
      const out = [], stack = roots.slice().sort(cmp).reverse();
      while (stack.length) {
        const i = stack.pop();
        out.push(i);
        const k = kids[i].slice().sort(cmp);
        for (let j = k.length - 1; j >= 0; j--) stack.push(k[j]);
      }
      return out;
    }
    function render() {
      shown = order();
      const hidden = new Uint8Array(n), frag = document.createDocumentFragment();
      for (const i of shown) {
        const p = rows[i][0];
        hidden[i] = (p >= 0 && (hidden[p] || collapsed[p])) || (keep && !keep[i]) ? 1 : 0;
        trs[i].hidden = hidden[i] === 1;
        frag.append(trs[i]);
      }
      tbody.append(frag);
      ths.forEach((th, j) => {
        if (j === sortCol) th.setAttribute("aria-sort", sortDir > 0 ? "ascending" : "descending");
        else th.removeAttribute("aria-sort");
      });
    }
    filter.addEventListener("input", () => {
      const text = filter.value.trim().toLowerCase();
      if (!text) { keep = null; render(); return; }
      keep = new Uint8Array(n);
      rows.forEach((r, i) => {
        if (r[2].toLowerCase().indexOf(text) < 0) return;
        for (let j = i; j >= 0 && !keep[j]; j = rows[j][0]) keep[j] = 1;  // and its ancestors
      });
      render();
    });
    t.append(thead, tbody);
    wrap.append(t);
    box.append(tools, wrap);
    render();
    return box;
  }

  // Round tick values from lo on, about count of them; cover: the last one is >= hi (an axis
  // that must hold the data), else the last one is <= hi (labels inside the axis).
  function ticks(lo, hi, count, cover) {
    const span = hi - lo || 1, raw = span / count;
    const mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw) || 10 * mag;
    const out = [];
    for (let k = Math.ceil(lo / step - 1e-9); ; k++) {
      const v = +(k * step).toPrecision(12);
      if (!cover && v > hi + step * 1e-9) break;
      out.push(v);
      if (cover && v >= hi - step * 1e-9) break;
    }
    return {values: out, step: step};
  }

  function chart(spec) {
    const W = 960, H = 300, L = 64, R = 14, T = 10, B = 34;
    const xs = spec.steps, on = spec.series.map(() => true);
    const box = el("div", {class: "chartbox"});
    const legend = el("div", {class: "legend"});
    const plot = svg("svg", {viewBox: "0 0 " + W + " " + H, class: "chart", role: "img",
      "aria-label": "time per step of the top regions"});
    const tip = el("div", {class: "tip"});
    const x0 = xs[0], x1 = xs[xs.length - 1];
    const X = (s) => L + (W - L - R) * (s - x0) / (x1 - x0 || 1);
    let Y = (v) => v;
    function draw() {
      plot.replaceChildren();
      let top = 0;
      spec.series.forEach((s, i) => {
        if (on[i]) for (const v of s.values) if (v !== null && v > top) top = v;
      });
      const yt = ticks(0, top > 0 ? top : 1, 5, true);
      const ymax = yt.values[yt.values.length - 1] || 1;
      Y = (v) => T + (H - T - B) * (1 - v / ymax);
      for (const v of yt.values) {
        plot.append(svg("line", {class: "grid", x1: L, x2: W - R, y1: Y(v), y2: Y(v)}));
        plot.append(svg("text", {x: L - 6, y: Y(v) + 4, "text-anchor": "end"}, String(v)));
      }
      const xt = ticks(x0, x1, 8, false);
      for (const s of xt.values) {
        if (xt.step < 1 && s !== Math.round(s)) continue;
        plot.append(svg("text", {x: X(s), y: H - B + 16, "text-anchor": "middle"}, String(s)));
      }
      plot.append(svg("line", {class: "axis", x1: L, x2: W - R, y1: H - B, y2: H - B}));
      plot.append(svg("line", {class: "axis", x1: L, x2: L, y1: T, y2: H - B}));
      plot.append(svg("text", {x: (L + W - R) / 2, y: H - 4, "text-anchor": "middle"}, "step"));
      plot.append(svg("text", {x: 12, y: T + (H - T - B) / 2, "text-anchor": "middle",
        transform: "rotate(-90 12 " + (T + (H - T - B) / 2) + ")"}, spec.unit));
      spec.series.forEach((s, i) => {
        if (!on[i]) return;
        const parts = [];
        let pen = false;
        s.values.forEach((v, k) => {
          if (v === null) { pen = false; return; }
          parts.push((pen ? "L" : "M") + X(xs[k]).toFixed(1) + " " + Y(v).toFixed(1));
          pen = true;
        });
        plot.append(svg("path", {class: "series", d: parts.join(""),
          stroke: COLORS[i % COLORS.length], "data-name": s.name}));
      });
      cursor = svg("line", {class: "cursor", y1: T, y2: H - B, x1: -10, x2: -10});
      plot.append(cursor);
    }
    let cursor = null;
    spec.series.forEach((s, i) => {
      const b = el("button", {type: "button", "aria-pressed": "true",
        title: s.name + " (" + s.clock + ")"});
      const swatch = el("i");
      swatch.style.background = COLORS[i % COLORS.length];
      b.append(swatch, document.createTextNode(s.name));
      b.addEventListener("click", () => {
        on[i] = !on[i];
        b.setAttribute("aria-pressed", on[i] ? "true" : "false");
        draw();
      });
      legend.append(b);
    });
    plot.addEventListener("mousemove", (e) => {
      const rect = plot.getBoundingClientRect();
      const sx = (e.clientX - rect.left) * W / rect.width;
      const want = x0 + (sx - L) * (x1 - x0) / (W - L - R);
      let lo = 0, hi = xs.length - 1;
      while (lo < hi) {
        const mid = (lo + hi) >> 1;
        if (xs[mid] < want) lo = mid + 1;
        else hi = mid;
      }
      if (lo > 0 && want - xs[lo - 1] < xs[lo] - want) lo -= 1;
      cursor.setAttribute("x1", X(xs[lo]));
      cursor.setAttribute("x2", X(xs[lo]));
      const parts = spec.series.filter((s, i) => on[i] && s.values[lo] !== null)
        .map((s) => s.name + " " + s.values[lo].toFixed(3));
      tip.textContent = "step " + xs[lo] + ": " + (parts.join(", ") || "-") + " ms";
    });
    draw();
    box.append(legend, plot, tip);
    if (spec.note) box.append(el("p", {class: "tip"}, "note: " + spec.note));
    return box;
  }

  function section(title, id) {
    const s = el("section", {id: id});
    s.append(el("h2", {}, title));
    app.append(s);
    return s;
  }
  function notes(where, list) {
    if (!list.length) return;
    const ul = el("ul", {class: "notes"});
    for (const text of list) ul.append(el("li", {}, text));
    where.append(ul);
  }

  if (doc.compare) {
    const s = section("Comparison", "compare");
    s.append(table(doc.compare, -1));
    notes(s, doc.compare.notes || [doc.compare.note]);
  }
  if (doc.ranks) {
    const s = section("Across ranks", "ranks");
    s.append(table(doc.ranks, -1));
    notes(s, [doc.ranks.note]);
  }
  doc.runs.forEach((run, k) => {
    const s = section(run.label ? "Regions: " + run.label : "Regions", "run" + k);
    const dl = el("dl", {class: "meta"});
    for (const [key, value] of run.meta) {
      const item = el("div");
      item.append(el("dt", {}, key), el("dd", {}, value));
      dl.append(item);
    }
    s.append(dl);
    notes(s, run.notes);
    if (run.regions) s.append(table(run.regions, k));
    else s.append(el("p", {class: "empty"}, "no regions recorded"));
    if (run.chart) {
      s.append(el("h3", {}, "Time per step" + (run.label ? ": " + run.label : "")));
      s.append(chart(run.chart));
    }
    if (run.syncs) {
      s.append(el("h3", {}, "Hidden syncs: where the host waited for the GPU"));
      s.append(table(run.syncs, k));
      if (run.syncs.more) notes(s, [run.syncs.more + " more site(s) not listed"]);
    }
  });
  document.documentElement.setAttribute("data-ready", "1");
})();
"""
