"""Reports: flat and tree views, sorting, filters, columns, host-bound flag, sync sites,
compare, output to streams and loggers, and the report at exit."""

from __future__ import annotations

import dataclasses
import io
import logging
import os

import pytest
from tabulate import tabulate_formats

import cudatimer
from cudatimer import Histogram, RegionStats, Summary, SyncSite
from cudatimer.render._report import HOST_BOUND_RATIO, render, render_compare
from tests.helpers.report_fixtures import assert_snapshot, gpu_run, gpu_run_after, host_run
from tests.helpers.subproc import run_python


def _rows(text: str) -> dict[str, list[str]]:
    """Parse a fmt="tsv" table into {region cell: other cells}."""
    lines = text.split("\nnote:")[0].split("\n\n")[0].splitlines()
    table = ([c.strip() for c in line.split("\t")] for line in lines[1:])
    return {cells[0]: cells[1:] for cells in table}


def _order(text: str) -> list[str]:
    lines = text.split("\nnote:")[0].split("\n\n")[0].splitlines()
    return [line.split("\t")[0].strip() for line in lines[1:]]


# -- snapshots ----------------------------------------------------------------------------------
@pytest.mark.parametrize("view", ["flat", "tree"])
@pytest.mark.parametrize("fmt", ["simple", "github", "plain", "grid"])
def test_snapshot_views(view: str, fmt: str) -> None:
    """Flat and tree views of a fixed GPU run render exactly as reviewed, in each format."""
    assert_snapshot(f"report_{view}_{fmt}.txt", render(gpu_run(), view=view, fmt=fmt))


def test_snapshot_host_only_tree() -> None:
    """A CPU-only run drops the GPU columns and shows host self time and shares."""
    assert_snapshot("report_host_tree.txt", render(host_run(), view="tree"))


def test_snapshot_compare() -> None:
    """compare renders base, new, ratio and a faster/slower verdict per region."""
    assert_snapshot("compare_simple.txt", render_compare(gpu_run(), gpu_run_after()))


@pytest.mark.parametrize("fmt", tabulate_formats)
def test_every_tabulate_format_renders(fmt: str) -> None:
    """Any tabulate format name works for both views and names every region."""
    for view in ("flat", "tree"):
        text = render(gpu_run(), view=view, fmt=fmt)
        for leaf in ("forward", "attention", "mlp", "optimizer", "data"):
            assert leaf in text


# -- tree ----------------------------------------------------------------------------------------
def test_tree_self_time_and_shares() -> None:
    """Self time is inclusive minus children on the same clock; shares are of parent and total."""
    cols = ["region", "gpu_total", "gpu_self", "cpu_self", "pct_parent", "pct_total"]
    rows = _rows(render(gpu_run(), view="tree", fmt="tsv", columns=cols))
    # train_step: 102 ms GPU; children 40 + 50 + 5 = 95 ms -> 7 ms of its own.
    # Host: 40 ms; children 10 + 5 + 15 = 30 ms -> 10 ms.
    assert rows["train_step"] == ["102.000", "7.000", "10.000", "-", "100.0%"]
    # forward: 40 ms; attention 22 ms + mlp 10 ms -> 8 ms; 40/102 of its parent and the total.
    assert rows["+- forward"] == ["40.000", "8.000", "2.000", "39.2%", "39.2%"]
    assert rows[":  +- attention"] == ["22.000", "22.000", "4.000", "55.0%", "21.6%"]
    # data is alone on the host clock: 100% of that clock's total.
    assert rows["data"] == ["-", "-", "24.000", "-", "100.0%"]


def test_tree_sort_orders_siblings_only() -> None:
    """Sorting the tree reorders siblings; every child stays right under its parent."""
    by_total = _order(render(gpu_run(), view="tree", fmt="tsv", columns=["region"]))
    assert by_total == [
        "train_step",
        "+- backward",
        "+- forward",
        ":  +- attention",
        ":  +- mlp",
        "+- optimizer",
        "data",
    ]
    by_name = _order(render(gpu_run(), view="tree", fmt="tsv", columns=["region"], sort="name"))
    assert by_name == [
        "data",
        "train_step",
        "+- backward",
        "+- forward",
        ":  +- attention",
        ":  +- mlp",
        "+- optimizer",
    ]


def test_tree_child_without_parent_row_shows_full_path() -> None:
    """A region whose parent has no row (still open, or outside a window) shows its path."""
    s = Summary(regions=(RegionStats("outer/inner", "host", 1, None, Histogram.of([1.0])),))
    assert _order(render(s, view="tree", fmt="tsv", columns=["region"])) == ["outer/inner"]


def test_tree_clamps_overlapping_children_with_note() -> None:
    """Children longer than their parent (concurrent streams) give self 0 and a note."""
    s = Summary(
        regions=(
            RegionStats("p", "cuda:0", 1, Histogram.of([1.0]), Histogram.of([1.0])),
            RegionStats("p/a", "cuda:0", 1, Histogram.of([0.8]), Histogram.of([0.1]), depth=1),
            RegionStats("p/b", "cuda:0", 1, Histogram.of([0.8]), Histogram.of([0.1]), depth=1),
        )
    )
    text = render(s, view="tree", fmt="tsv", columns=["region", "gpu_self"])
    assert _rows(text)["p"] == ["0.000"]
    assert "children of p add up to more than the region itself" in text


# -- flat: sort, filters, columns -----------------------------------------------------------------
@pytest.mark.parametrize(
    ("sort", "first", "last"),
    [
        ("total", "train_step", "train_step/optimizer"),
        ("calls", "train_step/forward/attention", "data"),
        ("mean", "train_step", "train_step/forward/mlp"),
        ("name", "data", "train_step/optimizer"),
        ("order", "train_step", "data"),
    ],
)
def test_flat_sorts(sort: str, first: str, last: str) -> None:
    """Each sort key orders the flat table as documented (total, mean and calls descending)."""
    order = _order(render(gpu_run(), fmt="tsv", sort=sort))
    assert (order[0], order[-1]) == (first, last)


def test_match_glob_and_substring() -> None:
    """match= keeps regions whose path or leaf matches a glob, or whose path contains text."""
    assert _order(render(gpu_run(), fmt="tsv", match="*/forward/*", sort="order")) == [
        "train_step/forward/attention",
        "train_step/forward/mlp",
    ]
    assert _order(render(gpu_run(), fmt="tsv", match="m*", sort="order")) == [
        "train_step/forward/mlp"
    ]
    assert _order(render(gpu_run(), fmt="tsv", match="ward", sort="order")) == [
        "train_step/forward",
        "train_step/forward/attention",  # paths containing the text: forward's subtree too
        "train_step/forward/mlp",
        "train_step/backward",
    ]


def test_match_in_tree_keeps_ancestors_and_notes_hidden() -> None:
    """The tree keeps the ancestors of matching regions and says how many rows it hid."""
    text = render(gpu_run(), view="tree", fmt="tsv", match="mlp", columns=["region"])
    assert _order(text) == ["train_step", "+- forward", ":  +- mlp"]
    assert "4 region(s) hidden by match/min_share" in text


def test_min_share_filters_small_regions() -> None:
    """min_share= keeps regions with at least that fraction of their clock's total."""
    order = _order(render(gpu_run(), fmt="tsv", min_share=0.2, sort="order"))
    # Shares of 102 ms: forward 39%, attention 22%, mlp 9.8%, backward 49%, optimizer 4.9%.
    assert order == [
        "train_step",
        "train_step/forward",
        "train_step/forward/attention",
        "train_step/backward",
        "data",
    ]


def test_no_match_says_so() -> None:
    """Filters that hide every row produce a sentence, not an empty table."""
    assert "no region matches" in render(gpu_run(), match="nothing-like-this")


def test_columns_choose_headers() -> None:
    """columns= shows exactly those columns, in that order."""
    text = render(gpu_run(), fmt="tsv", columns=["calls", "region", "cpu_p90", "per_step"])
    assert [c.strip() for c in text.splitlines()[0].split("\t")] == [
        "calls",
        "region",
        "cpu p90 ms",
        "ms/step",
    ]
    # per_step: total / steps (10 steps): train_step 102 ms -> 10.2 ms per step.
    assert [c.strip() for c in text.splitlines()[1].split("\t")] == [
        "10",
        "train_step",
        "4.000",
        "10.200",
    ]


def test_cpu_only_run_drops_gpu_columns() -> None:
    """With nothing timed on a GPU, host percentiles take the GPU columns' place."""
    header = [c.strip() for c in render(host_run(), fmt="tsv").splitlines()[0].split("\t")]
    assert header == [
        "region",
        "clock",
        "calls",
        "cpu total ms",
        "cpu mean ms",
        "cpu p50 ms",
        "cpu p90 ms",
        "cpu p99 ms",
        "cpu max ms",
    ]


# -- host-bound flag and syncs ---------------------------------------------------------------------
def test_host_bound_flag_and_note() -> None:
    """Regions whose host time is >= HOST_BOUND_RATIO x GPU time are flagged, with a note."""
    text = render(gpu_run(), fmt="tsv", sort="order")
    rows = _rows(text)
    header = [c.strip() for c in text.splitlines()[0].split("\t")]
    bound = header.index("bound") - 1
    assert rows["train_step/optimizer"][bound] == "host"  # 15 ms host vs 5 ms GPU
    assert rows["train_step/backward"][bound] == ""  # 5 ms host vs 50 ms GPU
    assert f"bound=host: host time >= {HOST_BOUND_RATIO:g}x GPU time" in text


def test_host_bound_threshold_is_inclusive() -> None:
    """Exactly the ratio is flagged, just under it is not; no flagged row, no bound column."""

    def region(cpu_ms: float) -> RegionStats:
        return RegionStats("r", "cuda:0", 1, Histogram.of([2.0]), Histogram.of([cpu_ms]))

    at = render(Summary(regions=(region(2.0 * HOST_BOUND_RATIO),)), fmt="tsv")
    under = render(Summary(regions=(region(2.0 * HOST_BOUND_RATIO - 0.01),)), fmt="tsv")
    assert at.splitlines()[0].split("\t")[-1].strip() == "bound"
    assert at.splitlines()[1].split("\t")[-1].strip() == "host"
    assert "bound" not in under


def test_syncs_column_and_sync_sites_table() -> None:
    """A syncs column appears when a region has syncs, and a table of the top sync sites."""
    text = render(gpu_run(), fmt="tsv", sort="order")
    header = [c.strip() for c in text.splitlines()[0].split("\t")]
    assert header[-1] == "syncs"
    assert _rows(text)["train_step/forward/attention"][-1] == "3"
    sites = text.split("top sync sites (host waited for the GPU here)\n")[1].splitlines()
    cells = [[c.strip() for c in line.split("\t")] for line in sites[:2]]
    assert cells[0] == ["location", "kind", "count", "region"]
    assert cells[1] == ["train.py:42", "item", "3", "train_step/forward/attention"]


def test_no_syncs_no_sync_column_or_table() -> None:
    """Without syncs there is neither a syncs column nor a sync-site table."""
    text = render(host_run())
    assert "syncs" not in text and "sync sites" not in text


def test_top_syncs_limits_sites() -> None:
    """top_syncs= caps the sites listed and says how many more there are."""
    text = render(gpu_run(), top_syncs=1)
    assert "train.py:42" in text and "train.py:57" not in text
    assert "... and 1 more site(s)" in text


def test_sync_sites_table_without_region_syncs() -> None:
    """Sync sites alone (every region syncs=0) still get their table."""
    s = Summary(
        regions=(RegionStats("a", "host", 1, None, Histogram.of([1.0])),),
        sync_sites=(SyncSite("x.py:1", "synchronize", "a", 2),),
    )
    assert "x.py:1" in render(s) and "syncs" not in render(s).splitlines()[0]


# -- compare ---------------------------------------------------------------------------------------
def test_compare_verdicts() -> None:
    """compare says 'Nx faster', 'Nx slower', 'same' within tolerance, and 'only in'."""
    base = Summary(
        regions=(
            RegionStats("a", "cuda:0", 2, Histogram.of([2.0, 2.0]), Histogram.of([1.0, 1.0])),
            RegionStats("b", "cuda:0", 1, Histogram.of([1.0]), Histogram.of([1.0])),
            RegionStats("c", "cuda:0", 1, Histogram.of([1.0]), Histogram.of([1.0])),
            RegionStats("gone", "host", 1, None, Histogram.of([1.0])),
        )
    )
    new = Summary(
        regions=(
            RegionStats("a", "cuda:0", 4, Histogram.of([1.0] * 4), Histogram.of([1.0] * 4)),
            RegionStats("b", "cuda:0", 1, Histogram.of([1.5]), Histogram.of([1.0])),
            RegionStats("c", "cuda:0", 1, Histogram.of([1.01]), Histogram.of([1.0])),
            RegionStats("added", "host", 1, None, Histogram.of([1.0])),
        )
    )
    rows = _rows(render_compare(base, new, fmt="tsv"))
    assert rows["a"] == ["cuda:0", "2.000", "1.000", "0.500", "2.00x faster"]  # mean per call
    assert rows["b"][-1] == "1.50x slower"
    assert rows["c"][-1] == "same"
    assert rows["gone"][-1] == "only in base"
    assert rows["added"][-1] == "only in new"
    total = _rows(render_compare(base, new, fmt="tsv", stat="total"))
    assert total["a"][-1] == "same"  # 4 ms in both


def test_compare_rejects_bad_options() -> None:
    """compare names the bad argument: stat, fmt, or per_step without steps."""
    with pytest.raises(ValueError, match="stat must be one of"):
        render_compare(host_run(), host_run(), stat="median")
    with pytest.raises(ValueError, match="fmt must be a tabulate format"):
        render_compare(host_run(), host_run(), fmt="nope")
    with pytest.raises(ValueError, match="per_step"):
        render_compare(Summary(regions=()), host_run(), stat="per_step")


# -- bad input -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("options", "error", "text"),
    [
        ({"view": "graph"}, ValueError, "view must be one of"),
        ({"sort": "speed"}, ValueError, "sort must be one of"),
        ({"fmt": "nope"}, ValueError, "fmt must be a tabulate format"),
        ({"fmt": 3}, TypeError, "fmt must be"),
        ({"min_share": 2.0}, ValueError, "min_share must be between 0 and 1"),
        ({"min_share": "a"}, TypeError, "min_share"),
        ({"columns": ["region", "speed"]}, ValueError, "columns must name some of"),
        ({"columns": "region"}, TypeError, "columns must be a list"),
        ({"match": 3}, TypeError, "match must be"),
        ({"top_syncs": -1}, ValueError, "top_syncs must be >= 0"),
        ({"top_syncs": 1.0}, TypeError, "top_syncs must be an int"),
    ],
)
def test_render_rejects_bad_options(options: dict[str, object], error: type, text: str) -> None:
    """Each bad option raises, naming the argument and what is expected."""
    with pytest.raises(error, match=text):
        render(gpu_run(), **options)  # type: ignore[arg-type]


# -- output: streams and loggers ------------------------------------------------------------------
def test_report_to_file_stream(capsys: pytest.CaptureFixture[str]) -> None:
    """report(file=...) writes the table to that stream and not to stdout."""
    with cudatimer.cuda_region("to-stream"):
        pass
    buf = io.StringIO()
    text = cudatimer.report(file=buf)
    assert buf.getvalue() == text + "\n"
    assert "to-stream" in text
    assert capsys.readouterr().out == ""


def test_report_to_logger(caplog: pytest.LogCaptureFixture) -> None:
    """report(logger=...) logs the whole table as one record at the given level."""
    with cudatimer.cuda_region("to-log"):
        pass
    logger = logging.getLogger("cudatimer-test")
    with caplog.at_level(logging.DEBUG, logger="cudatimer-test"):
        text = cudatimer.report(logger=logger, level=logging.WARNING, view="tree")
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [(logging.WARNING, text)]


def test_report_output_arguments_checked() -> None:
    """file= and logger= together, a path as file, or a non-Logger are refused up front."""
    with pytest.raises(ValueError, match="either file= or logger="):
        cudatimer.report(file=io.StringIO(), logger=logging.getLogger("x"))
    with pytest.raises(TypeError, match="file must be a text stream"):
        cudatimer.report(file="report.txt")
    with pytest.raises(TypeError, match=r"logger must be a logging\.Logger"):
        cudatimer.report(logger="x")


def test_report_of_a_given_summary(capsys: pytest.CaptureFixture[str]) -> None:
    """report(summary=...) renders that Summary (e.g. a loaded run) with the same options."""
    text = cudatimer.report(summary=gpu_run(), view="tree")
    assert text == render(gpu_run(), view="tree")
    assert capsys.readouterr().out == text + "\n"


def test_reading_is_pure(tmp_path: object) -> None:
    """Reports, exports, windows and step series leave the recorded data as it was."""
    t = cudatimer.Timer(name="pure")
    for _ in range(3):
        with t.region("a"), t.region("b"):
            pass
        t.step()
    before = t.summary(step_stats=True, trace=True)
    out = io.StringIO()
    t.report(file=out, view="tree")
    t.report(file=out, last=1)
    t.step_series(warmup=1)
    t.to_csv(io.StringIO(), what="steps")
    t.export_trace(io.StringIO())
    t.save(os.path.join(str(tmp_path), "run.json"))
    t.summary(steps=range(0, 2))
    assert t.summary(step_stats=True, trace=True) == before


# -- report at exit --------------------------------------------------------------------------------
_AT_EXIT_SCRIPT = """
    import cudatimer
    with cudatimer.cuda_region("exit-region"):
        pass
    print("program output")
"""


def test_report_at_exit_opt_in() -> None:
    """CUDATIMER_REPORT_AT_EXIT=1 prints the report on stderr at exit; stdout is untouched."""
    done = run_python(_AT_EXIT_SCRIPT, {"CUDATIMER_REPORT_AT_EXIT": "1"})
    assert done.returncode == 0, done.stderr
    assert done.stdout == "program output\n"
    assert "cudatimer report (timer 'default')" in done.stderr
    assert "exit-region" in done.stderr


def test_no_report_at_exit_by_default() -> None:
    """Without the variable nothing is printed at exit."""
    done = run_python(_AT_EXIT_SCRIPT, {"CUDATIMER_REPORT_AT_EXIT": "0"})
    assert done.returncode == 0, done.stderr
    assert "exit-region" not in done.stderr


def test_report_at_exit_never_hangs() -> None:
    """A daemon thread holding the recorder's lock at exit cannot hang the interpreter (the
    Python core has a lock; the C core has none to hold)."""
    code = """
        import threading, time
        import cudatimer, cudatimer.core._core_py, cudatimer.features._exit
        cudatimer.features._exit.EXIT_TIMEOUT_S = 0.5
        with cudatimer.cuda_region("stuck"):
            pass
        held = threading.Event()
        def hold():
            with cudatimer.core._core_py._LOCK:
                held.set()
                time.sleep(3600)
        threading.Thread(target=hold, daemon=True).start()
        held.wait()
    """
    done = run_python(code, {"CUDATIMER_REPORT_AT_EXIT": "1", "CUDATIMER_PURE_PYTHON": "1"})
    assert done.returncode == 0, done.stderr
    assert "did not finish within 0.5 s" in done.stderr


def test_report_takes_the_table_options_of_the_renderer() -> None:
    """report()'s options are its window, its target and exactly the keyword options of render()."""
    import inspect

    from cudatimer.regions import _output

    table = [name for name in inspect.signature(render).parameters if name != "summary"]
    own = [
        name
        for name in _output.ReportOptions.__annotations__
        if name not in _output.TraceOptions.__annotations__
    ]
    assert own == ["file", "logger", "level", *table]
    with pytest.raises(TypeError, match=r"^report\(\) got unknown option\(s\) colour; its options"):
        cudatimer.report(colour="red")


def _two_ranks_of_25_ms_a_step() -> cudatimer.Summary:
    """Two ranks of 4 steps, each of 25 ms a step in "step", folded into one Summary (as
    ``merge --flat`` writes it)."""
    from cudatimer.records._ranks import RankSummary

    rank = Summary(
        regions=(
            RegionStats("step", "cuda:0", 4, Histogram.of([25.0] * 4), Histogram.of([1.0] * 4)),
        ),
        steps=4,
    )
    return RankSummary((0, 1), (rank, rank)).merged()


def test_a_folded_cross_rank_run_shows_ms_per_step_per_rank() -> None:
    """ms/step of ranks folded together is per rank and says so (25, not the sum 50), with a
    note that names how it is computed; one process's run keeps its plain ms/step."""
    folded = _two_ranks_of_25_ms_a_step()
    text = render(folded, columns=["region", "gpu_total", "per_step"], fmt="plain")
    header, row = text.splitlines()[:2]
    assert header.split()[-1] == "ms/step/rank"
    assert row.split() == ["step", "200.000", "25.000"]
    assert (
        "note: ms/step/rank: a region's time per step on one rank, the mean over the 2 ranks"
        in text
    )
    single = dataclasses.replace(folded, meta=())
    plain = render(single, columns=["region", "per_step"], fmt="plain")
    assert plain.splitlines()[0].split() == ["region", "ms/step"]
    assert plain.splitlines()[1].split() == ["step", "50.000"] and "ms/step/rank" not in plain
