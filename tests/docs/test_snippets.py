"""Every Python block of the README and docs/*.md runs as pasted, each in a fresh interpreter
(markers: tests/helpers/docs_blocks.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from tests.helpers.docs_blocks import Block, blocks, documents, python_blocks
from tests.helpers.extras import INSTALL
from tests.helpers.subproc import run_python

BLOCKS = python_blocks()


def _setups(block: Block) -> str:
    defined = {b.define: b for b in blocks(block.path) if b.define}
    code = []
    for name in block.setup:
        if name not in defined:
            raise AssertionError(f"{block.id}: setup={name} is defined nowhere in the file")
        code.append(defined[name].code)
    return "".join(code)


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_block_runs_as_pasted(block: Block, tmp_path: Path) -> None:
    """The block (after its declared setup) exits 0 in a fresh interpreter in an empty folder."""
    if block.skip:
        pytest.skip(f"marked skip: {block.skip}")
    if block.gpu and not torch.cuda.is_available():
        pytest.skip("marked gpu: needs a CUDA device")
    missing = [m for m in block.needs if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"marked needs: {', '.join(missing)} not installed ({INSTALL})")
    code = _setups(block) + block.code
    done = run_python(code, {"MPLBACKEND": "Agg"}, cwd=tmp_path, timeout=240)
    assert done.returncode == 0, f"{block.id} failed:\n{done.stderr[-3000:]}"


def test_markers_parse_and_every_document_has_blocks() -> None:
    """Markers are understood, and the documents are found (an empty list would pass)."""
    names = [p.name for p in documents()]
    assert "README.md" in names and len(names) > 5
    assert len(BLOCKS) > 10
    for block in BLOCKS:
        _setups(block)  # every setup= names a define= of its file


def test_python_blocks_say_python() -> None:
    """Code fences use `python` (run), `pycon` (a transcript), `bash` or `text`: a `py` fence
    would escape the test."""
    for path in documents():
        for b in blocks(path):
            assert b.lang in {"python", "pycon", "bash", "text", ""}, f"{b.id}: ```{b.lang}"
