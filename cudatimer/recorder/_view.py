"""The region tree of a Timer (slot numbers for region paths) and a store snapshot read
against it: what the summary, windows, step records and the trace are built from."""

from __future__ import annotations

import itertools
from array import array
from collections.abc import Iterable
from typing import Any

from ..core._locks import claim, fork_safe_lock
from ..records._values import Values

# Taken on a cache miss of child() and by prune(), never on a hit.
_lock = fork_safe_lock()


class Tree:
    """The region paths of one Timer as slot numbers (what the core stores samples under).

    ``child(parent, name)`` is called by the core on a region's cache miss and by the general
    path: a dict hit once the path exists. Slot numbers are never reused, so a slot cached
    before ``prune()`` can never name another path after it.
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
        """The slot of ``name`` under ``parent`` (-1: the root), made on first use. KeyError
        when ``parent`` was forgotten by a prune() that raced with the region entering it:
        the caller names it again from its stack (``Recorder``)."""
        slot = self._kids.get((parent, name))
        if slot is not None:
            return slot
        with _lock:
            slot = self._kids.get((parent, name))
            if slot is not None:
                return slot
            if parent >= 0 and parent not in self.info:
                raise KeyError(f"region tree: slot {parent} was forgotten")
            slot = next(self._ids)
            depth = 0 if parent < 0 else self.info[parent][2] + 1
            self._add(slot, (name, parent, depth))
            return slot

    def _add(self, slot: int, entry: tuple[str, int, int]) -> None:
        self.info[slot] = entry
        self._kids[(entry[1], entry[0])] = slot
        (self.roots if entry[1] < 0 else self.children.setdefault(entry[1], [])).append(slot)

    def knows(self, slot: int) -> bool:
        return slot < 0 or slot in self.info

    def prune(self, keep: Iterable[int]) -> None:
        """Forget every path but those of ``keep`` and their parents (``reset()``: the slots
        of regions still open). Memory then follows the paths used since, not all ever seen."""
        with claim(_lock, "the region trees (Timer.reset)"):
            info = self.info
            live: dict[int, tuple[str, int, int]] = {}
            for slot in keep:
                while slot >= 0 and slot not in live:
                    entry = info.get(slot)
                    if entry is None:
                        break
                    live[slot] = entry
                    slot = entry[1]
            self.info, self._kids, self.children, self.roots, self.paths = {}, {}, {}, [], {}
            for slot in sorted(live):  # creation order: siblings stay in the order they ran
                self._add(slot, live[slot])

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

    def __init__(
        self,
        tree: Tree,
        snap: Any,
        syncs: dict[int, int],
        values: dict[tuple[int, int], Values] | None = None,
        step_values: dict[int, dict[tuple[int, int], Values]] | None = None,
    ) -> None:
        self.tree = tree
        self.snap = snap
        self.syncs = syncs
        # Per-call values other than time per (slot, dev): the whole run's, each kept step's.
        self.values = values or {}
        self.step_values = step_values or {}
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
