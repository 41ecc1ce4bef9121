"""Step windows: which steps a report covers, and statistics rebuilt from per-step samples.

The store keeps the raw durations of the last ``keep_steps`` steps (16 bytes a sample: GPU and
host), so a window's percentiles are computed from exact values, not from bucketed whole-run
ones. Everything here reads a snapshot (``_recorder.View``); nothing changes the store.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ._hist import HistBuilder
from ._records import RegionStats, StepStats

if TYPE_CHECKING:
    from ._view import View

__all__ = [
    "STEP_SAMPLE_CAP",
    "Window",
    "select",
    "step_stats",
    "window_meta",
    "window_regions",
]

# Raw samples one step keeps. A run that never calls step() is all step 0, and its raw
# samples would grow 16 bytes per region for ever (17.7 MB per 10^6 regions, measured); past
# this many samples in one step, that step's raw samples are dropped and windows leave it out
# with a note. 65536 samples are 1 MB: far above the regions of a real training step.
STEP_SAMPLE_CAP = 65536


@dataclass(frozen=True)
class Window:
    """The steps a summary covers: a ``range`` or a set of step numbers."""

    steps: range | frozenset[int]
    label: str
    note: str = ""

    def __contains__(self, step: object) -> bool:
        return step in self.steps

    def __len__(self) -> int:
        return len(self.steps)


def _check_count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} ({value!r})")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value


def _label(steps: range | frozenset[int]) -> str:
    if len(steps) == 0:
        return "no steps"
    if isinstance(steps, range) and steps.step == 1:
        first, last = steps[0], steps[-1]
        return f"step {first}" if first == last else f"steps {first}-{last}"
    ordered = sorted(steps)
    shown = ", ".join(str(s) for s in ordered[:8])
    more = f", ... ({len(ordered)} steps)" if len(ordered) > 8 else ""
    return f"step {shown}" if len(ordered) == 1 else f"steps {shown}{more}"


def select(
    current: int,
    oldest_kept: int | None,
    keep_steps: int,
    *,
    last: object = None,
    steps: object = None,
    warmup: object = 0,
    dropped: Iterable[int] = (),
) -> Window | None:
    """Validate the window options; None means the whole run (every call ever recorded).

    ``current`` is the step in progress (``Store.step``). Without ``steps=``, a window covers
    finished steps only (``warmup <= step < current``), the last ``last`` of them if given.
    ``steps=`` names steps explicitly (a ``range`` or ints), the current one included.
    ``dropped``: steps whose raw samples were dropped (STEP_SAMPLE_CAP); noted when chosen.
    """
    skip = _check_count("warmup", warmup)
    if last is not None:
        last = _check_count("last", last)
        if last == 0:
            raise ValueError("last must be >= 1 (the number of finished steps to report)")
    if last is not None and steps is not None:
        raise ValueError("give either last= or steps=, not both")
    if last is None and steps is None and skip == 0:
        return None
    if keep_steps == 0:
        raise ValueError(
            "this Timer keeps no per-step samples (keep_steps=0), so it cannot report a window "
            "of steps; create it with Timer(keep_steps=N)"
        )
    chosen: range | frozenset[int]
    if steps is None:
        stop = current
        start = skip if last is None else max(skip, stop - last)
        chosen = range(start, max(start, stop))
    elif isinstance(steps, range):
        if steps.step < 1:
            raise ValueError(f"steps must be an ascending range, got {steps!r}")
        start = max(steps.start, skip, 0)
        if steps.step == 1:
            chosen = range(start, max(start, min(steps.stop, current + 1)))
        else:
            chosen = frozenset(s for s in steps if skip <= s <= current)
    elif isinstance(steps, Iterable) and not isinstance(steps, (str, bytes)):
        picked = set()
        for s in steps:
            picked.add(_check_count("each step in steps", s))
        chosen = frozenset(s for s in picked if skip <= s <= current)
    else:
        raise TypeError(
            f"steps must be a range or an iterable of step numbers, got {type(steps).__name__}"
        )
    note = ""
    gone = sorted(s for s in dropped if s in chosen)
    if gone:
        shown = ", ".join(str(s) for s in gone[:8]) + (", ..." if len(gone) > 8 else "")
        note = (
            f"step{'s' if len(gone) > 1 else ''} {shown} left out: regions ran more than "
            f"{STEP_SAMPLE_CAP} times in one step, so its per-step samples were not kept "
            "(whole-run statistics still count them)"
        )
        chosen = frozenset(s for s in chosen if s not in gone)
    lowest = (chosen[0] if isinstance(chosen, range) else min(chosen)) if chosen else None
    if oldest_kept is not None and lowest is not None and lowest < oldest_kept:
        older = f"steps before {oldest_kept} are no longer kept (keep_steps={keep_steps})"
        note = f"{note}; {older}" if note else older
        chosen = (
            range(max(chosen.start, oldest_kept), max(chosen.stop, oldest_kept))
            if isinstance(chosen, range)
            else frozenset(s for s in chosen if s >= oldest_kept)
        )
    return Window(chosen, _label(chosen), note)


def window_regions(view: View, window: Window) -> tuple[RegionStats, ...]:
    """Region statistics of the steps in ``window``, from the raw per-step samples."""
    merged: dict[tuple[int, int], tuple[HistBuilder, HistBuilder]] = {}
    for step, per_step in view.steps().items():
        if step not in window:
            continue
        for key, (gpu_ms, cpu_ms) in per_step.items():
            builders = merged.get(key)
            if builders is None:
                builders = merged[key] = (HistBuilder(), HistBuilder())
            gpu, cpu = builders
            if key[1] >= 0:  # host rows hold NaN for their GPU time
                gpu.add_many(v for v in gpu_ms if not math.isnan(v))
            cpu.add_many(cpu_ms)
    tree = view.tree
    regions: list[RegionStats] = []
    seen: set[int] = set()
    for key in sorted(merged, key=lambda k: view.order.get(k, len(view.order))):
        slot, dev = key
        gpu_hist, cpu_hist = merged[key][0].freeze(), merged[key][1].freeze()
        first = slot not in seen
        seen.add(slot)
        regions.append(
            RegionStats(
                name=tree.path(slot),
                clock="host" if dev < 0 else f"cuda:{dev}",
                calls=cpu_hist.count,
                gpu=gpu_hist if dev >= 0 else None,
                cpu=cpu_hist,
                depth=tree.depth(slot),
                # not kept per step: the whole run's count
                syncs=view.syncs.get(slot, 0) if first else 0,
            )
        )
    return tuple(regions)


def step_stats(view: View, window: Window | None) -> tuple[StepStats, ...]:
    """One record per (step, region, clock) of the kept steps in ``window`` (all if None)."""
    order = view.order
    tree = view.tree
    rows: list[StepStats] = []
    steps = view.steps()
    for step in sorted(steps):
        if window is not None and step not in window:
            continue
        per_step = steps[step]
        for key in sorted(per_step, key=lambda k: order.get(k, len(order))):
            gpu_ms, cpu_ms = per_step[key]
            rows.append(
                StepStats(
                    step=step,
                    name=tree.path(key[0]),
                    clock="host" if key[1] < 0 else f"cuda:{key[1]}",
                    calls=len(cpu_ms),
                    gpu_ms=math.fsum(gpu_ms) if key[1] >= 0 else None,
                    cpu_ms=math.fsum(cpu_ms),
                )
            )
    return tuple(rows)


def window_meta(window: Window) -> tuple[tuple[str, str], ...]:
    meta: tuple[tuple[str, str], ...] = (("window", window.label),)
    if window.note:
        meta += (("window_note", window.note),)
    return meta
