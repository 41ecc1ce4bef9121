"""Hostile files: load() refuses every malformed field with a ValueError naming the file and
the field (never an OverflowError or a RecursionError), and every output written to a path
goes through a temporary file that a failure removes, leaving a previous file as it was."""

from __future__ import annotations

import builtins
import errno
import io
import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import cudatimer
from cudatimer import Histogram, RegionStats, Summary, TraceSample
from cudatimer.render._export import BUCKET_RANGE, MAX_JSON_DEPTH, dumps, json_depth, save
from tests.helpers.report_fixtures import gpu_run

DEEP = 2000


def deep_run(depth: int = DEEP) -> Summary:
    """A run of a recursion ``depth`` calls deep: regions f, f/f, f/f/f... on the host."""
    regions = tuple(
        RegionStats(
            "/".join(["f"] * (level + 1)),
            "host",
            1,
            None,
            Histogram.of([float(depth - level)]),
            depth=level,
        )
        for level in range(depth)
    )
    return Summary(regions=regions, steps=1)


def _doc() -> dict[str, Any]:
    return json.loads(dumps(gpu_run()))  # type: ignore[no-any-return]


def _load_text(tmp_path: Path, text: str) -> pytest.ExceptionInfo[ValueError]:
    path = tmp_path / "hostile.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError) as info:
        cudatimer.load(path)
    assert type(info.value) is ValueError
    assert str(path) in str(info.value)
    return info


def _set(*keys: Any, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(doc: dict[str, Any]) -> None:
        node = doc
        for key in keys[:-1]:
            node = node[key]
        node[keys[-1]] = value

    return change


def _bump_bucket(doc: dict[str, Any]) -> None:
    doc["regions"][0]["gpu"]["buckets"][0][1] += 1


# (change to a saved gpu_run(), text the message must hold: the field, or what is wrong)
FIELDS: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    ("calls-infinity", _set("regions", 0, "calls", value=math.inf), "regions[0].calls"),
    ("calls-negative", _set("regions", 0, "calls", value=-1), "regions[0].calls"),
    ("calls-fractional", _set("regions", 0, "calls", value=2.5), "regions[0].calls"),
    ("calls-float", _set("regions", 0, "calls", value=10.0), "regions[0].calls"),
    ("calls-bool", _set("regions", 0, "calls", value=True), "regions[0].calls"),
    ("calls-string", _set("regions", 0, "calls", value="10"), "regions[0].calls"),
    ("calls-huge", _set("regions", 0, "calls", value=2**64), "regions[0].calls"),
    ("total-nan", _set("regions", 0, "cpu", "total", value=math.nan), "regions[0].cpu.total"),
    ("total-inf", _set("regions", 1, "gpu", "total", value=-math.inf), "regions[1].gpu.total"),
    ("total-string", _set("regions", 0, "cpu", "total", value="4"), "regions[0].cpu.total"),
    ("min-nan", _set("regions", 0, "cpu", "min", value=math.nan), "regions[0].cpu.min"),
    ("min-above-max", _set("regions", 0, "cpu", "min", value=99.0), "larger than max"),
    ("empty-with-min", _set("regions", 0, "cpu", "count", value=0), "regions[0].cpu"),
    ("depth-negative", _set("regions", 1, "depth", value=-1), "regions[1].depth"),
    ("skipped-bool", _set("regions", 1, "skipped", value=False), "regions[1].skipped"),
    ("syncs-negative", _set("regions", 2, "syncs", value=-3), "regions[2].syncs"),
    ("zeros-above-count", _set("regions", 0, "cpu", "zeros", value=11), "regions[0].cpu.zeros"),
    (
        "bucket-index-huge",
        _set("regions", 0, "gpu", "buckets", 0, 0, value=100000),
        "regions[0].gpu.buckets[0][0] (bucket index)",
    ),
    (
        "bucket-index-negative",
        _set("regions", 0, "gpu", "buckets", 0, 0, value=-100000),
        "regions[0].gpu.buckets[0][0] (bucket index)",
    ),
    (
        "bucket-count-zero",
        _set("regions", 0, "gpu", "buckets", 0, 1, value=0),
        "regions[0].gpu.buckets[0][1] (bucket count)",
    ),
    ("bucket-not-pair", _set("regions", 0, "gpu", "buckets", 0, value=[1]), "buckets[0]"),
    ("bucket-sum", _bump_bucket, "bucket counts add up to 11, not count - zeros = 10"),
    (
        "bucket-order",
        _set("regions", 0, "gpu", "buckets", value=[[200, 5], [100, 5]]),
        "must ascend",
    ),
    ("gpu-not-object", _set("regions", 0, "gpu", value=[1, 2]), "regions[0].gpu"),
    ("cpu-missing", _set("regions", 0, "cpu", value=None), "regions[0].cpu"),
    ("name-number", _set("regions", 0, "name", value=7), "regions[0].name"),
    ("name-empty", _set("regions", 0, "name", value=""), "regions[0].name"),
    ("name-surrogate", _set("regions", 0, "name", value="a\ud800"), "lone surrogate"),
    ("duplicate", _set("regions", 1, value=_doc()["regions"][0]), "appears twice"),
    ("regions-object", _set("regions", value={}), "regions must be a list"),
    ("region-number", _set("regions", 0, value=3), "regions[0] must be an object"),
    ("pending-negative", _set("pending", value=-1), "pending"),
    ("steps-infinity", _set("steps", value=math.inf), "steps"),
    ("meta-number", _set("meta", "torch", value=2.11), "meta['torch']"),
    ("sync-count-bool", _set("sync_sites", 0, "count", value=True), "sync_sites[0].count"),
    ("step-calls-bool", _set("step_stats", "rows", 0, 3, value=True), "step_stats row 0.calls"),
    ("step-cpu-nan", _set("step_stats", "rows", 1, 5, value=math.nan), "step_stats row 1.cpu_ms"),
    ("step-negative", _set("step_stats", "rows", 0, 0, value=-2), "step_stats row 0.step"),
    (
        "trace-start-inf",
        _set("trace", "rows", 0, 5, value=math.inf),
        "trace row 0.host_start_ms",
    ),
    ("trace-gpu-nan", _set("trace", "rows", 1, 9, value=math.nan), "trace row 1.gpu_ms"),
    ("trace-clock", _set("trace", "rows", 1, 1, value="cuda:x"), "trace row 1.clock"),
    ("trace-rows-object", _set("trace", "rows", value={}), "trace.rows"),
    ("trace-row-short", _set("trace", "rows", 0, value=[1]), "trace row 0"),
    ("schema-bool", _set("schema", value=True), "schema True is not supported"),
]


@pytest.mark.parametrize(("change", "field"), [c[1:] for c in FIELDS], ids=[c[0] for c in FIELDS])
def test_bad_field_names_file_and_field(
    tmp_path: Path, change: Callable[[dict[str, Any]], None], field: str
) -> None:
    """A field of the wrong type or out of range is a ValueError naming the file and field."""
    doc = _doc()
    change(doc)
    info = _load_text(tmp_path, json.dumps(doc))
    assert field in str(info.value)


def _calls_literal(text: str) -> str:
    return re.sub(r'"calls": \d+', '"calls": ' + text, dumps(gpu_run()), count=1)


@pytest.mark.parametrize("literal", ["1e400", "-1e400", "Infinity", "NaN", "10.5"])
def test_unrepresentable_count_literals(tmp_path: Path, literal: str) -> None:
    """1e400, Infinity or NaN in an integer field is refused by field, not OverflowError."""
    info = _load_text(tmp_path, _calls_literal(literal))
    assert "regions[0].calls must be a count" in str(info.value)


def test_5000_digit_integer_names_file_and_field(tmp_path: Path) -> None:
    """An integer of 5000 digits (past Python's int-string limit) names the file and field."""
    info = _load_text(tmp_path, _calls_literal("7" * 5000))
    assert "regions[0].calls" in str(info.value) and "5000 digits" in str(info.value)


@pytest.mark.parametrize(
    "text",
    [
        '{"format": "cudatimer.summary", "meta": ' + "[" * 5000 + "]" * 5000 + "}",
        '{"a": ' * 5000 + "1" + "}" * 5000,
        "[" * 100000,
    ],
    ids=["arrays", "objects", "unclosed"],
)
def test_deep_nesting_is_refused_without_recursion(tmp_path: Path, text: str) -> None:
    """JSON nested 5000 deep is refused with a ValueError naming the file, no RecursionError."""
    info = _load_text(tmp_path, text)
    assert "nests" in str(info.value) and str(MAX_JSON_DEPTH) in str(info.value)


def test_brackets_inside_strings_do_not_count() -> None:
    """The depth scan skips string literals, escaped quotes included."""
    assert json_depth('{"a": "[[[[\\"[[[", "b": [["}}}"]]}') == 3
    assert json_depth(dumps(gpu_run())) <= 6


def test_region_names_with_brackets_load(tmp_path: Path) -> None:
    """Brackets and quotes in region names are data, not nesting: such a run round-trips."""
    name = '[{"' * 200
    run = Summary(regions=(RegionStats(name, "host", 1, None, Histogram.of([1.0])),))
    save(run, tmp_path / "r.json")
    assert cudatimer.load(tmp_path / "r.json") == run


def test_bucket_range_edges_load(tmp_path: Path) -> None:
    """Durations of 1e-9 ms and 1e12 ms (the edges of BUCKET_RANGE) still load exactly."""
    hist = Histogram.of([1e-9, 1.0, 1e12])
    assert hist.buckets[0][0] == BUCKET_RANGE[0] and hist.buckets[-1][0] == BUCKET_RANGE[1]
    run = Summary(regions=(RegionStats("edges", "host", 3, None, hist),))
    save(run, tmp_path / "r.json")
    assert cudatimer.load(tmp_path / "r.json") == run


def test_deep_recursion_run_loads(tmp_path: Path) -> None:
    """A saved run of regions nested 2000 deep loads back exactly (its JSON is shallow)."""
    run = deep_run()
    save(run, tmp_path / "deep.json")
    loaded = cudatimer.load(tmp_path / "deep.json")
    assert loaded == run and loaded.regions[-1].depth == DEEP - 1


# -- writes: a temporary file, renamed into place -------------------------------------------
class _FailingFile:
    """A file whose first write lands half its data, then fails as a full disk does."""

    def __init__(self, real: Any) -> None:
        self.real = real

    def write(self, data: Any) -> int:
        self.real.write(data[: len(data) // 2])
        self.real.flush()
        raise OSError(errno.ENOSPC, "No space left on device")

    def fileno(self) -> int:  # so writers that would use the descriptor go through write()
        raise io.UnsupportedOperation("fileno")

    def __enter__(self) -> _FailingFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.real.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def _fail_writes_under(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_open = builtins.open

    def fake_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        f = real_open(file, mode, *args, **kwargs)
        if "w" in mode and str(file).startswith(str(folder)):
            return _FailingFile(f)
        return f

    monkeypatch.setattr(builtins, "open", fake_open)


def _write_save(path: Path) -> None:
    save(gpu_run(), path)


def _write_trace(path: Path) -> None:
    cudatimer.export_trace(path, summary=gpu_run())


def _write_csv(path: Path) -> None:
    cudatimer.to_csv(path, summary=gpu_run(), what="trace")


def _write_plot(path: Path) -> None:
    pytest.importorskip("matplotlib")
    cudatimer.plot(path, summary=gpu_run())


def _write_html(path: Path) -> None:
    cudatimer.html(path, summary=gpu_run())


WRITERS = {
    "save": _write_save,
    "trace": _write_trace,
    "csv": _write_csv,
    "plot": _write_plot,
    "html": _write_html,
}


@pytest.mark.parametrize("previous", [None, b"previous run"], ids=["new", "existing"])
@pytest.mark.parametrize("what", list(WRITERS))
def test_failed_write_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, what: str, previous: bytes | None
) -> None:
    """A write failing half-way leaves no temporary or partial file; a previous one is kept."""
    # .png: plot writes the format its suffix names; the other writers take any name.
    WRITERS[what](tmp_path / "warm.png")  # imports (matplotlib, fonts) before writes fail
    (tmp_path / "warm.png").unlink()
    out = tmp_path / "sub" / "out.png"
    out.parent.mkdir()
    if previous is not None:
        out.write_bytes(previous)
    _fail_writes_under(tmp_path, monkeypatch)
    with pytest.raises(OSError, match="No space left"):
        WRITERS[what](out)
    monkeypatch.undo()
    expected = [] if previous is None else ["out.png"]
    assert sorted(p.name for p in out.parent.iterdir()) == expected
    if previous is not None:
        assert out.read_bytes() == previous


@pytest.mark.parametrize("previous", [None, "previous trace"], ids=["new", "existing"])
def test_trace_with_nan_leaves_nothing_behind(tmp_path: Path, previous: str | None) -> None:
    """A NaN in a trace (json refuses it) leaves no *.tmp file and a previous trace as it was."""
    run = Summary(
        regions=gpu_run().regions,
        trace=(
            TraceSample("a", "host", 0, 1, "main", 0.0, 1.0),
            *gpu_run().trace[:1],
            TraceSample("b", "host", 0, 1, "main", 2.0, math.nan),
        ),
    )
    out = tmp_path / "t.json"
    if previous is not None:
        out.write_text(previous)
    with pytest.raises(ValueError, match="Out of range float"):
        cudatimer.export_trace(out, summary=run)
    assert sorted(p.name for p in tmp_path.iterdir()) == ([] if previous is None else ["t.json"])
    if previous is not None:
        assert out.read_text() == previous
