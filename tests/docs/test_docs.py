"""The README stays a five-minute page, and figures quoted outside docs/benchmarks.md agree
with it."""

from __future__ import annotations

import re
from pathlib import Path

import cudatimer
from tests.helpers.docs_blocks import ROOT, documents


def test_readme_is_short() -> None:
    """The README is well under 200 lines; the rest lives in docs/."""
    assert len((ROOT / "README.md").read_text().splitlines()) < 150


def test_docs_links_resolve() -> None:
    """Every relative Markdown link of the README and docs names a file that exists."""
    for path in documents():
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", path.read_text()):
            assert (path.parent / target).exists(), f"{path.name}: broken link {target}"


def test_readme_quickstart_is_a_python_block() -> None:
    """The README's Quickstart is a fenced python block (so the snippet test runs it) that
    prints the report."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Quickstart") :]
    block = re.search(r"^```python\n(.*?)^```$", section, re.S | re.M)
    assert block, "the Quickstart has no ```python block"
    assert "cudatimer.report()" in block.group(1)


def test_python_core_figure_matches_benchmarks() -> None:
    """The report's note on the Python core quotes the ratio docs/benchmarks.md measured."""
    bench = " ".join((ROOT / "docs" / "benchmarks.md").read_text().split())
    measured = re.search(r"costs \*\*(\d+\.\d+)x\*\* the C core per region", bench)
    assert measured, "docs/benchmarks.md no longer states the Python core's ratio"
    source = (Path(cudatimer.__file__).resolve().parent / "regions" / "_timer.py").read_text()
    quoted = re.search(r"about (\d+\.\d+)x the C core's cost per region", source)
    assert quoted and round(float(measured.group(1)), 1) == float(quoted.group(1))


def test_docs_cite_no_name_inside_a_private_module() -> None:
    """Docs name public things only: no ``cudatimer.<...>._module.NAME`` a user cannot rely on."""
    for path in documents():
        cited = re.findall(r"cudatimer\.(?:\w+\.)*_\w+\.\w+", path.read_text())
        assert cited == [], f"{path.name} cites private names: {cited}"


def test_documented_limits_match_the_code() -> None:
    """reports.md states the host-bound ratio and the step and chart caps as the code has them."""
    from cudatimer.recorder._steps import STEP_SAMPLE_CAP
    from cudatimer.render._html import CHART_STEPS
    from cudatimer.render._report import HOST_BOUND_RATIO

    text = " ".join((ROOT / "docs" / "reports.md").read_text().split())
    assert f"at least **{HOST_BOUND_RATIO:g} times** its GPU time" in text
    assert f"A step keeps at most {STEP_SAMPLE_CAP} raw samples" in text
    assert CHART_STEPS == 10**4 and "Past 10^4 steps each point is the mean" in text


def test_coverage_is_exported_and_documented() -> None:
    """``Coverage``, which ``Summary.backward_coverage`` returns, is public and in docs/api.md."""
    import cudatimer
    from cudatimer.records import _records

    assert "Coverage" in cudatimer.__all__ and cudatimer.Coverage is _records.Coverage
    assert "`Coverage`" in (ROOT / "docs" / "api.md").read_text()
