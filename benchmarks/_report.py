"""From raw rounds to statistics, the Markdown tables and the JSON file."""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict
from typing import Any

from _measure import SeparateProcess, WorkloadRun

MAIN_COLUMNS = (
    "workload",
    "timer",
    "ms/iter (median)",
    "ms/iter [min, max]",
    "slowdown vs none (median [IQR])",
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
RESOLUTION_COLUMNS = (
    "timer",
    "loop ms (median)",
    "summary() ms (median)",
    "added us/region in loop (median [IQR])",
    "added us/region incl. resolution (median [IQR])",
    "in-loop figure, main table",
)
#: The status of rows measured in a timer's own process.
SEPARATE_STATUS = "ok: separate process, vs its own none/floor"


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
        r1, r3 = _quartiles(ratios)
        out[key] = {
            "rounds": len(times),
            "ms_median": _med(times),
            "ms_min": min(times) if times else math.nan,
            "ms_max": max(times) if times else math.nan,
            "ms_q1": q1,
            "ms_q3": q3,
            "slowdown_median": _med(ratios),
            "slowdown_q1": r1,
            "slowdown_q3": r3,
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


def _row(workload: str, label: str, key: str, s: dict[str, Any], status: str) -> list[str]:
    base = key == "none"
    return [
        workload,
        label,
        _fmt(s["ms_median"]),
        f"[{_fmt(s['ms_min'])}, {_fmt(s['ms_max'])}]",
        (
            "1.00x"
            if base
            else f"{_fmt(s['slowdown_median'], 2)}x "
            f"[{_fmt(s['slowdown_q1'], 2)}, {_fmt(s['slowdown_q3'], 2)}]"
        ),
        (
            "0"
            if base
            else f"{_fmt(s['added_us_per_region_median'], 2)} "
            f"[{_fmt(s['added_us_per_region_q1'], 2)}, "
            f"{_fmt(s['added_us_per_region_q3'], 2)}]"
        ),
        _fmt(s["vs_floor"], 2) + "x" if not math.isnan(s["vs_floor"]) else "n/a",
        str(s["rounds"]),
        status,
    ]


def _run_rows(run: WorkloadRun, separate: SeparateProcess | None = None) -> list[list[str]]:
    """One row per timer of ``run``; a separate process's run labels its peers after the
    timer it was started for (``cudatimer (proton's process)``) and marks every row."""
    rows: list[list[str]] = []
    stats = workload_stats(run)
    for key, tr in run.timers.items():
        s = stats[key]
        label = key
        if separate is not None and key != separate.key:
            label = f"{key} ({separate.key}'s process)"
        if tr.status != "ok" and not s["rounds"]:
            status = f"{tr.status}: {_short(tr.reason)}"
            rows.append([run.name, label, "", "", "", "", "", "0", status])
            continue
        if tr.status != "ok":
            status = f"{tr.status}: {_short(tr.reason)}"
        else:
            status = SEPARATE_STATUS if separate is not None else "ok"
        rows.append(_row(run.name, label, key, s, status))
    return rows


def main_rows(
    runs: list[WorkloadRun], separate: list[SeparateProcess] | tuple[()] = ()
) -> list[list[str]]:
    """The overhead table: each workload's timers; a timer measured in its own process is
    replaced by that process's rows (its none, floor, cudatimer and itself)."""
    by_key = {sp.key: sp for sp in separate}
    rows: list[list[str]] = []
    done: set[tuple[str, str]] = set()
    for run in runs:
        for row in _run_rows(run):
            sp = by_key.get(row[1])
            if sp is not None and run.name in sp.runs:
                rows.extend(_run_rows(sp.runs[run.name], sp))
                done.add((sp.key, run.name))
            else:
                rows.append(row)
    for sp in separate:  # workloads only the separate process measured
        for name, child in sp.runs.items():
            if (sp.key, name) not in done:
                rows.extend(_run_rows(child, sp))
    return rows


def merged_checks(
    checks: dict[str, dict[str, Any]], separate: list[SeparateProcess] | tuple[()] = ()
) -> dict[str, dict[str, Any]]:
    """``checks`` with the per-timer results each separate process measured for its timer."""
    out = {name: dict(c) for name, c in checks.items()}
    for sp in separate:
        for name, c in sp.checks.items():
            entry = c.get(sp.key)
            if not isinstance(entry, dict) or not isinstance(out.get(name), dict):
                continue
            if isinstance(out[name].get("skipped"), str) or isinstance(out[name].get("error"), str):
                continue  # the whole check was skipped here: keep saying so
            out[name][sp.key] = {**entry, "own_process": True}
    return out


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


def _not_measured(entry: dict[str, Any]) -> str | None:
    """The cell of an entry that holds no measurement, else None."""
    if "error" in entry:
        return "error: " + _short(entry["error"], 40)
    if "skipped" in entry:
        if entry.get("same_as"):  # e.g. "same recorder as cudatimer": the reason is the cell
            return _short(entry["skipped"], 40)
        return "skipped: " + _short(entry["skipped"], 40)
    return None


def _own(entry: dict[str, Any]) -> str:
    return " [own process]" if entry.get("own_process") else ""


def _per_region(entry: dict[str, Any], field: str) -> str:
    cell = _not_measured(entry)
    if cell is not None:
        return cell
    if field not in entry:
        return "n/a"
    return _fmt(entry[field], 2) + _own(entry)


def _memory_cell(m: dict[str, Any]) -> str:
    cell = _not_measured(m)
    if cell is not None:
        return cell
    if "regions" not in m:
        return "n/a"
    capped = " (time cap)" if m["capped"] else ""
    return (
        f"{m['bytes_per_region']:.1f} ({m['growth_mb']:.1f} MB / {m['regions']:,}{capped})"
        + _own(m)
    )


def _report_cell(r: dict[str, Any]) -> str:
    cell = _not_measured(r)
    if cell is not None:
        return cell
    if "seconds" not in r:
        return "n/a"
    if not r["has_report"]:
        return "no report"
    return f"{r['seconds'] * 1e3:.1f} ({r['samples']:,} pending)" + _own(r)


def resolution_stats(res: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per timer of the resolution check: median loop and resolve ms, and the added us per
    region without and with the resolution, each paired with the unwrapped loop of its rep."""
    n = max(1, int(res.get("regions", 0)))
    reps: list[dict[str, dict[str, float]]] = res.get("reps", [])
    keys = [k for k in res.get("keys", []) if any(k in rep for rep in reps)]
    out: dict[str, dict[str, float]] = {}
    for key in keys:
        loops = [rep[key]["loop_s"] for rep in reps if key in rep]
        resolves = [rep[key]["resolve_s"] for rep in reps if key in rep]
        in_loop, incl = [], []
        for rep in reps:
            if key in rep and "none" in rep:
                base = rep["none"]["loop_s"]
                in_loop.append((rep[key]["loop_s"] - base) * 1e6 / n)
                incl.append((rep[key]["loop_s"] + rep[key]["resolve_s"] - base) * 1e6 / n)
        l1, l3 = _quartiles(in_loop)
        i1, i3 = _quartiles(incl)
        out[key] = {
            "reps": len(loops),
            "loop_ms_median": _med(loops) * 1e3,
            "resolve_ms_median": _med(resolves) * 1e3,
            "added_us_in_loop_median": _med(in_loop),
            "added_us_in_loop_q1": l1,
            "added_us_in_loop_q3": l3,
            "added_us_incl_resolution_median": _med(incl),
            "added_us_incl_resolution_q1": i1,
            "added_us_incl_resolution_q3": i3,
        }
    return out


def resolution_rows(res: dict[str, Any], runs: list[WorkloadRun]) -> list[list[str]]:
    main = next((r for r in runs if r.name == res.get("workload")), None)
    main_stats = workload_stats(main) if main is not None else {}
    rows: list[list[str]] = []
    for key, s in resolution_stats(res).items():
        base = key == "none"
        m = main_stats.get(key, {}).get("added_us_per_region_median")
        rows.append(
            [
                key,
                _fmt(s["loop_ms_median"], 1),
                "nothing to resolve" if key in ("none", "floor") else _fmt(s["resolve_ms_median"]),
                "0"
                if base
                else f"{_fmt(s['added_us_in_loop_median'], 2)} "
                f"[{_fmt(s['added_us_in_loop_q1'], 2)}, {_fmt(s['added_us_in_loop_q3'], 2)}]",
                "0"
                if base
                else f"{_fmt(s['added_us_incl_resolution_median'], 2)} "
                f"[{_fmt(s['added_us_incl_resolution_q1'], 2)}, "
                f"{_fmt(s['added_us_incl_resolution_q3'], 2)}]",
                "0" if base else _fmt(m, 2) if m is not None else "n/a",
            ]
        )
    for key, why in res.get("skipped", {}).items():
        rows.append([key, "skipped: " + _short(why, 40), "", "", "", ""])
    for key, err in res.get("errors", {}).items():
        rows.append([key, "error: " + _short(err, 40), "", "", "", ""])
    return rows


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


def _spread(run: WorkloadRun) -> str:
    """How much the baseline itself moved between rounds: the honest noise floor of a row."""
    s = workload_stats(run).get("none")
    if not s or not s["rounds"] or not s["ms_median"] > 0:  # NaN fails the comparison too
        return ""
    iqr = (s["ms_q3"] - s["ms_q1"]) / s["ms_median"] * 100
    full = (s["ms_max"] - s["ms_min"]) / s["ms_median"] * 100
    return f"baseline spread: IQR {iqr:.0f}% of its median, min-max {full:.0f}%"


def _run_line(run: WorkloadRun) -> str:
    parts = [
        f"{run.regions_per_iter} regions per iteration",
        f"{run.warmup}+{run.iters} iterations per block (warm-up + timed)",
    ]
    if run.calibrated_step_ms is not None:
        block = run.calibrated_step_ms * run.iters
        parts.append(
            f"iterations set from the unwrapped step ({run.calibrated_step_ms:.2f} ms), "
            f"~{block:.0f} ms timed per block"
        )
    parts.append(f"{len(run.rounds)} rounds, {run.seconds:.0f} s")
    if run.peak_mem_gb is not None:
        parts.append(f"peak GPU memory {run.peak_mem_gb:.1f} GB")
    spread = _spread(run)
    if spread:
        parts.append(spread)
    return "; ".join(parts)


def render_markdown(
    meta: dict[str, Any],
    runs: list[WorkloadRun],
    descriptions: dict[str, str],
    checks: dict[str, dict[str, Any]],
    notes: list[str],
    separate: list[SeparateProcess] | tuple[()] = (),
) -> str:
    parts = [
        "# cudatimer benchmark results",
        "",
        f"Device: {meta.get('device_name', 'n/a')}; torch {meta.get('torch')}; "
        f"Python {meta.get('python')}; {'smoke run' if meta.get('smoke') else 'full run'}; "
        f"{meta.get('seconds', 0):.0f} s. GPU clocks as found (never locked or changed)."
        + (
            f" Process pinned to CPU core {meta['pinned_cpu']}."
            if meta.get("pinned_cpu") is not None
            else ""
        ),
        "",
        "## Overhead per workload",
        "",
        "Medians over interleaved rounds of the per-iteration time; slowdown and added "
        "microseconds per region are paired with the unwrapped model of the same round (the "
        "bracket is the interquartile range over rounds); 'vs floor' divides a timer's added "
        "time per region by the floor's (two pre-created events re-recorded on a cached "
        "stream). Each timer runs one untimed block before round 1, and each block starts "
        "with untimed warm-up iterations.",
        "",
    ]
    for sp in separate:
        if not sp.runs:
            continue  # it measured nothing: its row says why, and the Notes
        peers = [k for run in sp.runs.values() for k in run.timers if k != sp.key]
        peers = list(dict.fromkeys(peers))  # first-seen order, once each
        named = ", ".join(peers[:-1]) + f" and {peers[-1]}" if len(peers) > 1 else "".join(peers)
        parts += [
            f"Rows marked '{SEPARATE_STATUS}' were measured in a separate process, against "
            f"that process's own baseline. {sp.key} runs in a process of its own ({sp.why}): "
            f"that process ran its own {named or 'no other'} blocks interleaved "
            f"with {sp.key}'s, and those rows' ratios are to that process's none and floor. "
            f"Raw numbers: {sp.path or 'n/a'}.",
            "",
        ]
    parts += [markdown_table(MAIN_COLUMNS, main_rows(runs, separate)), ""]
    for run in runs:
        parts.append(f"- **{run.name}**: {run.description}; {_run_line(run)}.")
    for sp in separate:
        for run in sp.runs.values():
            parts.append(f"- **{run.name}** in {sp.key}'s process: {_run_line(run)}.")
        if sp.error and sp.runs:
            parts.append(f"- {sp.key}'s process stopped early: {sp.error}")
    res = checks.get("resolution", {})
    if res.get("reps"):
        parts += [
            "",
            "## Added time per region with the resolution included",
            "",
            f"cudatimer defers resolving its events: samples pile up (bounded) and are "
            f"resolved without blocking when a stream's backlog reaches a threshold (inside the "
            f"loop) or when a report is asked (outside it). Here {res['regions']:,} regions "
            f"({res['iters']} iterations of the {res['workload']} workload) run, the GPU is "
            f"synchronized, then one summary() resolves what is left: (loop + summary - "
            f"unwrapped loop of the same rep) / regions, median over {len(res['reps'])} reps "
            f"in rotated order. The floor resolves nothing. The last column is the in-loop "
            f"figure of the overhead table, for comparison.",
            "",
            markdown_table(RESOLUTION_COLUMNS, resolution_rows(res, runs)),
        ]
    elif res:
        why = res.get("skipped") if isinstance(res.get("skipped"), str) else res.get("error")
        parts += ["", "## Added time per region with the resolution included", ""]
        parts.append(f"Not measured: {why}")
    parts += [
        "",
        "## Per timer",
        "",
        "Synchronizing CUDA runtime calls (cudaDeviceSynchronize, cudaStreamSynchronize, "
        "cudaEventSynchronize) per region in the hot path, counted under torch.profiler and "
        "diffed against the unwrapped model; resident memory growth after many regions with "
        "no report in between; time to produce a report with many samples pending. "
        "'[own process]': measured in the timer's separate process.",
        "",
        markdown_table(TIMER_COLUMNS, timer_rows(descriptions, merged_checks(checks, separate))),
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


def clean(obj: Any) -> Any:
    """NaN and infinities become null: strict JSON readers refuse them."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean(v) for v in obj]
    return obj


def to_json(
    meta: dict[str, Any],
    runs: list[WorkloadRun],
    descriptions: dict[str, str],
    checks: dict[str, dict[str, Any]],
    notes: list[str],
    separate: list[SeparateProcess] | tuple[()] = (),
) -> dict[str, Any]:
    res = checks.get("resolution", {})
    data: dict[str, Any] = clean(
        {
            "schema": 1,
            "meta": meta,
            "timers": descriptions,
            "workloads": {run.name: {**asdict(run), "stats": workload_stats(run)} for run in runs},
            # Timers measured in a process of their own, with that process's peers and stats.
            "separate_processes": {
                sp.key: {
                    **{k: v for k, v in asdict(sp).items() if k != "runs"},
                    "workloads": {
                        name: {**asdict(run), "stats": workload_stats(run)}
                        for name, run in sp.runs.items()
                    },
                }
                for sp in separate
            },
            "checks": checks,
            "resolution_stats": resolution_stats(res) if res.get("reps") else {},
            "notes": notes,
            "table_columns": list(MAIN_COLUMNS),
            "table_rows": main_rows(runs, separate),
        }
    )
    return data
