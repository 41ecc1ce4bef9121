"""The README stays a five-minute page, figures quoted outside docs/benchmarks.md agree with
it, and the docs hold no trap for a new reader: no internal words, terms defined where they
first appear, visible notes on what a snippet needs, lists that match the code."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import tomllib

import cudatimer
from tests.helpers.docs_blocks import ROOT, Block, blocks, documents


def test_readme_is_short() -> None:
    """The README is well under 200 lines; the rest lives in docs/."""
    assert len((ROOT / "README.md").read_text().splitlines()) < 190


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


#: Words about how the project was made, not about what it does: a user cannot know "the
#: redesign" or "RESULTS section R". (CHANGELOG.md, a history, and benchmarks/RESULTS.md, the
#: lab notebook, are not checked.)
INTERNAL_WORDS = (
    "the redesign",
    "recorder redesign",
    "before the redesign",
    "the issue",
    "RESULTS section",
    "machine start",
    "this session",
    "first session",
    "second session",
    "third session",
    "fourth session",
)


def _prose_and_code_files() -> list[Path]:
    code = [*sorted((ROOT / "cudatimer").rglob("*.py")), *sorted((ROOT / "examples").glob("*.py"))]
    return [*documents(), *code]


def test_no_internal_words_in_docs_or_code() -> None:
    """The README, docs/*.md, the package and the examples use none of ``INTERNAL_WORDS``, cite
    no section letter of benchmarks/RESULTS.md and, in the docs, no issue number."""
    found = []
    for path in _prose_and_code_files():
        text = " ".join(path.read_text().split())  # a phrase broken across lines counts
        for word in INTERNAL_WORDS:
            if word.lower() in text.lower():
                found.append(f"{path.relative_to(ROOT)}: {word!r}")
        if re.search(r"\bsections? [A-Z]\b(?! of)", text) and "RESULTS" in text:
            found.append(f"{path.relative_to(ROOT)}: a RESULTS section letter")
        if path.suffix == ".md" and re.search(r"(?<![\w/&(])#\d+\b", text):
            found.append(f"{path.relative_to(ROOT)}: an issue number")
    assert found == []


def _prose(text: str) -> str:
    """``text`` without fenced blocks, inline code and HTML comments: what a reader reads."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    return re.sub(r"`[^`]*`", "", text)


#: Terms of the docs a new reader cannot guess, as nouns (group 2), with the asterisks of an
#: italic definition around them (groups 1 and 3); "marks a step" is a verb, not the term.
TERMS = {
    "floor": r"(\*?)\b(floors?)\b(\*?)",
    "marks": r"(?:\b(?:the|its|their|two|each|an?|enter|exit|whose|these|region's)\s+)(\*?)"
    r"(marks?)\b(\*?)",
}


def test_terms_are_defined_where_they_first_appear() -> None:
    """On every page that uses "floor" or "marks", the first use is the italic definition."""
    checked = 0
    for path in documents():
        prose = " ".join(_prose(path.read_text()).split())
        for term, pattern in TERMS.items():
            first = re.search(pattern, prose, flags=re.I)
            if first is None:
                continue
            checked += 1
            context = prose[max(0, first.start() - 60) : first.end() + 20]
            assert first.group(1) == first.group(3) == "*", (
                f"{path.name}: the first {term!r} is not its italic definition: {context!r}"
            )
    assert checked >= 4  # benchmarks.md's floor; compile.md's, api.md's and design.md's marks


def _section_before(block: Block) -> str:
    """The prose of ``block``'s section (from its last heading) up to the block."""
    lines = block.path.read_text().splitlines()[: block.line - 1]
    start, fenced = 0, False
    for i, line in enumerate(lines):
        fenced ^= line.startswith("```")
        if not fenced and line.startswith("#"):
            start = i
    return _prose("\n".join(lines[start:]))


def test_what_a_snippet_needs_is_said_in_visible_text() -> None:
    """A block marked ``gpu`` has "needs a GPU" (or "needs GPUs") in the prose of its section
    before it, and a block that runs under torchrun says "under `torchrun`": the markers are
    HTML comments, invisible on a rendered page."""
    missing = []
    for path in documents():
        for block in blocks(path):
            before = " ".join(_section_before(block).split()).lower()
            raw = " ".join("\n".join(block.path.read_text().splitlines()[: block.line - 1]).split())
            if block.gpu and not re.search(r"needs (a )?gpus?\b", before):
                missing.append(f"{block.id}: no visible 'needs a GPU'")
            if block.skip and "torchrun" in block.skip and "under `torchrun`" not in raw[-600:]:
                missing.append(f"{block.id}: no visible 'runs under `torchrun`'")
    assert missing == []


def test_distributed_md_has_a_cpu_loop_that_runs() -> None:
    """distributed.md's torchrun loop has a CPU (gloo) version the snippet test runs: no marker
    that would skip it."""
    page = ROOT / "docs" / "distributed.md"
    gloo = [b for b in blocks(page) if b.lang == "python" and '"gloo"' in b.code]
    assert gloo and not gloo[0].skip and not gloo[0].gpu
    assert "mp.start_processes(" in gloo[0].code and "report(all_ranks=True)" in gloo[0].code


def test_one_compiled_cost_figure() -> None:
    """The compiled GPT-2 step's cost reads the same in the README, compile.md and
    benchmarks.md (the one place for cost figures), and the other two link to benchmarks.md."""
    pattern = r"all 125 modules (?:timed|instrumented)(?: runs)?:? \**(\d\.\d\d)-(\d\.\d\d)x"
    figures = {}
    for name in ("README.md", "docs/compile.md", "docs/benchmarks.md"):
        text = " ".join((ROOT / name).read_text().split())
        found = re.search(pattern, text)
        assert found, f"{name} no longer states the compiled step's cost"
        figures[name] = found.groups()
        if name != "docs/benchmarks.md":
            assert "benchmarks.md#torchcompile" in text, name
    assert len(set(figures.values())) == 1, figures


def test_reports_md_lists_the_csv_columns_of_the_code() -> None:
    """reports.md's column list of the regions CSV is the code's, brace groups expanded."""
    from cudatimer.render._export import table
    from tests.helpers.report_fixtures import gpu_run

    text = " ".join((ROOT / "docs" / "reports.md").read_text().split())
    listed = re.search(r"`\"regions\"` \(one row per region and clock; columns `([^`]+)`", text)
    assert listed
    names = []
    for word in listed.group(1).split():
        group = re.fullmatch(r"(\w*)\{([\w,]+)\}(\w*)", word)
        names += [f"{group[1]}{x}{group[3]}" for x in group[2].split(",")] if group else [word]
    assert tuple(names) == table(gpu_run(), "regions")[0]


def test_cli_md_synopsis_names_every_option() -> None:
    """Each command's line in cli.md's synopsis names every option its parser takes (those
    --help lists)."""
    import argparse

    from cudatimer._cli import _parser

    synopsis = next(b for b in blocks(ROOT / "docs" / "cli.md") if b.lang == "text").code
    lines: dict[str, str] = {}
    for line in synopsis.splitlines():
        words = line.split()
        if len(words) > 1 and words[0] == "cudatimer":
            lines[words[1]] = lines.get(words[1], "") + " " + line
    commands = next(
        a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction)
    ).choices
    missing = []
    for command, parser in commands.items():
        for action in parser._actions:
            if not action.option_strings or action.help == argparse.SUPPRESS:
                continue  # positionals are the synopsis's words; hidden options are refused
            if "-h" in action.option_strings:
                continue
            shown = lines.get(command, "")
            if not any(re.search(rf"(?<![\w-]){flag}\b", shown) for flag in action.option_strings):
                missing.append(f"{command} {'/'.join(action.option_strings)}")
    assert missing == []


def test_the_demo_commands_write_outside_the_checkout() -> None:
    """reports.md's demo commands give an --out outside the checkout, and say what a relative
    one does (it is taken from where the demo runs)."""
    text = (ROOT / "docs" / "reports.md").read_text()
    out = re.search(r"python3 examples/report_demo\.py --out (\S+)", text)
    assert out
    target = Path(out.group(1)).expanduser()
    assert target.is_absolute() and ROOT not in target.resolve().parents
    assert "never writes into the checkout" not in " ".join(text.split())


def test_docs_index_names_the_backward_pass() -> None:
    """docs/README.md's index says where the backward pass is documented."""
    index = (ROOT / "docs" / "README.md").read_text()
    row = next(line for line in index.splitlines() if line.startswith("| [instrument.md]"))
    assert "backward" in row


def test_extras_hold_what_their_names_say() -> None:
    """The ``test`` extra holds the test tools only; the integrations' libraries are in the
    ``integrations`` extra; the README names both installs."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]

    def names(extra: str) -> set[str]:
        return {re.split(r"[<>=\[ ]", req)[0].lower() for req in extras[extra]}

    heavy = {"lightning", "transformers", "accelerate", "tensorboard"}
    assert names("test") == {
        "pytest",
        "pytest-timeout",
        "pytest-xdist",
        "nvidia-nvtx",
        "pandas",
        "matplotlib",
        "mypy",
        "ruff",
    }
    assert names("integrations") == heavy
    readme = (ROOT / "README.md").read_text()
    assert 'pip install -e ".[test]"' in readme
    assert 'pip install -e ".[test,integrations]"' in readme
    install = readme[readme.index("## Install and test") :]
    assert install.index("download.pytorch.org/whl/cpu") < install.index('".[test]"')


INTEGRATION_PACKAGES = {
    "lightning",
    "pytorch_lightning",
    "transformers",
    "accelerate",
    "tensorboard",
}


def test_tests_of_the_integrations_skip_with_a_reason_without_them() -> None:
    """No test module imports an integration package at its top, or skips for one except
    through ``tests.helpers.extras.needs`` (which names the package and the install)."""
    found = []
    scripts = {"lightning_ddp_script.py"}  # run by test_lightning after its needs()
    for path in sorted((ROOT / "tests").rglob("*.py")):
        if path.name in scripts:
            continue
        tree = ast.parse(path.read_text())
        for node in tree.body:
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            if any(n.split(".")[0] in INTEGRATION_PACKAGES for n in names):
                found.append(f"{path.name}:{node.lineno} imports {names}")
        for call in ast.walk(tree):
            if (
                isinstance(call, ast.Call)
                and isinstance(call.func, ast.Attribute)
                and call.func.attr == "importorskip"
                and call.args
                and isinstance(call.args[0], ast.Constant)
                and str(call.args[0].value).split(".")[0] in INTEGRATION_PACKAGES
            ):
                found.append(f"{path.name}:{call.lineno} importorskip({call.args[0].value!r})")
    assert found == []
