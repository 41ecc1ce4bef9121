"""Step windows: which steps a report covers, and statistics rebuilt from per-step samples.

The store keeps the raw durations of the last ``keep_steps`` steps (16 bytes a sample: GPU and
host), so a window's percentiles are computed from exact values, not from bucketed whole-run
ones. Everything here reads a snapshot (``_recorder.View``); nothing changes the store.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..records._hist import HistBuilder
from ..records._records import RegionStats, StepStats, TraceSample, step_flops
from ..records._values import EMPTY, Values

if TYPE_CHECKING:
    from ._view import View

__all__ = [
    "MAX_LISTED_STEPS",
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


# The most step numbers steps= may list (a list, tuple or set). A report checks each one, so
# this bounds the time a summary spends on its arguments (10^6 ints: about 0.1 s); a range of
# any length is taken arithmetically and needs no such bound.
MAX_LISTED_STEPS = 1_000_000


@dataclass(frozen=True)
class Window:
    """The steps a summary covers: a ``range`` or a set of step numbers, less ``excluded``
    (steps of ``steps`` whose raw samples were dropped; never materialises a range)."""

    steps: range | frozenset[int]
    label: str
    note: str = ""
    excluded: frozenset[int] = frozenset()

    def __contains__(self, step: object) -> bool:
        return step in self.steps and step not in self.excluded

    def __len__(self) -> int:
        return len(self.steps) - len(self.excluded)  # excluded is a subset of steps


def _check_count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} ({value!r})")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value


def _clip(steps: range, low: int, high: int) -> range:
    """The steps of an ascending range with ``low <= step < high``, as a range (O(1))."""
    first = steps.start
    if first < low:
        first += -(-(low - first) // steps.step) * steps.step  # the first one >= low
    return range(first, max(first, min(steps.stop, high)), steps.step)


def _members(steps: range | frozenset[int], excluded: frozenset[int], most: int) -> list[int]:
    """The lowest ``most`` steps of a window, in order; reads at most most + len(excluded)
    steps of a range."""
    if isinstance(steps, frozenset):
        return sorted(s for s in steps if s not in excluded)[:most]
    out: list[int] = []
    for s in steps[: most + len(excluded)]:
        if s not in excluded:
            out.append(s)
            if len(out) == most:
                break
    return out


def _label(steps: range | frozenset[int], excluded: frozenset[int] = frozenset()) -> str:
    count = len(steps) - len(excluded)
    if count <= 0:
        return "no steps"
    if isinstance(steps, range) and steps.step == 1 and not excluded:
        first, last = steps[0], steps[-1]
        return f"step {first}" if first == last else f"steps {first}-{last}"
    shown = ", ".join(str(s) for s in _members(steps, excluded, 8))
    more = f", ... ({count} steps)" if count > 8 else ""
    return f"step {shown}" if count == 1 else f"steps {shown}{more}"


def _listed(steps: object) -> frozenset[int]:
    """``steps=`` given as step numbers: a list, tuple, set or frozenset of at most
    MAX_LISTED_STEPS ints. Iterators and generators are refused: one may never end, and a
    report reads its arguments twice (once to check them before waiting for the GPU)."""
    if not isinstance(steps, (list, tuple, set, frozenset)):
        what = type(steps).__name__
        raise TypeError(
            f"steps must be a range or an iterable of step numbers with a length (a list, "
            f"tuple or set), got {what}; pass a range (e.g. range(10, 20)), or list(...) of a "
            "finite iterable"
        )
    if len(steps) > MAX_LISTED_STEPS:
        raise ValueError(
            f"steps lists {len(steps)} step numbers, more than {MAX_LISTED_STEPS}; pass a range "
            "(e.g. range(0, n, 2)), which may be of any length"
        )
    return frozenset(_check_count("each step in steps", s) for s in steps)


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
    ``steps=`` names steps explicitly, the current one included: an ascending ``range`` of any
    length (intersected with the steps that exist, never listed), or a list, tuple or set of
    at most MAX_LISTED_STEPS ints; iterators and generators are refused, so a report always
    returns promptly. ``dropped``: steps whose raw samples were dropped (STEP_SAMPLE_CAP);
    noted when chosen.
    """
    skip = _check_count("warmup", warmup)
    if last is not None:
        last = _check_count("last", last)
        if last == 0:
            raise ValueError("last must be >= 1 (the number of finished steps to report)")
    if last is not None and steps is not None:
        raise ValueError("give either last= or steps=, not both")
    listed: frozenset[int] = frozenset()
    if steps is not None and not isinstance(steps, range):
        listed = _listed(steps)  # checked before anything else, whatever the Timer keeps
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
        chosen = _clip(steps, max(skip, 0), current + 1)
    else:
        chosen = frozenset(s for s in listed if skip <= s <= current)
    note = ""
    gone = sorted(s for s in frozenset(dropped) if s in chosen)
    excluded = frozenset(gone)
    if gone:
        shown = ", ".join(str(s) for s in gone[:8]) + (", ..." if len(gone) > 8 else "")
        note = (
            f"step{'s' if len(gone) > 1 else ''} {shown} left out: regions ran more than "
            f"{STEP_SAMPLE_CAP} times in one step, so its per-step samples were not kept "
            "(whole-run statistics still count them)"
        )
    lowest = _members(chosen, excluded, 1)
    if oldest_kept is not None and lowest and lowest[0] < oldest_kept:
        older = f"steps before {oldest_kept} are no longer kept (keep_steps={keep_steps})"
        note = f"{note}; {older}" if note else older
        chosen = (
            _clip(chosen, oldest_kept, chosen.stop)
            if isinstance(chosen, range)
            else frozenset(s for s in chosen if s >= oldest_kept)
        )
        excluded = frozenset(s for s in excluded if s in chosen)
    return Window(chosen, _label(chosen, excluded), note, excluded)


def window_regions(view: View, window: Window) -> tuple[RegionStats, ...]:
    """Region statistics of the steps in ``window``, from the raw per-step samples (and the
    per-call values of those steps, merged)."""
    merged: dict[tuple[int, int], tuple[HistBuilder, HistBuilder]] = {}
    values: dict[tuple[int, int], Values] = {}
    for step, per_step_values in view.step_values.items():
        if step in window:
            for key, v in per_step_values.items():
                values[key] = values[key].merge(v) if key in values else v
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
                values=values.get(key, EMPTY),
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
        values = view.step_values.get(step, {})
        for key in sorted(per_step, key=lambda k: order.get(k, len(order))):
            gpu_ms, cpu_ms = per_step[key]
            calls = len(cpu_ms)
            gpu = math.fsum(gpu_ms) if key[1] >= 0 else None
            cpu = math.fsum(cpu_ms)
            flop = step_flops(values[key], calls, gpu, cpu) if key in values else (None,) * 3
            rows.append(
                StepStats(
                    step=step,
                    name=tree.path(key[0]),
                    clock="host" if key[1] < 0 else f"cuda:{key[1]}",
                    calls=calls,
                    gpu_ms=gpu,
                    cpu_ms=cpu,
                    flop=flop[0],
                    tflop_per_s=flop[1],
                    mfu=flop[2],
                )
            )
    return tuple(rows)


def window_meta(window: Window) -> tuple[tuple[str, str], ...]:
    meta: tuple[tuple[str, str], ...] = (("window", window.label),)
    if window.note:
        meta += (("window_note", window.note),)
    return meta


def trace_samples(view: View, window: Window | None) -> tuple[TraceSample, ...]:
    """The trace ring of a snapshot as frozen samples; never synchronizes."""
    names = {t.ident: t.name for t in threading.enumerate()}
    raw: list[tuple[Any, ...]] = []
    for item in view.snap.trace:
        if window is not None and item.step not in window:
            continue
        gpu = None
        if item.dev >= 0 and not math.isnan(item.at_ns) and not math.isnan(item.gpu_ms):
            gpu = (item.stream, item.at_ns, max(0.0, item.gpu_ms))
        clock = "host" if item.dev < 0 else f"cuda:{item.dev}"
        raw.append((item.slot, clock, item.step, item.tid, float(item.t0_ns), item.cpu_ms, gpu))
    if not raw:
        return ()
    origin_ns = min(min(r[4], r[6][1] if r[6] else r[4]) for r in raw)
    samples = []
    for slot, clock, step, tid, t0_ns, cpu_ms, gpu in raw:
        samples.append(
            TraceSample(
                name=view.tree.path(slot),
                clock=clock,
                step=step,
                thread=tid,
                thread_name=names.get(tid, f"thread {tid}"),
                host_start_ms=(t0_ns - origin_ns) * 1e-6,
                cpu_ms=cpu_ms,
                stream=gpu[0] if gpu else None,
                gpu_start_ms=(gpu[1] - origin_ns) * 1e-6 if gpu else None,
                gpu_ms=gpu[2] if gpu else None,
            )
        )
    samples.sort(key=lambda s: s.host_start_ms)
    return tuple(samples)
