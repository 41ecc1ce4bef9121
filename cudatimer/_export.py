"""Saving and loading results: a versioned JSON schema that round-trips exactly; CSV and
pandas DataFrames of regions, steps or trace samples.

JSON floats are written with ``repr`` and read back bit for bit, so ``load(save(s)) == s``,
histogram buckets (hence every percentile) included. Per-step and trace rows are stored as
``{"columns": [...], "rows": [[...], ...]}`` with one row per line: a run of 1,000 steps of 50
regions is 50,000 rows, which one object per row would make several times larger.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
from collections.abc import Iterator, Mapping
from typing import IO, Any

from ._hist import ALPHA, Histogram
from ._records import SCHEMA_VERSION, RegionStats, StepStats, Summary, SyncSite, TraceSample

FORMAT = "cudatimer.summary"

#: Columns of ``to_csv`` / ``to_dataframe`` for what="regions" (derived statistics, no buckets).
REGION_COLUMNS = (
    "name",
    "clock",
    "depth",
    "calls",
    "skipped",
    "syncs",
    "gpu_total_ms",
    "gpu_mean_ms",
    "gpu_min_ms",
    "gpu_p50_ms",
    "gpu_p90_ms",
    "gpu_p99_ms",
    "gpu_max_ms",
    "cpu_total_ms",
    "cpu_mean_ms",
    "cpu_min_ms",
    "cpu_p50_ms",
    "cpu_p90_ms",
    "cpu_p99_ms",
    "cpu_max_ms",
)
STEP_COLUMNS = tuple(f.name for f in dataclasses.fields(StepStats))
TRACE_COLUMNS = tuple(f.name for f in dataclasses.fields(TraceSample))
WHATS = ("regions", "steps", "trace")


def _check_path(path: object) -> str:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a file path (str or os.PathLike), got {type(path).__name__}")
    return os.fspath(path)  # type: ignore[arg-type]


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
        "step_stats": {
            "columns": list(STEP_COLUMNS),
            "rows": [list(dataclasses.astuple(s)) for s in summary.step_stats],
        },
        "trace": {
            "columns": list(TRACE_COLUMNS),
            "rows": [list(dataclasses.astuple(t)) for t in summary.trace],
        },
    }


def _table(data: Mapping[str, Any], key: str, columns: tuple[str, ...]) -> Iterator[dict[str, Any]]:
    """Rows of a ``{"columns", "rows"}`` section as dicts; absent in older files: none."""
    section = data.get(key)
    if section is None:
        return
    names = list(section["columns"])
    missing = [c for c in columns if c not in names]
    if missing:
        raise ValueError(f"{key} lacks column(s) {', '.join(missing)}")
    for row in section["rows"]:
        if len(row) != len(names):
            raise ValueError(f"{key} row {row!r} does not have {len(names)} values")
        yield dict(zip(names, row, strict=True))


def _opt_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


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
        step_stats = tuple(
            StepStats(
                step=int(r["step"]),
                name=str(r["name"]),
                clock=str(r["clock"]),
                calls=int(r["calls"]),
                gpu_ms=_opt_float(r["gpu_ms"]),
                cpu_ms=float(r["cpu_ms"]),
            )
            for r in _table(data, "step_stats", STEP_COLUMNS)
        )
        trace = tuple(
            TraceSample(
                name=str(r["name"]),
                clock=str(r["clock"]),
                step=int(r["step"]),
                thread=int(r["thread"]),
                thread_name=str(r["thread_name"]),
                host_start_ms=float(r["host_start_ms"]),
                cpu_ms=float(r["cpu_ms"]),
                stream=_opt_int(r["stream"]),
                gpu_start_ms=_opt_float(r["gpu_start_ms"]),
                gpu_ms=_opt_float(r["gpu_ms"]),
            )
            for r in _table(data, "trace", TRACE_COLUMNS)
        )
        return Summary(
            regions=regions,
            pending=int(data.get("pending", 0)),
            open=int(data.get("open", 0)),
            steps=int(data.get("steps", 0)),
            meta=meta,
            sync_sites=sites,
            step_stats=step_stats,
            trace=trace,
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"malformed cudatimer summary: {exc!r}") from exc


def save(summary: Summary, path: str | os.PathLike[str]) -> None:
    """Write ``summary`` as JSON to ``path`` (atomically: a crash never leaves half a file)."""
    if not isinstance(summary, Summary):
        raise TypeError(f"summary must be a cudatimer.Summary, got {type(summary).__name__}")
    path = _check_path(path)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(dumps(summary))
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def dumps(summary: Summary) -> str:
    """The JSON text ``save`` writes: indented, with one line per step or trace row."""
    doc = summary_to_dict(summary)
    tables = {key: doc.pop(key) for key in ("step_stats", "trace")}
    head = json.dumps(doc, indent=1, allow_nan=False)
    parts = []
    for key, table in tables.items():
        rows = ",\n  ".join(json.dumps(row, allow_nan=False) for row in table["rows"])
        body = f"[\n  {rows}\n  ]" if rows else "[]"
        columns = json.dumps(table["columns"])
        parts.append(f' "{key}": {{\n  "columns": {columns},\n  "rows": {body}\n }}')
    return head[: -len("\n}")] + ",\n" + ",\n".join(parts) + "\n}\n"


def load(path: str | os.PathLike[str]) -> Summary:
    """Read a summary written by ``save``; ValueError names the file if it is not one."""
    path = _check_path(path)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not JSON ({exc})") from exc
    try:
        return summary_from_dict(data)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from exc


# -- tables: CSV and DataFrames --------------------------------------------------------------
def _check_what(what: object) -> str:
    if what not in WHATS:
        raise ValueError(f"what must be one of {', '.join(WHATS)}; got {what!r}")
    return str(what)


def table(summary: Summary, what: str = "regions") -> tuple[tuple[str, ...], list[list[Any]]]:
    """Column names and rows of ``summary``'s regions, step stats or trace samples."""
    if not isinstance(summary, Summary):
        raise TypeError(f"summary must be a cudatimer.Summary, got {type(summary).__name__}")
    what = _check_what(what)
    if what == "steps":
        return STEP_COLUMNS, [list(dataclasses.astuple(s)) for s in summary.step_stats]
    if what == "trace":
        return TRACE_COLUMNS, [list(dataclasses.astuple(t)) for t in summary.trace]
    return REGION_COLUMNS, [[getattr(r, c) for c in REGION_COLUMNS] for r in summary.regions]


def to_csv(
    summary: Summary, path: str | os.PathLike[str] | IO[str], *, what: str = "regions"
) -> None:
    """Write one table of ``summary`` as CSV to a path or a text stream.

    ``what``: "regions" (one row per region and clock, times in ms, empty where a value does
    not apply, e.g. GPU columns of host rows), "steps" (``summary.step_stats``) or "trace".
    """
    columns, rows = table(summary, what)
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow(["" if v is None else repr(v) if isinstance(v, float) else v for v in row])
    if hasattr(path, "write"):
        path.write(buf.getvalue())  # type: ignore[union-attr]
        return
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a file path or a text stream, got {type(path).__name__}")
    with open(os.fspath(path), "w", encoding="utf-8", newline="") as f:
        f.write(buf.getvalue())


def to_dataframe(summary: Summary, *, what: str = "regions") -> Any:
    """A pandas DataFrame of one table of ``summary`` (columns as in ``to_csv``; NaN for
    values that do not apply). pandas is optional: ImportError says how to get it."""
    columns, rows = table(summary, what)
    try:
        import pandas
    except ImportError as exc:
        raise ImportError(
            "cudatimer.to_dataframe needs pandas, which is not installed: pip install pandas "
            "(to_csv() and save() need nothing extra)"
        ) from exc
    nan = float("nan")
    numeric = [c.endswith("_ms") or c == "stream" for c in columns]
    rows = [
        [nan if v is None and num else v for v, num in zip(row, numeric, strict=True)]
        for row in rows
    ]
    return pandas.DataFrame(rows, columns=list(columns))
