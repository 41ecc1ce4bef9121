"""Shared test setup: GPU tests are marked ``gpu`` and skipped where CUDA is absent."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import cudatimer

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # lets tests import tests.helpers.nvtx_harness and benchmarks helpers
    sys.path.insert(0, str(ROOT))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (run on the GPU machine)")
    for item in items:
        if "gpu" in item.keywords or "multigpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _clean_default_timer() -> Iterator[None]:
    """Every test starts and ends with an empty, enabled default Timer and no open region."""
    timer = cudatimer.default_timer()
    timer.reset()
    timer.enable()
    yield
    stack = timer.recorder.store.stack()
    leftover = stack.frames()
    stack.clear()
    timer.reset()
    timer.enable()
    assert not leftover, f"test left regions open: {[f.region.name for f in leftover]}"
