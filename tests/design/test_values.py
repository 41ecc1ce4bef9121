"""The seam for per-call values other than time, through a column only these tests register:
recorded against a region, then in RegionStats, the JSON round trip, CSV and DataFrame columns,
merges across ranks and step windows; files without values load and export as before."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
from collections.abc import Iterator
from pathlib import Path

import pytest

import cudatimer
import cudatimer.distributed as cd
from cudatimer import Timer
from cudatimer.records import _values
from cudatimer.records._values import Column, Tally, Values
from cudatimer.render._export import REGION_COLUMNS, save, summary_to_dict
from tests.helpers.fake_cuda import install

PROBE = Column("probe", "bytes", stats=("mean", "max", "total"))
FIELDS = ("probe_mean_bytes", "probe_max_bytes", "probe_total_bytes")


@pytest.fixture(autouse=True)
def probe() -> Iterator[Column]:
    _values.register(PROBE)
    yield PROBE
    _values.unregister(PROBE.name)


def _run(name: str, per_step: list[list[float]]) -> Timer:
    """A host-clock Timer: ``load`` carries the values of each step's list, ``load/parse``
    none; one step() after each list."""
    t = Timer(name=name, clock="host")
    for values in per_step:
        for v in values:
            with t.region("load"):
                assert t.recorder.values.add_open("probe", v)
                with t.region("parse"):
                    pass
        t.step()
    return t


def test_values_fold_into_the_open_region_s_row() -> None:
    """Each value lands in the innermost open region's row: count, sum, min, max, signed."""
    s = _run("fold", [[4096, -1024], [3072]]).summary()
    assert s["load"].values["probe"] == Tally(3, 6144.0, -1024.0, 4096.0)
    assert s["load"].values["probe"].mean == 2048.0
    assert s["load/parse"].values == Values()
    assert s["load"].calls == 3  # the timing is untouched


def test_values_go_to_the_row_of_the_region_s_clock() -> None:
    """On the (fake) GPU the value joins the region's cuda:N row, not a host row."""
    with install() as gpu:
        t = Timer(name="gpu-values")
        with t.region("fwd"):
            gpu.run(1.0)
            assert t.recorder.values.add_open("probe", 8)
        (row,) = t.summary().regions
    assert row.clock == "cuda:0" and row.values["probe"].total == 8.0


def test_nothing_open_or_nothing_recorded_takes_no_value() -> None:
    """No region open, or a disabled Timer's region: the value is not kept (False)."""
    t = Timer(name="nowhere", clock="host")
    assert not t.recorder.values.add_open("probe", 1)
    t.disable()
    with t.region("off"):
        assert not t.recorder.values.add_open("probe", 1)
    t.enable()
    assert t.summary().regions == ()


def test_bad_values_and_unknown_columns_are_refused() -> None:
    """An unregistered name, a non-number or a non-finite value: a clear error."""
    t = Timer(name="bad", clock="host")
    with t.region("r"):
        with pytest.raises(ValueError, match="no value column named 'flops'"):
            t.recorder.values.add_open("flops", 1)
        with pytest.raises(TypeError, match="value must be a number, got str"):
            t.recorder.values.add_open("probe", "1")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="finite"):
            t.recorder.values.add_open("probe", math.inf)
    with pytest.raises(ValueError, match="a different column named 'probe'"):
        _values.register(Column("probe", "bytes"))
    with pytest.raises(ValueError, match="lower case"):
        Column("Probe")


def test_reset_forgets_the_values() -> None:
    """reset() drops the values with the times; values recorded after it are kept."""
    t = _run("reset-values", [[5]])
    t.reset()
    with t.region("load"):
        t.recorder.values.add_open("probe", 7)
    assert t.summary()["load"].values["probe"] == Tally(1, 7.0, 7.0, 7.0)


def test_a_window_folds_the_values_of_its_steps_only() -> None:
    """last=2 and warmup=1 merge the tallies of the steps they cover."""
    t = _run("window-values", [[1], [10, 20], [100]])
    assert t.summary(last=2)["load"].values["probe"] == Tally(3, 130.0, 10.0, 100.0)
    assert t.summary(warmup=2)["load"].values["probe"] == Tally(1, 100.0, 100.0, 100.0)
    assert t.summary()["load"].values["probe"].count == 4


def test_json_round_trip_keeps_values_exactly(tmp_path: Path) -> None:
    """save then load: equal Summaries, the values' floats bit for bit."""
    s = _run("json-values", [[0.1, 1e-300], [2.5e18]]).summary()
    save(s, tmp_path / "run.json")
    back = cudatimer.load(tmp_path / "run.json")
    assert back == s
    assert back["load"].values["probe"].total == s["load"].values["probe"].total
    regions = json.loads((tmp_path / "run.json").read_text())["regions"]
    assert [("values" in r) for r in regions] == [True, False]  # only where there are some


def test_files_without_values_load_and_export_as_before(tmp_path: Path) -> None:
    """A run without values writes no "values" key and the CSV columns of old; a file written
    before the seam (no "values" anywhere) loads with empty values."""
    t = Timer(name="plain", clock="host")
    with t.region("a"):
        pass
    s = t.summary()
    doc = summary_to_dict(s)
    assert all("values" not in r for r in doc["regions"])
    buf = io.StringIO()
    cudatimer.to_csv(buf, summary=s)
    assert tuple(next(csv.reader(io.StringIO(buf.getvalue())))) == REGION_COLUMNS
    (tmp_path / "old.json").write_text(json.dumps(doc))
    assert cudatimer.load(tmp_path / "old.json")["a"].values == Values()


def test_csv_and_dataframe_carry_the_value_columns() -> None:
    """CSV: the column's fields after the time columns, empty where a row has no value;
    DataFrame: the same columns, NaN there."""
    s = _run("csv-values", [[2, 4]]).summary()
    buf = io.StringIO()
    cudatimer.to_csv(buf, summary=s)
    rows = list(csv.DictReader(io.StringIO(buf.getvalue())))
    assert tuple(rows[0]) == REGION_COLUMNS + FIELDS
    assert [rows[0][f] for f in FIELDS] == ["3.0", "4.0", "6.0"]
    assert [rows[1][f] for f in FIELDS] == ["", "", ""]
    pytest.importorskip("pandas")
    df = cudatimer.to_dataframe(summary=s).set_index("name")
    assert df.loc["load", "probe_total_bytes"] == 6.0
    assert math.isnan(df.loc["load/parse", "probe_mean_bytes"])


def test_values_merge_across_ranks_through_saved_files(tmp_path: Path) -> None:
    """Per-rank files merged offline: the cross-rank row and the flat merge carry the ranks'
    tallies merged, and the cross-rank file keeps them."""
    for rank, values in enumerate(([1, 2], [40])):
        s = _run(f"rank{rank}", [values]).summary()
        save(s, tmp_path / f"rank{rank}.json")
    ranked = cd.merge_files([tmp_path / "rank0.json", tmp_path / "rank1.json"])
    merged = Tally(3, 43.0, 1.0, 40.0)
    assert ranked["load"].values["probe"] == merged
    assert ranked["load"].rank(1).values["probe"] == Tally(1, 40.0, 40.0, 40.0)  # type: ignore[union-attr]
    assert ranked.merged()["load"].values["probe"] == merged
    cd.save_ranks(ranked, tmp_path / "ranks.json")
    assert cd.load_ranks(tmp_path / "ranks.json")["load"].values["probe"] == merged


def test_region_stats_merge_merges_values() -> None:
    """RegionStats.merge: tallies of a column in both rows merged; a row without values
    leaves the other's as they are."""
    a = _run("merge-a", [[1]]).summary()["load"]
    b = _run("merge-b", [[9]]).summary()["load"]
    assert a.merge(b).values["probe"] == Tally(2, 10.0, 1.0, 9.0)
    bare = dataclasses.replace(b, values=Values())
    assert a.merge(bare).values == a.values and bare.merge(a).values == a.values


def test_a_loaded_file_s_unknown_column_still_exports(tmp_path: Path) -> None:
    """Values of a column this process does not know load, and export with default stats."""
    s = _run("unknown-values", [[3]]).summary()
    save(s, tmp_path / "run.json")
    _values.unregister("probe")
    back = cudatimer.load(tmp_path / "run.json")
    assert back["load"].values["probe"].total == 3.0
    buf = io.StringIO()
    cudatimer.to_csv(buf, summary=back)
    assert next(csv.reader(io.StringIO(buf.getvalue())))[-2:] == [
        "probe_mean",
        "probe_max",
    ]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ([], r"regions\[0\]\.values must be an object"),
        ({"Bad Name": {}}, r"regions\[0\]\.values key must be a value column"),
        ({"probe": {"count": 0, "total": 0, "min": 0, "max": 0}}, r"\.count must be"),
        ({"probe": {"count": 1, "total": "1", "min": 1, "max": 1}}, r"\.total must be a number"),
        ({"probe": {"count": 1, "total": 1, "min": 2, "max": 1}}, "min 2.0 is larger than max"),
    ],
)
def test_malformed_values_in_a_file_are_refused_naming_the_field(
    tmp_path: Path, values: object, message: str
) -> None:
    """A file's bad "values" is a ValueError naming the field, never a traceback."""
    s = _run("bad-file", [[1]]).summary()
    doc = summary_to_dict(s)
    doc["regions"][0]["values"] = values
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=message):
        cudatimer.load(tmp_path / "bad.json")


def test_summary_equality_sees_values() -> None:
    """Two summaries that differ only in a value are not equal."""
    s = _run("eq", [[1]]).summary()
    row = dataclasses.replace(s.regions[0], values=Values({"probe": Tally(1, 2.0, 2.0, 2.0)}))
    assert dataclasses.replace(s, regions=(row, *s.regions[1:])) != s
