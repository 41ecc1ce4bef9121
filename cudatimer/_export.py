"""Saving and loading results: a versioned JSON schema that round-trips exactly."""

from __future__ import annotations

import json
import os
from typing import Any

from ._hist import ALPHA, Histogram
from ._records import SCHEMA_VERSION, RegionStats, Summary, SyncSite

FORMAT = "cudatimer.summary"


def summary_to_dict(summary: Summary) -> dict[str, Any]:
    """Plain data for JSON: every field, histograms included (so saved runs merge exactly)."""
    return {
        "format": FORMAT,
        "schema": SCHEMA_VERSION,
        "alpha": ALPHA,
        "pending": summary.pending,
        "open": summary.open,
        "steps": summary.steps,
        "meta": dict(summary.meta),
        "regions": [
            {
                "name": r.name,
                "clock": r.clock,
                "calls": r.calls,
                "skipped": r.skipped,
                "depth": r.depth,
                "syncs": r.syncs,
                "gpu": r.gpu.to_dict() if r.gpu is not None else None,
                "cpu": r.cpu.to_dict(),
            }
            for r in summary.regions
        ],
        "sync_sites": [
            {"location": s.location, "kind": s.kind, "region": s.region, "count": s.count}
            for s in summary.sync_sites
        ],
    }


def summary_from_dict(data: Any) -> Summary:
    """Inverse of ``summary_to_dict``; a clear ValueError for anything else."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError("not a cudatimer summary (missing 'format': 'cudatimer.summary')")
    schema = data.get("schema")
    if schema != SCHEMA_VERSION:
        raise ValueError(
            f"cudatimer summary schema {schema!r} is not supported by this version "
            f"(it reads schema {SCHEMA_VERSION}); upgrade cudatimer to read it"
        )
    if data.get("alpha") != ALPHA:
        raise ValueError(
            f"summary histograms use relative error {data.get('alpha')!r}, this version uses "
            f"{ALPHA}; they cannot be merged"
        )
    try:
        regions = tuple(
            RegionStats(
                name=str(r["name"]),
                clock=str(r["clock"]),
                calls=int(r["calls"]),
                gpu=Histogram.from_dict(r["gpu"]) if r.get("gpu") is not None else None,
                cpu=Histogram.from_dict(r["cpu"]),
                skipped=int(r.get("skipped", 0)),
                depth=int(r.get("depth", 0)),
                syncs=int(r.get("syncs", 0)),
            )
            for r in data["regions"]
        )
        sites = tuple(
            SyncSite(str(s["location"]), str(s["kind"]), str(s["region"]), int(s["count"]))
            for s in data.get("sync_sites", [])
        )
        meta = tuple((str(k), str(v)) for k, v in dict(data.get("meta", {})).items())
        return Summary(
            regions=regions,
            pending=int(data.get("pending", 0)),
            open=int(data.get("open", 0)),
            steps=int(data.get("steps", 0)),
            meta=meta,
            sync_sites=sites,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"malformed cudatimer summary: {exc!r}") from exc


def save(summary: Summary, path: str | os.PathLike[str]) -> None:
    """Write ``summary`` as JSON to ``path`` (atomically: a crash never leaves half a file)."""
    if not isinstance(summary, Summary):
        raise TypeError(f"summary must be a cudatimer.Summary, got {type(summary).__name__}")
    path = os.fspath(path)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(summary_to_dict(summary), f, indent=1, allow_nan=False)
        f.write("\n")
    os.replace(tmp, path)


def load(path: str | os.PathLike[str]) -> Summary:
    """Read a summary written by ``save``; ValueError names the file if it is not one."""
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON ({exc})") from exc
    try:
        return summary_from_dict(data)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from exc
