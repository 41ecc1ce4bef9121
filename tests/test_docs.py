"""The README stays a five-minute page, and figures quoted outside docs/benchmarks.md agree
with it."""

from __future__ import annotations

import re

from tests.docs_blocks import ROOT, documents


def test_readme_is_short() -> None:
    """The README is well under 200 lines; the rest lives in docs/."""
    assert len((ROOT / "README.md").read_text().splitlines()) < 170


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
    source = (ROOT / "cudatimer" / "regions" / "_timer.py").read_text()
    quoted = re.search(r"about (\d+\.\d+)x the C core's cost per region", source)
    assert quoted and round(float(measured.group(1)), 1) == float(quoted.group(1))
