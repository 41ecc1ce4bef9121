"""Saving and loading results: a versioned JSON schema that round-trips exactly; CSV and
pandas DataFrames of regions, steps or trace samples.

JSON floats are written with ``repr`` and read back bit for bit, so ``load(save(s)) == s``,
histogram buckets (hence every percentile) included. A region's per-call values other than
time (``records/_values.py``) are an optional ``"values"`` object beside its histograms, and
``<column>_<stat>`` table columns for the value columns a summary holds. Per-step and trace
rows are stored as ``{"columns": [...], "rows": [[...], ...]}`` with one row per line: a run
of 1,000 steps of 50 regions is 50,000 rows, which one object per row would make several
times larger.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import os
import re
from collections.abc import Iterator, Mapping
from itertools import accumulate
from typing import IO, Any

from ..records import _values
from ..records._hist import ALPHA, INV_LOG_GAMMA, Histogram
from ..records._records import (
    SCHEMA_VERSION,
    RegionStats,
    StepStats,
    Summary,
    SyncSite,
    TraceSample,
)
from ..records._values import Column, Tally, Values
from ._write import check_path, to_file, to_path

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
#: The columns of region tables derived from FLOP counts (flops=True), where a row has some.
FLOP_RATE_COLUMNS = ("tflop_per_s", "mfu")
#: Per-step columns (``StepStats``); the FLOP ones only where a row was counted, so files and
#: tables without counts stay as they were (and load where the FLOP columns are absent).
STEP_FLOP_COLUMNS = ("flop", "tflop_per_s", "mfu")
STEP_COLUMNS = tuple(
    f.name for f in dataclasses.fields(StepStats) if f.name not in STEP_FLOP_COLUMNS
)


def step_table(steps: tuple[StepStats, ...]) -> tuple[tuple[str, ...], list[list[Any]]]:
    """Columns and rows of per-step records: the FLOP columns where some row has a count."""
    names = STEP_COLUMNS
    if any(s.flop is not None for s in steps):
        names += STEP_FLOP_COLUMNS
    return names, [[getattr(s, c) for c in names] for s in steps]


TRACE_COLUMNS = tuple(f.name for f in dataclasses.fields(TraceSample))
WHATS = ("regions", "steps", "trace")


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
                # Only where a feature recorded values: files without them stay as they were.
                **({"values": _values_dict(r.values)} if r.values else {}),
            }
            for r in summary.regions
        ],
        "sync_sites": [
            {"location": s.location, "kind": s.kind, "region": s.region, "count": s.count}
            for s in summary.sync_sites
        ],
        "step_stats": {
            "columns": list(step_table(summary.step_stats)[0]),
            "rows": step_table(summary.step_stats)[1],
        },
        "trace": {
            "columns": list(TRACE_COLUMNS),
            "rows": [list(dataclasses.astuple(t)) for t in summary.trace],
        },
        # Derived from "regions" (readers recompute it; load ignores it), so schema 1 stands.
        "backward_coverage": [
            {
                "region": c.region,
                "clock": c.clock,
                "total_ms": c.total_ms,
                "covered_ms": c.covered_ms,
                "children": c.children,
                "fraction": None if math.isnan(c.fraction) else c.fraction,
            }
            for c in summary.backward_coverage
        ],
    }


def _values_dict(values: Values) -> dict[str, dict[str, float | int]]:
    return {
        name: {"count": t.count, "total": t.total, "min": t.min, "max": t.max}
        for name, t in values.items()
    }


# -- reading: every field checked ------------------------------------------------------------
#: Deepest JSON nesting ``load`` reads. A summary nests 6 deep (summary > regions > region >
#: histogram > buckets > [index, count]), however deep its regions nest (paths are strings).
MAX_JSON_DEPTH = 32
#: Largest count (calls, samples, steps) a file may hold: what an int64 column holds.
MAX_COUNT = 2**63 - 1
#: Bucket indices of durations from 1e-9 ms to 1e12 ms (``ceil(log(x) / log(GAMMA))``); a file
#: with a bucket outside them was not written by cudatimer.
BUCKET_RANGE = (
    math.ceil(math.log(1e-9) * INV_LOG_GAMMA),
    math.ceil(math.log(1e12) * INV_LOG_GAMMA),
)
_MAX_INT_DIGITS = 40  # longer integer literals are kept as _LongInt (and refused by field)

_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_BRACKET_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}
_TRACE_CLOCK = re.compile(r"host|cuda:(?:0|[1-9][0-9]{0,5})")


class _LongInt:
    """An integer literal too long to be any field's value (stands in for it until checked)."""

    __slots__ = ("digits",)

    def __init__(self, text: str) -> None:
        self.digits = len(text.lstrip("-"))

    def __repr__(self) -> str:
        return f"an integer of {self.digits} digits"


def _parse_int(text: str) -> int | _LongInt:
    # Python refuses to convert integers of more than 4300 digits with a ValueError that does
    # not say where; keep the literal's length instead and let the field check name it.
    return int(text) if len(text) <= _MAX_INT_DIGITS else _LongInt(text)


def json_depth(text: str) -> int:
    """How deep the arrays and objects of JSON ``text`` nest, without parsing it (so without
    recursion: the string literals are dropped, then the brackets counted)."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    return max(accumulate(map(_BRACKET_STEP.__getitem__, brackets)), default=0)


def read_json(path: str | os.PathLike[str]) -> Any:
    """The JSON document in ``path``, refused with a ValueError naming the file when it is not
    UTF-8 JSON or nests deeper than ``MAX_JSON_DEPTH``. Integers of more than 40 digits stay
    unconverted (``summary_from_dict`` refuses them by field)."""
    path = check_path(path)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not JSON (not UTF-8 text: {exc})") from exc
    depth = json_depth(text)
    if depth > MAX_JSON_DEPTH:
        raise ValueError(
            f"{path}: not a cudatimer file: its JSON nests {depth} deep, and a cudatimer file "
            f"nests at most {MAX_JSON_DEPTH} deep"
        )
    try:
        return json.loads(text, parse_int=_parse_int)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
        raise ValueError(f"{path}: not JSON ({exc})") from exc


def _shown(value: object) -> str:
    text = repr(value) if not isinstance(value, (dict, list)) else type(value).__name__
    return text if len(text) <= 60 else f"{text[:40]}... ({len(text)} characters)"


def _bad(where: str, expected: str, value: object) -> ValueError:
    return ValueError(f"{where} must be {expected}, got {_shown(value)}")


def _int(value: object, where: str, lo: int = 0, hi: int = MAX_COUNT) -> int:
    """An integer (never a bool, a float or a string) in [lo, hi]."""
    if type(value) is not int or not lo <= value <= hi:
        expected = "a count (an integer >= 0)" if (lo, hi) == (0, MAX_COUNT) else None
        raise _bad(where, expected or f"an integer from {lo} to {hi}", value)
    return value


def _float(value: object, where: str, lo: float = -math.inf) -> float:
    """A finite number >= lo (JSON integers are numbers too; booleans are not)."""
    if type(value) not in (int, float):
        raise _bad(where, "a number", value)
    try:
        number = float(value)  # type: ignore[arg-type]
    except OverflowError:
        number = math.inf
    if not math.isfinite(number) or number < lo:
        raise _bad(where, "a finite number" + (f" >= {lo:g}" if lo > -math.inf else ""), value)
    return number


def _opt_float(value: object, where: str, lo: float = -math.inf) -> float | None:
    return None if value is None else _float(value, where, lo)


def _str(value: object, where: str, *, empty: bool = True) -> str:
    if not isinstance(value, str) or (not empty and not value):
        raise _bad(where, "a string" if empty else "a non-empty string", value)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise _bad(where, "text (it holds a lone surrogate)", value) from None
    return value


def _obj(value: object, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _bad(where, "an object", value)
    return value


def _list(value: object, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise _bad(where, "a list", value)
    return value


def _histogram(value: object, where: str) -> Histogram:
    data = _obj(value, where)
    count = _int(data.get("count"), f"{where}.count")
    total = _float(data.get("total"), f"{where}.total")
    zeros = _int(data.get("zeros", 0), f"{where}.zeros", 0, count)
    lo, hi = data.get("min"), data.get("max")
    if count == 0:
        if lo is not None or hi is not None:
            raise ValueError(f"{where}: an empty histogram (count 0) has null min and max")
        low, high = math.inf, -math.inf
    else:
        low, high = _float(lo, f"{where}.min"), _float(hi, f"{where}.max")
        if low > high:
            raise ValueError(f"{where}: min {low!r} is larger than max {high!r}")
    buckets: list[tuple[int, int]] = []
    first, last = BUCKET_RANGE
    for i, pair in enumerate(_list(data.get("buckets", []), f"{where}.buckets")):
        at = f"{where}.buckets[{i}]"
        if not isinstance(pair, list) or len(pair) != 2:
            raise _bad(at, "an [index, count] pair", pair)
        index = _int(pair[0], f"{at}[0] (bucket index)", first, last)
        if buckets and index <= buckets[-1][0]:
            raise ValueError(f"{at}: bucket indices must ascend, {index} follows {buckets[-1][0]}")
        buckets.append((index, _int(pair[1], f"{at}[1] (bucket count)", 1)))
    in_buckets = sum(n for _, n in buckets)
    if in_buckets != count - zeros:
        raise ValueError(
            f"{where}: bucket counts add up to {in_buckets}, not count - zeros = {count - zeros}"
        )
    return Histogram(count, total, low, high, zeros, tuple(buckets))


def _table(data: Mapping[str, Any], key: str, columns: tuple[str, ...]) -> Iterator[dict[str, Any]]:
    """Rows of a ``{"columns", "rows"}`` section as dicts; absent in older files: none."""
    section = data.get(key)
    if section is None:
        return
    section = _obj(section, key)
    names = _list(section.get("columns"), f"{key}.columns")
    for i, name in enumerate(names):
        _str(name, f"{key}.columns[{i}]")
    missing = [c for c in columns if c not in names]
    if missing:
        raise ValueError(f"{key} lacks column(s) {', '.join(missing)}")
    for i, row in enumerate(_list(section.get("rows"), f"{key}.rows")):
        if not isinstance(row, list) or len(row) != len(names):
            raise ValueError(
                f"{key} row {i} must be a list of {len(names)} values, got {_shown(row)}"
            )
        yield dict(zip(names, row, strict=True))


def _values_of(value: object, where: str) -> Values:
    """A region's optional ``"values"`` (absent in files without values: none)."""
    if value is None:
        return Values()
    out = {}
    for name, data in _obj(value, where).items():
        at = f"{where}[{name!r}]"
        if not _value_name(name):
            raise _bad(f"{where} key", "a value column's name (lower case, digits, '_')", name)
        t = _obj(data, at)
        count = _int(t.get("count"), f"{at}.count", 1)
        low, high = _float(t.get("min"), f"{at}.min"), _float(t.get("max"), f"{at}.max")
        if low > high:
            raise ValueError(f"{at}: min {low!r} is larger than max {high!r}")
        out[name] = Tally(count, _float(t.get("total"), f"{at}.total"), low, high)
    return Values(out)


def _value_name(name: str) -> bool:
    try:
        Column(name)
    except ValueError:
        return False
    return True


def _region(value: object, where: str) -> RegionStats:
    r = _obj(value, where)
    gpu = r.get("gpu")
    return RegionStats(
        name=_str(r.get("name"), f"{where}.name", empty=False),
        clock=_str(r.get("clock"), f"{where}.clock", empty=False),
        calls=_int(r.get("calls"), f"{where}.calls"),
        gpu=None if gpu is None else _histogram(gpu, f"{where}.gpu"),
        cpu=_histogram(r.get("cpu"), f"{where}.cpu"),
        skipped=_int(r.get("skipped", 0), f"{where}.skipped"),
        depth=_int(r.get("depth", 0), f"{where}.depth"),
        syncs=_int(r.get("syncs", 0), f"{where}.syncs"),
        values=_values_of(r.get("values"), f"{where}.values"),
    )


def _step(r: dict[str, Any], where: str) -> StepStats:
    return StepStats(
        step=_int(r["step"], f"{where}.step"),
        name=_str(r["name"], f"{where}.name", empty=False),
        clock=_str(r["clock"], f"{where}.clock", empty=False),
        calls=_int(r["calls"], f"{where}.calls"),
        gpu_ms=_opt_float(r["gpu_ms"], f"{where}.gpu_ms", 0.0),
        cpu_ms=_float(r["cpu_ms"], f"{where}.cpu_ms", 0.0),
        flop=_opt_float(r.get("flop"), f"{where}.flop", 0.0),
        tflop_per_s=_opt_float(r.get("tflop_per_s"), f"{where}.tflop_per_s", 0.0),
        mfu=_opt_float(r.get("mfu"), f"{where}.mfu", 0.0),
    )


def _sample(r: dict[str, Any], where: str) -> TraceSample:
    clock = _str(r["clock"], f"{where}.clock")
    if not _TRACE_CLOCK.fullmatch(clock):
        raise _bad(f"{where}.clock", "'host' or 'cuda:N'", clock)
    stream, gpu_start, gpu_ms = r["stream"], r["gpu_start_ms"], r["gpu_ms"]
    return TraceSample(
        name=_str(r["name"], f"{where}.name", empty=False),
        clock=clock,
        step=_int(r["step"], f"{where}.step"),
        thread=_int(r["thread"], f"{where}.thread", -(2**64), 2**64),
        thread_name=_str(r["thread_name"], f"{where}.thread_name"),
        host_start_ms=_float(r["host_start_ms"], f"{where}.host_start_ms"),
        cpu_ms=_float(r["cpu_ms"], f"{where}.cpu_ms", 0.0),
        stream=None if stream is None else _int(stream, f"{where}.stream", -(2**64), 2**64),
        gpu_start_ms=_opt_float(gpu_start, f"{where}.gpu_start_ms"),
        gpu_ms=_opt_float(gpu_ms, f"{where}.gpu_ms", 0.0),
    )


def _fields(data: dict[str, Any]) -> Summary:
    regions = []
    seen: set[tuple[str, str]] = set()
    for i, value in enumerate(_list(data.get("regions"), "regions")):
        region = _region(value, f"regions[{i}]")
        if (region.name, region.clock) in seen:
            raise ValueError(
                f"regions[{i}]: region {region.name!r} on clock {region.clock!r} appears twice"
            )
        seen.add((region.name, region.clock))
        regions.append(region)
    sites = []
    for i, value in enumerate(_list(data.get("sync_sites", []), "sync_sites")):
        s, at = _obj(value, f"sync_sites[{i}]"), f"sync_sites[{i}]"
        sites.append(
            SyncSite(
                _str(s.get("location"), f"{at}.location"),
                _str(s.get("kind"), f"{at}.kind"),
                _str(s.get("region"), f"{at}.region"),
                _int(s.get("count"), f"{at}.count"),
            )
        )
    meta = tuple(
        (_str(k, "meta key"), _str(v, f"meta[{k!r}]"))
        for k, v in _obj(data.get("meta", {}), "meta").items()
    )
    steps = [
        _step(r, f"step_stats row {i}")
        for i, r in enumerate(_table(data, "step_stats", STEP_COLUMNS))
    ]
    trace = [
        _sample(r, f"trace row {i}") for i, r in enumerate(_table(data, "trace", TRACE_COLUMNS))
    ]
    return Summary(
        regions=tuple(regions),
        pending=_int(data.get("pending", 0), "pending"),
        open=_int(data.get("open", 0), "open"),
        steps=_int(data.get("steps", 0), "steps"),
        meta=meta,
        sync_sites=tuple(sites),
        step_stats=tuple(steps),
        trace=tuple(trace),
    )


#: The format of ``cudatimer.distributed``'s merged files, defined here so that ``load`` can
#: say what such a file is (exports never import the distributed layer above them).
RANKS_FORMAT = "cudatimer.ranks"
#: The format of ``cudatimer.live``'s files (``_livefile``): ``load`` reads the whole run a
#: final state holds.
LIVE_FORMAT = "cudatimer.live"


def summary_from_dict(data: Any) -> Summary:
    """Inverse of ``summary_to_dict``, checking every field (types, ranges, finiteness, that
    histogram buckets add up); a ValueError that names the field for anything else."""
    if isinstance(data, dict) and data.get("format") == RANKS_FORMAT:
        raise ValueError(
            "a cross-rank file (format 'cudatimer.ranks', written by `python -m "
            "cudatimer.distributed merge`), not one run: read it with `python -m "
            "cudatimer.distributed show FILE`, or write one Summary with `merge --flat`"
        )
    if isinstance(data, dict) and data.get("format") == LIVE_FORMAT:
        if not isinstance(data.get("summary"), dict):
            raise ValueError(
                f"a live file of a run in state {_shown(data.get('state'))}: it holds the "
                "whole run only once the run has ended (its final state); watch it with "
                "`cudatimer watch FILE`"
            )
        return summary_from_dict(data["summary"])
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError("not a cudatimer summary (missing 'format': 'cudatimer.summary')")
    schema = data.get("schema")
    if type(schema) is not int or schema != SCHEMA_VERSION:
        raise ValueError(
            f"cudatimer summary schema {_shown(schema)} is not supported by this version "
            f"(it reads schema {SCHEMA_VERSION}); upgrade cudatimer to read it"
        )
    if type(data.get("alpha")) is not float or data.get("alpha") != ALPHA:
        raise ValueError(
            f"summary histograms use relative error {_shown(data.get('alpha'))}, this version "
            f"uses {ALPHA}; they cannot be merged"
        )
    try:
        return _fields(data)
    except ValueError as exc:
        raise ValueError(f"malformed cudatimer summary: {exc}") from exc
    except (KeyError, TypeError, AttributeError, ArithmeticError, RecursionError) as exc:
        # Not reached by any file the checks above know of; kept so none gives a traceback.
        raise ValueError(f"malformed cudatimer summary: {exc!r}") from exc


def save(summary: Summary, path: str | os.PathLike[str]) -> None:
    """Write ``summary`` as JSON to ``path`` (atomically: a crash never leaves half a file)."""
    if not isinstance(summary, Summary):
        raise TypeError(f"summary must be a cudatimer.Summary, got {type(summary).__name__}")
    to_path(path).write(dumps(summary))


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
    """Read a summary written by ``save``. Every field is checked; a ValueError names the file
    (and the field) when it is not one: not JSON, nested deeper than ``MAX_JSON_DEPTH``, or a
    field of the wrong type or out of range (negative or fractional counts, non-finite times,
    bucket indices outside ``BUCKET_RANGE``, buckets that do not add up, min above max...)."""
    path = check_path(path)
    data = read_json(path)
    try:
        return summary_from_dict(data)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from exc


# -- tables: CSV and DataFrames --------------------------------------------------------------
def check_what(what: object) -> str:
    if what not in WHATS:
        raise ValueError(f"what must be one of {', '.join(WHATS)}; got {what!r}")
    return str(what)


def value_columns(summary: Summary) -> tuple[Column, ...]:
    """The value columns ``summary``'s regions hold values of (none: the tables are as
    without the value seam)."""
    return _values.columns({name for r in summary.regions for name in r.values})


def table(summary: Summary, what: str = "regions") -> tuple[tuple[str, ...], list[list[Any]]]:
    """Column names and rows of ``summary``'s regions, step stats or trace samples; region
    rows end with the fields of ``value_columns`` (empty where a row has no such value)."""
    if not isinstance(summary, Summary):
        raise TypeError(f"summary must be a cudatimer.Summary, got {type(summary).__name__}")
    what = check_what(what)
    if what == "steps":
        return step_table(summary.step_stats)
    if what == "trace":
        return TRACE_COLUMNS, [list(dataclasses.astuple(t)) for t in summary.trace]
    extra = value_columns(summary)
    # flops=True: the rates derived from the counts and times, after the value columns.
    rates = FLOP_RATE_COLUMNS if any("flop" in r.values for r in summary.regions) else ()
    names = REGION_COLUMNS + tuple(f for c in extra for f in c.fields()) + rates
    rows = [
        [getattr(r, c) for c in REGION_COLUMNS]
        + [cell for c in extra for cell in c.row(r.values.get(c.name))]
        + [getattr(r, c) for c in rates]
        for r in summary.regions
    ]
    return names, rows


def render_csv(summary: Summary, what: str = "regions") -> str:
    """One table of ``summary`` as CSV text.

    ``what``: "regions" (one row per region and clock, times in ms, empty where a value does
    not apply, e.g. GPU columns of host rows), "steps" (``summary.step_stats``) or "trace".
    """
    columns, rows = table(summary, what)
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow(["" if v is None else repr(v) if isinstance(v, float) else v for v in row])
    return buf.getvalue()


def to_csv(
    summary: Summary, path: str | os.PathLike[str] | IO[str], *, what: str = "regions"
) -> None:
    """Write ``render_csv(summary, what)`` to a path (atomically) or a text stream."""
    to_file(path).write(render_csv(summary, what))


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
    valued = {f for c in value_columns(summary) for f in c.fields()} if what == "regions" else set()
    valued.update(FLOP_RATE_COLUMNS)
    numeric = [c.endswith("_ms") or c == "stream" or c in valued for c in columns]
    rows = [
        [nan if v is None and num else v for v, num in zip(row, numeric, strict=True)]
        for row in rows
    ]
    return pandas.DataFrame(rows, columns=list(columns))
