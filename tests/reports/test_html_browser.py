"""The HTML report in a real headless Chromium (tests/helpers/browser.py): it opens without errors
or requests, shows the regions, sorts, collapses, draws the chart, and user text stays text.

One browser serves the whole module (a start costs ~1 s); each test opens its page in a new
tab. Without Chromium the tests skip, saying how to install it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cudatimer import Histogram, RegionStats, StepStats, Summary
from cudatimer.records._ranks import RankSummary
from cudatimer.render._html import write_html
from tests.helpers.browser import INSTALL_HINT, Browser, Page, find_chromium
from tests.helpers.report_fixtures import gpu_run, gpu_run_after
from tests.reports.test_html import HOSTILE

EXECUTABLE = find_chromium()
pytestmark = pytest.mark.skipif(EXECUTABLE is None, reason=INSTALL_HINT)

REGIONS = "table[data-table=regions]"
# Each visible row's label (leaf name) of a table, top to bottom.
LABELS = (
    "[...document.querySelectorAll({table!r} + ' tbody tr')]"
    ".filter((tr) => !tr.hidden).map((tr) => tr.querySelector('.name').textContent)"
)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    assert EXECUTABLE is not None
    started = Browser.start(EXECUTABLE, tmp_path_factory.mktemp("chromium"))
    yield started
    started.close()


def open_page(
    browser: Browser, run: Summary | RankSummary, folder: Path, **options: object
) -> Page:
    path = folder / "report.html"
    write_html(run, path, **options)  # type: ignore[arg-type]
    page = browser.open(path.resolve().as_uri())
    assert page.evaluate("document.documentElement.dataset.ready") == "1", page.errors
    return page


def labels(page: Page, table: str = REGIONS) -> list[str]:
    shown: list[str] = page.evaluate(LABELS.format(table=table))
    return shown


def test_opens_without_errors_or_requests(browser: Browser, tmp_path: Path) -> None:
    """The page loads with no console error and requests nothing but its own file."""
    page = open_page(browser, gpu_run(), tmp_path)
    assert page.errors == []
    assert page.requests == [(tmp_path / "report.html").resolve().as_uri()]


def test_shows_the_regions_of_the_run(browser: Browser, tmp_path: Path) -> None:
    """The tree lists the run's regions by GPU total, with GPU and CPU totals side by side."""
    page = open_page(browser, gpu_run(), tmp_path)
    assert labels(page) == [
        "train_step",
        "backward",
        "forward",
        "attention",
        "mlp",
        "optimizer",
        "data",
    ]
    headers = page.evaluate(
        f"[...document.querySelectorAll('{REGIONS} th')].map((th) => th.textContent)"
    )
    assert headers[3:5] == ["GPU total ms", "CPU total ms"]
    first = f"{REGIONS} tr[data-row='0']"
    row = page.evaluate(f'[...document.querySelector("{first}").cells].map((td) => td.textContent)')
    assert row[1:5] == ["cuda:0", "10", "102.000", "40.000"]
    syncs = page.evaluate("document.querySelector('table[data-table=syncs] tbody').textContent")
    assert "train.py:42" in syncs


def test_clicking_a_header_sorts_siblings(browser: Browser, tmp_path: Path) -> None:
    """A header click reorders rows within their parent; a second click reverses the order."""
    page = open_page(browser, gpu_run(), tmp_path)
    page.click(f"{REGIONS} th[data-key=cpu_total]")
    assert labels(page) == [
        "train_step",
        "optimizer",
        "forward",
        "attention",
        "mlp",
        "backward",
        "data",
    ]
    assert (
        page.evaluate(f"document.querySelector('{REGIONS} th[data-key=cpu_total]').ariaSort")
        == "descending"
    )
    page.click(f"{REGIONS} th[data-key=cpu_total]")
    assert labels(page) == [
        "data",
        "train_step",
        "backward",
        "forward",
        "attention",
        "mlp",
        "optimizer",
    ]
    page.click(f"{REGIONS} th[data-key=region]")  # text sorts A-Z first
    assert labels(page) == [
        "data",
        "train_step",
        "backward",
        "forward",
        "attention",
        "mlp",
        "optimizer",
    ]
    page.click(f"{REGIONS} th[data-key=region]")
    assert labels(page) == [
        "train_step",
        "optimizer",
        "forward",
        "mlp",
        "attention",
        "backward",
        "data",
    ]


def test_collapsing_a_node_hides_its_children(browser: Browser, tmp_path: Path) -> None:
    """Collapsing hides a node's descendants (and only those); expanding brings them back."""
    page = open_page(browser, gpu_run(), tmp_path)
    forward = f'{REGIONS} tr[data-row="1"] button.toggle'
    page.click(forward)
    assert labels(page) == ["train_step", "backward", "forward", "optimizer", "data"]
    page.click(f'{REGIONS} tr[data-row="0"] button.toggle')
    assert labels(page) == ["train_step", "data"]
    page.click(f'{REGIONS} tr[data-row="0"] button.toggle')
    assert labels(page) == [
        "train_step",
        "backward",
        "forward",
        "optimizer",
        "data",
    ]  # forward stays shut
    assert page.evaluate(f"document.querySelector('{forward}').ariaExpanded") == "false"
    page.click("button[data-action=expand]")
    assert len(labels(page)) == 7
    page.click("button[data-action=collapse]")
    assert labels(page) == ["train_step", "data"]


def test_filter_keeps_matches_and_their_ancestors(browser: Browser, tmp_path: Path) -> None:
    """Typing in the filter box keeps the rows whose path matches (any case), with parents."""
    page = open_page(browser, gpu_run(), tmp_path)
    page.evaluate(
        "(() => { const box = document.querySelector('.tablebox input');"
        " box.value = 'ATTEN';"
        " box.dispatchEvent(new Event('input')); })()"
    )
    assert labels(page) == ["train_step", "forward", "attention"]


def _stepped() -> Summary:
    regions = (
        RegionStats("step", "host", 20, None, Histogram.of([3.0] * 20)),
        RegionStats("step/a", "host", 20, None, Histogram.of([2.0] * 20), depth=1),
        RegionStats("step/b", "host", 20, None, Histogram.of([1.0] * 20), depth=1),
    )
    rows = tuple(
        StepStats(k, name, "host", 1, None, ms + 0.1 * (k % 3))
        for k in range(20)
        for name, ms in (("step", 3.0), ("step/a", 2.0), ("step/b", 1.0))
    )
    return Summary(regions=regions, steps=20, step_stats=rows)


def test_chart_draws_a_line_per_top_region_and_the_legend_toggles_it(
    browser: Browser, tmp_path: Path
) -> None:
    """The chart has one line per top region; a legend click hides that line and back."""
    page = open_page(browser, _stepped(), tmp_path, top=2)
    lines = "[...document.querySelectorAll('svg.chart path.series')].map((p) => p.dataset.name)"
    assert page.evaluate(lines) == ["step", "step/a"]
    assert page.evaluate("document.querySelector('svg.chart path.series').getTotalLength() > 100")
    page.click(".legend button")
    assert page.evaluate(lines) == ["step/a"]
    page.click(".legend button")
    assert page.evaluate(lines) == ["step", "step/a"]
    assert page.errors == []


def test_hostile_region_names_stay_text(browser: Browser, tmp_path: Path) -> None:
    """A region named </script><script>... shows as its text; no script of it runs."""
    hostile = Summary(
        regions=(
            RegionStats(HOSTILE, "host", 1, None, Histogram.of([1.0])),
            RegionStats(
                '<img src=x onerror="window.pwned=2">', "host", 1, None, Histogram.of([2.0])
            ),
        ),
        meta=(("timer", HOSTILE),),
    )
    page = open_page(browser, hostile, tmp_path, title=HOSTILE)
    assert page.evaluate("window.pwned === undefined")
    assert page.evaluate("document.title") == HOSTILE
    assert sorted(labels(page)) == sorted(r.name for r in hostile.regions)
    assert page.errors == []
    assert page.requests == [(tmp_path / "report.html").resolve().as_uri()]  # no img loaded


def test_comparison_and_cross_rank_pages_open(browser: Browser, tmp_path: Path) -> None:
    """The comparison page shows the verdicts; the cross-rank page its table; no errors."""
    page = open_page(browser, gpu_run_after(), tmp_path, base=gpu_run())
    text = page.evaluate("document.querySelector('table[data-table=compare]').textContent")
    assert "2.00x faster" in text and "1.50x slower" in text and "only in base" in text
    assert page.evaluate("document.querySelectorAll('table[data-table=regions]').length") == 2
    assert page.errors == []
    page = open_page(browser, RankSummary((0, 1), (gpu_run(), gpu_run_after())), tmp_path)
    assert "rope" in labels(page, "table[data-table=ranks]")
    assert page.errors == []


def test_a_tree_3000_deep_renders(browser: Browser, tmp_path: Path) -> None:
    """A run nested 3000 deep opens, every row present, and collapses from its root."""
    path = "/".join(f"n{i}" for i in range(3000))
    cut = [i for i, ch in enumerate(path) if ch == "/"] + [len(path)]
    deep = Summary(
        regions=tuple(RegionStats(path[:end], "host", 1, None, Histogram.of([1.0])) for end in cut)
    )
    page = open_page(browser, deep, tmp_path)
    assert len(labels(page)) == 3000
    page.click(f'{REGIONS} tr[data-row="0"] button.toggle')
    assert labels(page) == ["n0"]
    assert page.errors == []


def _gpt2_rank(scale: float, steps: int = 200) -> Summary:
    """One rank of a GPT-2-small training loop instrumented to depth 6, 200 steps."""
    paths = ["train_step", "train_step/forward", "train_step/forward/GPT2LMHeadModel"]
    paths.append("train_step/forward/GPT2LMHeadModel/transformer")
    for i in range(12):
        block = f"train_step/forward/GPT2LMHeadModel/transformer/h.{i}"
        paths += [block, f"{block}/attn", f"{block}/attn/c_attn", f"{block}/mlp"]
    paths += ["train_step/backward", "train_step/optimizer"]
    regions = []
    for path in paths:
        depth = path.count("/")
        ms = scale * 250.0 / 2**depth
        gpu, cpu = Histogram.of([ms] * steps), Histogram.of([0.4 * ms] * steps)
        regions.append(RegionStats(path, "cuda:0", steps * (1 + depth), gpu, cpu, depth=depth))
    return Summary(regions=tuple(regions), steps=steps)


def test_the_cross_rank_table_fits_a_1400_px_window(browser: Browser, tmp_path: Path) -> None:
    """In a 1400-px window the cross-rank table of a GPT-2 run needs no horizontal scroll:
    its last column (p99) is in view."""
    page = open_page(browser, RankSummary((0, 1), (_gpt2_rank(1.0), _gpt2_rank(1.13))), tmp_path)
    metrics = {"width": 1400, "height": 900, "deviceScaleFactor": 1, "mobile": False}
    browser.send("Emulation.setDeviceMetricsOverride", metrics, session=page.session)
    table = "table[data-table=ranks]"
    wrap = page.evaluate(
        f"(() => {{ const w = document.querySelector('{table}').closest('.tablewrap');"
        " return [w.scrollWidth, w.clientWidth]; })()"
    )
    assert wrap[0] <= wrap[1], wrap
    last = page.evaluate(
        f"(() => {{ const th = [...document.querySelectorAll('{table} th')].pop();"
        " return [th.textContent, th.getBoundingClientRect().right,"
        " document.documentElement.clientWidth]; })()"
    )
    assert last[0].startswith("p99") and last[1] <= last[2], last
