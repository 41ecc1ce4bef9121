"""Backward coverage: how much of a backward root row's time its child rows account for.

A backward tree (``instrument(model, backward=True)``) is rooted at ``<Model>.backward``, the
model's whole backward; its children are the backward rows of the model's top-level modules.
Autograd work that ran inside the root but in no child (nodes made by the model's own forward
code between submodules, the parameters' gradient accumulation, the tail after the last
hooked node) is the uncovered part: ``1 - fraction``. Derived from the rows alone, so a saved
or merged summary gives the same figure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._records import RegionStats

__all__ = ["BACKWARD_SUFFIX", "Coverage", "backward_coverage"]

#: What names a backward root row: a top-level row ``<name>.backward`` with child rows.
BACKWARD_SUFFIX = ".backward"


@dataclass(frozen=True)
class Coverage:
    """One backward root row on one clock: its time, and the part its child rows cover.

    ``fraction`` is ``covered_ms / total_ms`` (NaN when the root took no time); above 1 when
    children overlap (two calls of one module in flight at once).
    """

    region: str
    clock: str
    total_ms: float
    covered_ms: float
    children: int

    @property
    def fraction(self) -> float:
        return self.covered_ms / self.total_ms if self.total_ms > 0 else math.nan

    @property
    def uncovered_ms(self) -> float:
        return max(0.0, self.total_ms - self.covered_ms)


def backward_coverage(regions: Sequence[RegionStats]) -> tuple[Coverage, ...]:
    """The coverage of every backward root row in ``regions`` (rows without children are
    not trees: a ``cuda_region(..., backward=True)`` row has none)."""
    roots = {
        (r.name, r.clock): r
        for r in regions
        if "/" not in r.name and r.name.endswith(BACKWARD_SUFFIX)
    }
    covered: dict[tuple[str, str], tuple[float, int]] = {}
    for r in regions:
        parent, sep, _ = r.name.rpartition("/")
        if sep and (parent, r.clock) in roots:
            ms, n = covered.get((parent, r.clock), (0.0, 0))
            covered[(parent, r.clock)] = (ms + r.total_ms, n + 1)
    return tuple(
        Coverage(name, clock, roots[(name, clock)].total_ms, ms, n)
        for (name, clock), (ms, n) in covered.items()
    )
