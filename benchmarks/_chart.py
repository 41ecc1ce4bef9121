"""The chart: microseconds each timer adds per region, one panel per workload."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from _measure import SeparateProcess, WorkloadRun
from _report import workload_stats


def plot(
    runs: list[WorkloadRun], path: Path, separate: list[SeparateProcess] | tuple[()] = ()
) -> str | None:
    """Write a PNG of the added time per region (median, IQR whiskers) per timer and workload.
    A timer measured in its own process (Proton) gets its bar from that process, against that
    process's baseline, labelled so. Returns None when written, else why not."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        return f"matplotlib is not installed ({exc})"
    panels = []
    for run in runs:
        stats: dict[str, dict[str, Any]] = dict(workload_stats(run))
        for sp in separate:
            child = sp.runs.get(run.name)
            if child is not None:
                stats.pop(sp.key, None)
                stats[f"{sp.key} (own process)"] = workload_stats(child)[sp.key]
        bars = [
            (key, s)
            for key, s in stats.items()
            if key != "none" and s["rounds"] and not math.isnan(s["added_us_per_region_median"])
        ]
        if bars:
            panels.append((run, bars))
    if not panels:
        return "no timer was measured"
    fig, axes = plt.subplots(
        len(panels), 1, figsize=(9, 0.32 * sum(len(b) for _, b in panels) + 1.2 * len(panels))
    )
    axes_list = list(axes) if len(panels) > 1 else [axes]
    for ax, (run, bars) in zip(axes_list, panels, strict=True):
        names = [k for k, _ in bars]
        med = [s["added_us_per_region_median"] for _, s in bars]
        lo = [
            max(0.0, m - s["added_us_per_region_q1"]) for m, (_, s) in zip(med, bars, strict=True)
        ]
        hi = [
            max(0.0, s["added_us_per_region_q3"] - m) for m, (_, s) in zip(med, bars, strict=True)
        ]
        colors = [
            "tab:green" if k.startswith("cudatimer") else "tab:gray" if k == "floor" else "tab:blue"
            for k in names
        ]
        y = list(range(len(names)))
        ax.barh(y, med, xerr=[lo, hi], color=colors, capsize=2)
        ax.set_yticks(y, names)
        ax.invert_yaxis()
        # Symmetric log: the synchronizing timers add 10-1000x what the event timers add, and
        # noise can make a near-free timer read slightly negative.
        ax.set_xscale("symlog", linthresh=1.0)
        ax.axvline(0, color="black", linewidth=0.6)
        floor = dict(bars).get("floor")
        if floor is not None and floor["added_us_per_region_median"] > 0:
            target = 1.25 * floor["added_us_per_region_median"]
            ax.axvline(target, color="tab:green", linestyle=":", linewidth=1, label="1.25 x floor")
            ax.legend(fontsize=7, loc="lower right")
        ax.set_title(
            f"{run.name}: {run.regions_per_iter} regions/iter, {len(run.rounds)} rounds",
            fontsize=9,
        )
        ax.tick_params(labelsize=8)
        ax.set_xlabel("added us per region vs no timer (median, IQR)", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None
