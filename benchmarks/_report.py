"""From raw rounds to statistics, the Markdown tables and the JSON file."""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict
from typing import Any

from _measure import WorkloadRun

MAIN_COLUMNS = (
    "workload",
    "timer",
    "ms/iter (median)",
    "ms/iter [min, max]",
    "slowdown vs none",
    "added us/region (median [IQR])",
    "vs floor",
    "rounds",
    "status",
)
TIMER_COLUMNS = (
    "timer",
    "what it is",
    "syncs/region",
    "event queries/region",
    "event records/region",
    "RSS growth (bytes/region)",
    "report time (ms)",
)
ACCURACY_COLUMNS = ("region", "cudatimer GPU ms", "CUPTI kernel span ms", "diff %", "note")


def _quartiles(xs: list[float]) -> tuple[float, float]:
    if len(xs) < 2:
        return (xs[0], xs[0]) if xs else (math.nan, math.nan)
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], q[2]


def _med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else math.nan


def workload_stats(run: WorkloadRun) -> dict[str, dict[str, Any]]:
    """Per timer: per-iteration time (median, min, max, IQR), slowdown and added microseconds per
    region against the unwrapped model *of the same round* (paired), and the ratio of the added
    time per region to the floor's."""
    out: dict[str, dict[str, Any]] = {}
    regions = max(1, run.regions_per_iter)
    for key in run.timers:
        times = [row[key] for row in run.rounds if key in row]
        paired = [(row[key], row["none"]) for row in run.rounds if key in row and "none" in row]
        ratios = [t / n for t, n in paired if n > 0]
        added = [(t - n) * 1e3 / regions for t, n in paired]
        q1, q3 = _quartiles(times)
        a1, a3 = _quartiles(added)
        out[key] = {
            "rounds": len(times),
            "ms_median": _med(times),
            "ms_min": min(times) if times else math.nan,
            "ms_max": max(times) if times else math.nan,
            "ms_q1": q1,
            "ms_q3": q3,
            "slowdown_median": _med(ratios),
            "added_us_per_region_median": _med(added),
            "added_us_per_region_q1": a1,
            "added_us_per_region_q3": a3,
        }
    floor = out.get("floor", {}).get("added_us_per_region_median", math.nan)
    wrap = out.get("wrap-only", {}).get("added_us_per_region_median", math.nan)
    for s in out.values():
        added = s["added_us_per_region_median"]
        # A ratio to a floor within noise of zero means nothing: only above 0.05 us per region.
        s["vs_floor"] = added / floor if floor == floor and floor > 0.05 else math.nan
        s["added_us_net_of_wrapper"] = added - wrap if wrap == wrap else math.nan
    return out


def _fmt(x: float | None, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return f"{x:.{digits}f}"


def _short(text: str, n: int = 70) -> str:
    text = " ".join(text.split()).replace("|", "/")
    return text if len(text) <= n else text[: n - 3] + "..."


def main_rows(runs: list[WorkloadRun]) -> list[list[str]]:
    rows: list[list[str]] = []
    for run in runs:
        stats = workload_stats(run)
        for key, tr in run.timers.items():
            s = stats[key]
            if tr.status != "ok" and not s["rounds"]:
                status = f"{tr.status}: {_short(tr.reason)}"
                rows.append([run.name, key, "", "", "", "", "", "0", status])
                continue
            status = "ok" if tr.status == "ok" else f"{tr.status}: {_short(tr.reason)}"
            rows.append(
                [
                    run.name,
                    key,
                    _fmt(s["ms_median"]),
                    f"[{_fmt(s['ms_min'])}, {_fmt(s['ms_max'])}]",
                    _fmt(s["slowdown_median"], 2) + "x" if key != "none" else "1.00x",
                    (
                        f"{_fmt(s['added_us_per_region_median'], 2)} "
                        f"[{_fmt(s['added_us_per_region_q1'], 2)}, "
                        f"{_fmt(s['added_us_per_region_q3'], 2)}]"
                        if key != "none"
                        else "0"
                    ),
                    _fmt(s["vs_floor"], 2) + "x" if not math.isnan(s["vs_floor"]) else "n/a",
                    str(s["rounds"]),
                    status,
                ]
            )
    return rows


def timer_rows(descriptions: dict[str, str], checks: dict[str, dict[str, Any]]) -> list[list[str]]:
    rows: list[list[str]] = []

    def entry(check: str, key: str) -> dict[str, Any]:
        c = checks.get(check, {})
        for whole in ("skipped", "error"):  # the whole check was skipped or failed
            if isinstance(c.get(whole), str):
                return {whole: c[whole]}
        e: dict[str, Any] = c.get(key, {})
        return e

    for key, desc in descriptions.items():
        s = entry("syncs", key)
        m = entry("memory", key)
        r = entry("report", key)
        rows.append(
            [
                key,
                desc,
                _per_region(s, "syncs_per_region"),
                _per_region(s, "queries_per_region"),
                _per_region(s, "records_per_region"),
                _memory_cell(m),
                _report_cell(r),
            ]
        )
    return rows


def _per_region(entry: dict[str, Any], field: str) -> str:
    if "error" in entry:
        return "error: " + _short(entry["error"], 40)
    if "skipped" in entry:
        return "skipped: " + _short(entry["skipped"], 40)
    if field not in entry:
        return "n/a"
    return _fmt(entry[field], 2)


def _memory_cell(m: dict[str, Any]) -> str:
    if "error" in m:
        return "error: " + _short(m["error"], 40)
    if "skipped" in m:
        return "skipped: " + _short(m["skipped"], 40)
    if "regions" not in m:
        return "n/a"
    capped = " (time cap)" if m["capped"] else ""
    return f"{m['bytes_per_region']:.1f} ({m['growth_mb']:.1f} MB / {m['regions']:,}{capped})"


def _report_cell(r: dict[str, Any]) -> str:
    if "error" in r:
        return "error: " + _short(r["error"], 40)
    if "skipped" in r:
        return "skipped: " + _short(r["skipped"], 40)
    if "seconds" not in r:
        return "n/a"
    if not r["has_report"]:
        return "no report"
    return f"{r['seconds'] * 1e3:.1f} ({r['samples']:,} pending)"


def accuracy_rows(acc: dict[str, Any]) -> list[list[str]]:
    rows = []
    for row in acc.get("rows", []):
        rows.append(
            [
                row["region"],
                _fmt(row["cudatimer_gpu_ms"]),
                _fmt(row["cupti_span_ms"]),
                _fmt(row["diff_pct"], 2),
                "first after an idle GPU" if row["first_after_idle"] else "back to back",
            ]
        )
    return rows


def markdown_table(columns: tuple[str, ...], rows: list[list[str]]) -> str:
    try:
        from tabulate import tabulate

        text: str = tabulate(rows, headers=list(columns), tablefmt="github", disable_numparse=True)
        return text
    except ImportError:  # same GitHub layout by hand
        lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join(lines)


def render_markdown(
    meta: dict[str, Any],
    runs: list[WorkloadRun],
    descriptions: dict[str, str],
    checks: dict[str, dict[str, Any]],
    notes: list[str],
) -> str:
    parts = [
        "# cudatimer benchmark results",
        "",
        f"Device: {meta.get('device_name', 'n/a')}; torch {meta.get('torch')}; "
        f"Python {meta.get('python')}; {'smoke run' if meta.get('smoke') else 'full run'}; "
        f"{meta.get('seconds', 0):.0f} s.",
        "",
        "## Overhead per workload",
        "",
        "Medians over interleaved rounds of the per-iteration time; slowdown and added "
        "microseconds per region are paired with the unwrapped model of the same round; "
        "'vs floor' divides a timer's added time per region by the floor's (two pre-created "
        "events re-recorded on a cached stream).",
        "",
        markdown_table(MAIN_COLUMNS, main_rows(runs)),
        "",
    ]
    for run in runs:
        parts.append(
            f"- **{run.name}**: {run.description}; {run.regions_per_iter} regions per iteration, "
            f"{run.iters} timed iterations per block, {len(run.rounds)} rounds, "
            f"{run.seconds:.0f} s."
        )
    parts += [
        "",
        "## Per timer",
        "",
        "Synchronizing CUDA runtime calls (cudaDeviceSynchronize, cudaStreamSynchronize, "
        "cudaEventSynchronize) per region in the hot path, counted under torch.profiler and "
        "diffed against the unwrapped model; resident memory growth after many regions with "
        "no report in between; time to produce a report with many samples pending.",
        "",
        markdown_table(TIMER_COLUMNS, timer_rows(descriptions, checks)),
        "",
    ]
    acc = checks.get("accuracy", {})
    if acc.get("rows"):
        parts += [
            "## Accuracy: cudatimer GPU time against the CUPTI kernel span",
            "",
            markdown_table(ACCURACY_COLUMNS, accuracy_rows(acc)),
            "",
        ]
    elif acc:
        parts += ["## Accuracy", "", f"Not measured: {acc.get('skipped') or acc.get('error')}", ""]
    if notes:
        parts += ["## Notes", ""] + [f"- {n}" for n in notes] + [""]
    return "\n".join(parts)


def _clean(obj: Any) -> Any:
    """NaN and infinities become null: strict JSON readers refuse them."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def to_json(
    meta: dict[str, Any],
    runs: list[WorkloadRun],
    descriptions: dict[str, str],
    checks: dict[str, dict[str, Any]],
    notes: list[str],
) -> dict[str, Any]:
    data: dict[str, Any] = _clean(
        {
            "schema": 1,
            "meta": meta,
            "timers": descriptions,
            "workloads": {run.name: {**asdict(run), "stats": workload_stats(run)} for run in runs},
            "checks": checks,
            "notes": notes,
            "table_columns": list(MAIN_COLUMNS),
            "table_rows": main_rows(runs),
        }
    )
    return data
