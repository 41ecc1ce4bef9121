"""The region tree of a Timer (slot numbers for region paths) and a store snapshot read
against it: what the summary, windows, step records and the trace are built from."""

from __future__ import annotations

import itertools
from array import array
from typing import Any


class Tree:
    """The region paths of one Timer as slot numbers (what the core stores samples under).

    ``child(parent, name)`` is called by the core on a region's cache miss and by the general
    path: a dict hit once the path exists. Creation is lock-free under the GIL: a slot number
    comes from an atomic counter and ``setdefault`` decides which of two racing threads wins.
    """

    __slots__ = ("_ids", "_kids", "children", "info", "paths", "roots")

    def __init__(self) -> None:
        self._ids = itertools.count()
        self._kids: dict[tuple[int, str], int] = {}
        self.info: dict[int, tuple[str, int, int]] = {}  # slot -> (name, parent, depth)
        self.children: dict[int, list[int]] = {}
        self.roots: list[int] = []
        self.paths: dict[int, str] = {}

    def child(self, parent: int, name: str) -> int:
        slot = self._kids.get((parent, name))
        if slot is not None:
            return slot
        mine = next(self._ids)
        depth = 0 if parent < 0 else self.info[parent][2] + 1
        self.info[mine] = (name, parent, depth)
        slot = self._kids.setdefault((parent, name), mine)
        if slot == mine:
            (self.roots if parent < 0 else self.children.setdefault(parent, [])).append(mine)
        return slot

    def path(self, slot: int) -> str:
        """``outer/inner`` of a slot, built when first asked (reports), never on the hot path;
        iterative, so a region nested thousands deep never meets the recursion limit."""
        path = self.paths.get(slot)
        if path is not None:
            return path
        chain = []
        at = slot
        while at >= 0 and at not in self.paths:
            chain.append(at)
            at = self.info[at][1]
        prefix = self.paths[at] if at >= 0 else None
        for s in reversed(chain):
            name = self.info[s][0]
            prefix = name if prefix is None else f"{prefix}/{name}"
            self.paths[s] = prefix
        return self.paths[slot]

    def depth(self, slot: int) -> int:
        return self.info[slot][2]

    def order(self) -> list[int]:
        """Slots in tree order: parents first, siblings in the order they first ran."""
        out: list[int] = []
        todo = list(reversed(self.roots))
        while todo:
            slot = todo.pop()
            out.append(slot)
            todo.extend(reversed(self.children.get(slot, ())))
        return out


class View:
    """A store snapshot read against the tree: what windows, step records and the trace use."""

    def __init__(self, tree: Tree, snap: Any, syncs: dict[int, int]) -> None:
        self.tree = tree
        self.snap = snap
        self.syncs = syncs
        rank = {slot: i for i, slot in enumerate(tree.order())}
        # (slot, dev) in report order: tree order, then the order each clock was first seen.
        self.order: dict[tuple[int, int], int] = {
            (s.slot, s.dev): i
            for i, s in enumerate(
                sorted(snap.stats, key=lambda s: (rank.get(s.slot, len(rank)), s.order))
            )
        }
        self.stats = sorted(snap.stats, key=lambda s: self.order[(s.slot, s.dev)])
        self._steps: dict[int, dict[tuple[int, int], tuple[array[float], array[float]]]] | None = (
            None
        )

    def steps(self) -> dict[int, dict[tuple[int, int], tuple[array[float], array[float]]]]:
        """Raw samples per kept step: {step: {(slot, dev): (gpu ms, cpu ms)}}, decoded once
        (a window summary with step records reads them twice)."""
        if self._steps is not None:
            return self._steps
        out: dict[int, dict[tuple[int, int], tuple[array[float], array[float]]]] = {
            s: {} for s in self.snap.kept
        }
        self._steps = out
        for row in self.snap.series:
            gpu, cpu = array("d"), array("d")
            gpu.frombytes(row.gpu_ms)
            cpu.frombytes(row.cpu_ms)
            out.setdefault(row.step, {})[(row.slot, row.dev)] = (gpu, cpu)
        return out
