"""The HTML report as text: what the page holds, that user text cannot break out of its data
block, that its size is bounded, and the API and `cudatimer html` around it (the page in a
browser: tests/reports/test_html_browser.py)."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import io
import json
import re
from pathlib import Path
from typing import Any

import pytest

import cudatimer
from cudatimer import Histogram, RegionStats, StepStats, Summary
from cudatimer._cli import main
from cudatimer.distributed import save_ranks
from cudatimer.records._ranks import RankSummary
from cudatimer.render._export import save
from cudatimer.render._html import CHART_STEPS, render_html
from tests.helpers.report_fixtures import gpu_run, gpu_run_after, host_run

DATA = re.compile(r'<script type="application/json" id="cudatimer-data">(.*?)</script>', re.S)
HOSTILE = (
    "</script><script>window.pwned=1</script><!-- \"quoted\" & 'single' \u00fc\u2028 \U0001f600"
)


def data_of(page: str) -> dict[str, Any]:
    """The JSON document the page embeds."""
    found = DATA.search(page)
    assert found, "no data block"
    doc: dict[str, Any] = json.loads(found.group(1))
    return doc


def names(table: dict[str, Any]) -> list[str]:
    return [row[2] for row in table["rows"]]


def test_page_holds_the_regions_with_gpu_and_cpu_time() -> None:
    """The run's regions are in the page's data, each with GPU and CPU totals, nested."""
    doc = data_of(render_html(gpu_run()))
    (run,) = doc["runs"]
    table = run["regions"]
    assert names(table) == [r.name for r in gpu_run().regions]
    keys = [c[0] for c in table["columns"]]
    assert keys[:5] == ["region", "clock", "calls", "gpu_total", "cpu_total"]
    row = table["rows"][names(table).index("train_step/forward/attention")]
    assert row[4:9] == ["attention", "cuda:0", 40, 22.0, 4.0]
    parent = names(table)[row[0]]
    assert parent == "train_step/forward" and row[1] == 2  # its parent, and its level
    assert run["syncs"]["rows"][0][4:] == ["train.py:42", "item", 3, "train_step/forward/attention"]
    assert any("bound=host" in note for note in run["notes"])


def test_host_only_run_has_no_gpu_columns() -> None:
    """Where nothing ran on a GPU the GPU columns are left out, as in the text report."""
    table = data_of(render_html(host_run()))["runs"][0]["regions"]
    assert not [c for c in table["columns"] if c[0].startswith("gpu_")]


def test_page_needs_no_network_and_runs_only_its_own_script() -> None:
    """No src/href/@import/url() in the page, and its policy allows only its script's hash."""
    page = render_html(gpu_run())
    assert not re.search(r"\b(src|href)\s*=|@import|url\(", page, re.I)
    script = page.rsplit("<script>", 1)[1].split("</script>", 1)[0]
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    assert f"default-src 'none'; style-src 'unsafe-inline'; script-src 'sha256-{digest}'" in page


def test_user_text_cannot_leave_the_data_block() -> None:
    """A region named </script><script>... stays inside the JSON, which gives it back exactly."""
    hostile = Summary(
        regions=(RegionStats(HOSTILE, "host", 1, None, Histogram.of([1.0])),),
        meta=(("timer", HOSTILE),),
    )
    page = render_html(hostile, title=HOSTILE)
    assert page.count("</script>") == 2  # the data block's end and the script's end
    assert "<script>window.pwned" not in page and "<!--" not in page
    assert page.isascii()
    assert names(data_of(page)["runs"][0]["regions"]) == [HOSTILE]
    assert "<title>&lt;/script&gt;&lt;script&gt;" in page


def test_page_is_the_same_for_the_same_run() -> None:
    """Rendering twice gives the same page (no clock, no random ids), and the run is unchanged."""
    run = gpu_run()
    before = dataclasses.replace(run)
    assert render_html(run) == render_html(run)
    assert run == before


def _long_run(steps: int, regions: int) -> Summary:
    names_ = [f"r{i}" for i in range(regions)]
    records = tuple(
        RegionStats(n, "host", steps, None, Histogram.of([float(i + 1)] * steps))
        for i, n in enumerate(names_)
    )
    rows = tuple(
        StepStats(k, n, "host", 1, None, float(i + 1) + k * 1e-3)
        for k in range(steps)
        for i, n in enumerate(names_)
    )
    return Summary(regions=records, steps=steps, step_stats=rows)


def test_chart_covers_the_top_regions_only() -> None:
    """The per-step chart holds the `top` regions by time, one rounded value per step."""
    chart = data_of(render_html(_long_run(50, 12), top=3))["runs"][0]["chart"]
    assert [s["name"] for s in chart["series"]] == ["r11", "r10", "r9"]
    assert chart["steps"] == list(range(50))
    assert chart["series"][0]["values"][7] == 12.01  # 12.007 to 4 significant digits
    assert chart["unit"] == "host ms" and chart["note"] == ""


def test_chart_of_a_long_run_averages_consecutive_steps() -> None:
    """Past CHART_STEPS steps each point is the mean of a few steps, and the chart says so."""
    chart = data_of(render_html(_long_run(2 * CHART_STEPS + 1, 1)))["runs"][0]["chart"]
    assert len(chart["steps"]) == -(-(2 * CHART_STEPS + 1) // 3) <= CHART_STEPS
    assert chart["steps"][:2] == [0, 3]
    assert chart["series"][0]["values"][1] == pytest.approx(1.004, abs=1e-3)  # steps 3-5
    assert "mean of 3 consecutive steps" in chart["note"]


def test_no_chart_without_two_steps() -> None:
    """A run with fewer than 2 steps of per-step data draws no chart."""
    assert data_of(render_html(host_run()))["runs"][0]["chart"] is None


def test_comparison_page() -> None:
    """With base=, the page leads with the comparison of `cudatimer compare`, then both runs."""
    doc = data_of(render_html(gpu_run_after(), base=gpu_run(), stat="mean"))
    table = doc["compare"]
    change = {row[2]: row[-1] for row in table["rows"]}
    assert change["train_step/forward/attention"] == "2.00x faster"
    assert change["train_step/forward/mlp"] == "1.50x slower"
    assert change["data"] == "only in base"
    assert [r["label"] for r in doc["runs"]] == ["new", "base"]
    classes = {row[2]: row[3] for row in table["rows"]}
    assert classes["train_step/forward/attention"] == "faster"


def test_cross_rank_page() -> None:
    """A RankSummary's page has the cross-rank table and the tree of all ranks folded."""
    ranked = RankSummary((0, 1), (gpu_run(), gpu_run_after()))
    doc = data_of(render_html(ranked))
    table = doc["ranks"]
    row = table["rows"][names(table).index("train_step/forward/rope")]
    assert row[4:8] == ["rope", "cuda", "1/2 (not on 0)", 10]
    assert names(doc["runs"][0]["regions"]) == [r.name for r in ranked.merged().regions]


def test_deep_nesting_is_capped_in_indent() -> None:
    """A region nested 3000 deep renders; indent stops at 24 levels and the label says the level."""
    path = "/".join(f"n{i}" for i in range(3000))
    regions = tuple(
        RegionStats(
            path[: path.index(f"n{i}") + len(f"n{i}")], "host", 1, None, Histogram.of([1.0])
        )
        for i in range(3000)
    )
    rows = data_of(render_html(Summary(regions=regions)))["runs"][0]["regions"]["rows"]
    assert rows[-1][0] == 2998 and rows[-1][1] == 24 and rows[-1][4] == "[level 2999] n2999"


@pytest.mark.parametrize(
    ("kwargs", "error", "text"),
    [
        ({"run": "run.json"}, TypeError, "run must be a cudatimer.Summary"),
        ({"top": 0}, ValueError, "top must be >= 1"),
        ({"top": True}, TypeError, "top must be an int"),
        ({"base": "a.json"}, TypeError, "base must be a cudatimer.Summary"),
        ({"stat": "median"}, ValueError, "stat must be one of"),
        ({"title": 3}, TypeError, "title must be a str"),
        ({"base": Summary(()), "tolerance": -1.0}, ValueError, "tolerance must be a fraction"),
        ({"labels": ("a",)}, TypeError, "labels must be a tuple of two"),
    ],
)
def test_bad_arguments_are_named(kwargs: dict[str, Any], error: type, text: str) -> None:
    """Bad arguments raise TypeError/ValueError naming the argument."""
    run = kwargs.pop("run", gpu_run())
    with pytest.raises(error, match=text):
        render_html(run, **kwargs)


def test_cross_rank_run_is_not_compared() -> None:
    """base= with a RankSummary is refused with what to do instead."""
    with pytest.raises(ValueError, match="merge --flat"):
        render_html(RankSummary((0,), (gpu_run(),)), base=gpu_run())


# -- the API ---------------------------------------------------------------------------------
def _three_steps(timer: cudatimer.Timer) -> None:
    for _ in range(3):
        with timer.region("step"), timer.region("inner"):
            pass
        timer.step()


def test_timer_html_writes_its_own_run(tmp_path: Path) -> None:
    """Timer.html(path, warmup=1) writes the page of its window, with the per-step chart."""
    timer = cudatimer.Timer(name="html")
    _three_steps(timer)
    timer.html(tmp_path / "sub" / "r.html", warmup=1)
    doc = data_of((tmp_path / "sub" / "r.html").read_text())
    assert names(doc["runs"][0]["regions"]) == ["step", "step/inner"]
    assert doc["runs"][0]["chart"]["steps"] == [1, 2]
    assert ["timer", "html"] in doc["runs"][0]["meta"]


def test_module_html_with_summary_and_base() -> None:
    """cudatimer.html(stream, summary=..., base=...) writes the comparison to a text stream."""
    out = io.StringIO()
    cudatimer.html(out, summary=gpu_run_after(), base=gpu_run(), title="A/B")
    page = out.getvalue()
    assert "<h1>A/B</h1>" in page and data_of(page)["compare"] is not None


def test_module_html_of_the_default_timer(tmp_path: Path) -> None:
    """cudatimer.html(path) renders the default Timer's regions."""
    _three_steps(cudatimer.default_timer())
    cudatimer.html(tmp_path / "r.html")
    assert names(data_of((tmp_path / "r.html").read_text())["runs"][0]["regions"]) == [
        "step",
        "step/inner",
    ]


def test_html_window_without_steps_and_window_with_summary_are_refused(tmp_path: Path) -> None:
    """A window holding no finished step, or a window with summary=, is refused naming why."""
    timer = cudatimer.Timer(name="nosteps")
    with timer.region("x"):
        pass
    with pytest.raises(ValueError, match=r"html\(warmup=1\): the window holds no step: "):
        timer.html(tmp_path / "r.html", warmup=1)
    with pytest.raises(TypeError, match="a window applies to a Timer's own results"):
        timer.html(tmp_path / "r.html", summary=RankSummary((0,), (gpu_run(),)), last=2)
    assert not (tmp_path / "r.html").exists()


# -- the command -----------------------------------------------------------------------------
@pytest.fixture
def runs(tmp_path: Path) -> dict[str, Path]:
    paths = {"gpu": tmp_path / "gpu.json", "after": tmp_path / "after.json"}
    save(gpu_run(), paths["gpu"])
    save(gpu_run_after(), paths["after"])
    paths["ranks"] = tmp_path / "ranks.json"
    save_ranks(RankSummary((0, 1), (gpu_run(), gpu_run_after())), paths["ranks"])
    return paths


def test_cli_html_writes_the_page(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`cudatimer html RUN.json` writes RUN.html, the page render_html gives, titled with the
    file's name; -o and --top too."""
    assert main(["html", str(runs["gpu"])]) == 0
    assert capsys.readouterr().out == f"wrote {tmp_path / 'gpu.html'}\n"
    page = (tmp_path / "gpu.html").read_text()
    assert page == render_html(gpu_run(), title=f"cudatimer: {runs['gpu']}")
    assert f"<title>cudatimer: {runs['gpu']}</title>" in page
    assert main(["html", str(runs["gpu"]), "--title", "mine", "-o", str(tmp_path / "t.html")]) == 0
    assert "<title>mine</title>" in (tmp_path / "t.html").read_text()
    assert main(["html", str(runs["gpu"]), "-o", str(tmp_path / "o.html"), "--top", "1"]) == 0
    assert len(data_of((tmp_path / "o.html").read_text())["runs"][0]["chart"]["series"]) == 1


def test_cli_html_of_two_runs_compares_them(runs: dict[str, Path], tmp_path: Path) -> None:
    """`cudatimer html BASE.json NEW.json` writes NEW-vs-BASE.html, the comparison."""
    assert main(["html", str(runs["gpu"]), str(runs["after"]), "--stat", "total"]) == 0
    doc = data_of((tmp_path / "after-vs-gpu.html").read_text())
    assert doc["compare"]["columns"][2][1] == "base total ms"


def test_cli_html_of_a_cross_rank_file(runs: dict[str, Path], tmp_path: Path) -> None:
    """`cudatimer html merged.json` of a cross-rank file leads with the cross-rank table."""
    assert main(["html", str(runs["ranks"])]) == 0
    assert data_of((tmp_path / "ranks.html").read_text())["ranks"]["rows"]


@pytest.mark.parametrize(
    "args",
    [["a.json", "b.json", "c.json"], ["a.json", "--top", "0"], ["a.json", "--tolerance", "-1"]],
)
def test_cli_html_bad_command_line_exits_2(
    args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Three files, --top 0 or a negative tolerance are a bad command line (exit 2)."""
    with pytest.raises(SystemExit) as stop:
        main(["html", *args])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "html" in err and ("3 files" in err or "--top" in err or "tolerance" in err)


def test_cli_html_unreadable_or_unwritable_exits_1(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A missing run, a cross-rank file to compare, or an unwritable output exit 1 naming it."""
    assert main(["html", str(tmp_path / "missing.json")]) == 1
    assert "missing.json" in capsys.readouterr().err
    assert main(["html", str(runs["ranks"]), str(runs["gpu"])]) == 1
    assert "cross-rank file" in capsys.readouterr().err
    (tmp_path / "file").write_text("")
    assert main(["html", str(runs["gpu"]), "-o", str(tmp_path / "file" / "r.html")]) == 1
    assert "file" in capsys.readouterr().err


def test_chart_leaves_out_top_regions_without_steps() -> None:
    """A top region with no per-step rows draws no line (and no legend entry)."""
    run = _long_run(5, 3)
    run = dataclasses.replace(run, step_stats=tuple(s for s in run.step_stats if s.name != "r2"))
    chart = data_of(render_html(run))["runs"][0]["chart"]
    assert [s["name"] for s in chart["series"]] == ["r1", "r0"]


def test_the_cross_rank_page_shows_ms_per_step_per_rank() -> None:
    """The cross-rank page's tree of all ranks folded together has ms/step per rank, titled
    so, with the note saying how it is computed."""
    rank = Summary(
        regions=(
            RegionStats("step", "cuda:0", 4, Histogram.of([25.0] * 4), Histogram.of([1.0] * 4)),
        ),
        steps=4,
    )
    folded = data_of(render_html(RankSummary((0, 1), (rank, rank))))["runs"][0]
    columns = [c[1] for c in folded["regions"]["columns"]]
    assert "ms/step/rank" in columns and "ms/step" not in columns
    row = folded["regions"]["rows"][0]
    assert row[4 + columns.index("ms/step/rank")] == 25.0  # after parent, level, title, class
    assert any(
        n.startswith("ms/step/rank: a region's time per step on one rank") for n in folded["notes"]
    )
    single = data_of(render_html(rank))["runs"][0]
    assert "ms/step" in [c[1] for c in single["regions"]["columns"]]
