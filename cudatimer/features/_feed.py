"""Per-step region times handed to sinks as a run goes on, never waiting for the GPU.

A step is *finished* when the GPU has run everything queued before the step boundary. At
each ``poll()`` the feed records one pooled event on every stream regions have used (once
per new boundary: a few microseconds, no synchronisation) and asks, with a non-blocking
``query()``, which recorded boundaries the GPU has passed. Events on a stream complete in
order, so once a boundary's events are done, every sample of the steps before it is done
too: the feed harvests them (non-blocking), reads the rows of just those steps from the
store (``Store.step_rows``: the cost of the new steps' rows, never of all kept steps) and
hands each sink one :class:`StepTimes` per step, in step order, exactly once. Steps lag the
current one by however far the GPU is behind; ``close()`` waits (bounded) for the rest.

A sink that raises keeps its undelivered steps and gets them again, in order, at the next
poll; the first error of each sink is reported as a warning and the run goes on.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from ..core import _core, _device
from ..records._records import StepStats, step_flops

if TYPE_CHECKING:
    from ..regions._timer import Timer

__all__ = ["MAX_BACKLOG", "Row", "Sink", "StepFeed", "StepTimes"]

Sink = Callable[["StepTimes"], object]

# Undelivered steps kept per failing sink. A step of 200 regions is ~40 kB of records, so
# 10,000 steps bound a sink that never recovers to ~400 MB; past it the oldest are dropped
# (counted in ``StepFeed.dropped`` and warned about once).
MAX_BACKLOG = 10_000
_log = logging.getLogger("cudatimer")


#: One region on one clock in one step: (path, clock, calls, gpu_ms or None, cpu_ms).
Row = tuple[str, str, int, "float | None", float]


@dataclass(frozen=True)
class StepTimes:
    """The region times of one finished step. ``rows``: one ``(path, clock, calls, gpu_ms,
    cpu_ms)`` per region and clock, in tree order (parents first), times summed over the
    step's calls (``gpu_ms`` None on the host clock); ``regions``: the same as
    ``cudatimer.StepStats`` records; ``scalars()``: flattened for a dashboard. Rows are plain
    tuples because a feed builds ~200 of them a step: a record each would cost ~3 us more.

    >>> import cudatimer
    >>> got = []
    >>> timer = cudatimer.Timer(name="feed-doc")
    >>> feed = cudatimer.StepFeed(got.append, timer=timer)
    >>> with timer.region("fwd"):
    ...     pass
    >>> feed.step()
    1
    >>> [(t.step, [r.name for r in t.regions]) for t in got]
    [(0, ['fwd'])]
    >>> sorted(got[0].scalars())
    ['cudatimer/fwd/cpu_ms']
    """

    step: int
    rows: tuple[Row, ...]
    #: flops=True rows: (path, clock) -> (FLOP, TFLOP/s or None, MFU or None) of the step.
    flops: Mapping[tuple[str, str], tuple[float | None, float | None, float | None]] = field(
        default_factory=dict
    )

    @cached_property
    def regions(self) -> tuple[StepStats, ...]:
        """The rows as ``StepStats`` records (built when first read)."""
        step = self.step
        flops = self.flops
        if not flops:
            return tuple(StepStats(step, *row) for row in self.rows)
        none = (None, None, None)
        return tuple(StepStats(step, *row, *flops.get((row[0], row[1]), none)) for row in self.rows)

    def scalars(self, prefix: str = "cudatimer/") -> dict[str, float]:
        """``{prefix}{region path}/gpu_ms`` (CUDA clocks) and ``.../cpu_ms`` (every clock):
        the step's summed time per region. A path timed on two clocks in one step (two
        devices, or the host and a device) is written ``path@clock``."""
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str, got {type(prefix).__name__}")
        clocks: dict[str, int] = {}
        for row in self.rows:
            clocks[row[0]] = clocks.get(row[0], 0) + 1
        out: dict[str, float] = {}
        for name, clock, _, gpu_ms, cpu_ms in self.rows:
            key = f"{prefix}{name}" if clocks[name] == 1 else f"{prefix}{name}@{clock}"
            if gpu_ms is not None:
                out[f"{key}/gpu_ms"] = gpu_ms
            out[f"{key}/cpu_ms"] = cpu_ms
            counted = self.flops.get((name, clock)) if self.flops else None
            if counted is not None:  # flops=True: per-step achieved rate and MFU
                if counted[1] is not None:
                    out[f"{key}/tflop_per_s"] = counted[1]
                if counted[2] is not None:
                    out[f"{key}/mfu"] = counted[2]
        return out


def _sink_name(sink: Any) -> str:
    return str(getattr(sink, "__qualname__", None) or type(sink).__qualname__)


class _Outlet:
    """One sink and the steps it has not taken yet (oldest first)."""

    __slots__ = ("backlog", "dropped_warned", "failures", "sink", "warned")

    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        self.backlog: deque[StepTimes] = deque()
        self.failures = 0
        self.warned = False
        self.dropped_warned = False


class StepFeed:
    """Hands every finished step's region times to ``sinks`` as the run goes on.

    Call :meth:`step` where you would call ``timer.step()`` (it marks the step, then polls),
    or :meth:`poll` after marking steps yourself. Neither waits for the GPU: a step is sent
    once the GPU has run all of it, typically a step or two later. :meth:`close` at the end
    waits at most ``timeout_s`` for the rest and sends it. A sink is any callable taking a
    :class:`StepTimes`; ``cudatimer.sinks`` has adapters for TensorBoard and wandb.

    ``timer``: the Timer whose steps are fed (default: the module's). ``match``: keep only
    regions whose path (or leaf name) matches this glob, as ``report(match=...)``. Steps are
    fed from the one in progress when the feed is made; the Timer must keep per-step samples
    (``keep_steps`` >= 1) and the GPU must stay fewer than ``keep_steps`` steps behind, or
    the oldest unfinished steps are sent without the rows the Timer no longer keeps.

    >>> import cudatimer
    >>> timer = cudatimer.Timer(name="feed")
    >>> seen = []
    >>> feed = cudatimer.StepFeed(lambda t: seen.append(t.step), timer=timer)
    >>> for _ in range(3):
    ...     with timer.region("train_step"):
    ...         pass
    ...     _ = feed.step()
    >>> feed.close()
    0
    >>> seen
    [0, 1, 2]
    """

    def __init__(
        self,
        *sinks: Sink,
        timer: Timer | None = None,
        match: str | None = None,
    ) -> None:
        from ..regions._timer import Timer

        if timer is None:
            from ..regions._timer import default_timer

            timer = default_timer()
        if not isinstance(timer, Timer):
            raise TypeError(f"timer must be a cudatimer.Timer, got {type(timer).__name__}")
        for sink in sinks:
            if not callable(sink):
                raise TypeError(
                    f"each sink must be a callable taking a cudatimer.StepTimes (e.g. "
                    f"cudatimer.sinks.tensorboard(writer)), got {type(sink).__name__}"
                )
        if match is not None and not isinstance(match, str):
            raise TypeError(f"match must be a glob pattern (str), got {type(match).__name__}")
        if timer.keep_steps == 0:
            raise ValueError(
                "the timer keeps no per-step samples (keep_steps=0), so no step can be fed; "
                "create it with Timer(keep_steps=N), N >= 1"
            )
        self.timer = timer
        self.match = match
        self._outlets = [_Outlet(s) for s in sinks]
        self._lock = threading.Lock()
        store = timer.recorder.store
        self._gen = store.gen
        self._next = store.step  # the first step not sent yet
        self._marked = store.step  # boundaries are recorded for every step below this
        # (steps below `upto` are finished once these events are, [(StreamRec, event)])
        self._marks: deque[tuple[int, list[tuple[Any, Any]]]] = deque()
        self._rank: dict[int, int] = {}  # slot -> tree order, rebuilt when a slot is new
        self._names: dict[int, str] = {}  # slot -> region path (cleared at reset)
        self._keep: dict[int, bool] = {}  # slot -> matches ``match``
        #: Steps sent (to every sink that took them), and steps dropped from a failing
        #: sink's backlog (past MAX_BACKLOG).
        self.sent = 0
        self.dropped = 0
        self.closed = False

    # -- what a training loop calls ---------------------------------------------------------
    def step(self) -> int:
        """Mark a step boundary on the timer (``timer.step()``) and send the steps that
        finished; returns the new step number. Never waits for the GPU."""
        new = self.timer.step()
        self.poll()
        return new

    def poll(self) -> int:
        """Send the steps whose GPU work has finished (never waits); returns how many."""
        with self._lock:
            return self._poll()

    def close(self, timeout_s: float = 60.0) -> int:
        """Wait at most ``timeout_s`` for the GPU work of the marked steps, send what finished
        (and retry sinks' backlogs once more); returns the steps still unsent. The step in
        progress (not marked yet) is not sent. Polling may go on after a close."""
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)):
            raise TypeError(
                f"timeout_s must be a number of seconds, got {type(timeout_s).__name__}"
            )
        if not (math.isfinite(timeout_s) and timeout_s >= 0):
            raise ValueError(f"timeout_s must be a finite number >= 0, got {timeout_s!r}")
        with self._lock:
            self._poll()  # records the boundary of the steps marked since the last poll
            # Poll (never a blocking CUDA call) until the GPU passed the last boundary.
            deadline = time.monotonic() + float(timeout_s)
            pause = 50e-6
            while self._marks and not _all_done(self._marks[-1][1]):
                if time.monotonic() >= deadline:
                    break
                time.sleep(pause)
                pause = min(pause * 2, 2e-3)
            self._poll()
            self.closed = True
            left = self._marked - self._next
            return left + max((len(o.backlog) for o in self._outlets), default=0)

    def advance(self) -> range:
        """What ``poll()`` does short of reading and sending steps, for a reader that takes
        the store's rows itself (``cudatimer.live`` reads only the newest of them): marks the
        new boundary, and returns the steps whose GPU work finished since the last call (or
        poll), which no sink gets. Never waits for the GPU."""
        with self._lock:
            first, stop = self._advance()
            self._next = stop
            return range(first, stop)

    @property
    def failures(self) -> int:
        """Calls of a sink that raised, all sinks together."""
        return sum(o.failures for o in self._outlets)

    # -- inside ------------------------------------------------------------------------------
    def _poll(self) -> int:
        first, finished = self._advance()
        if finished <= first:
            self._deliver(())
            return 0
        store = self.timer.recorder.store
        times = self._times(store.step_rows(first, finished), first, finished)
        self._next = finished
        self._deliver(times)
        return len(times)

    def _advance(self) -> tuple[int, int]:
        """Mark the new boundary and harvest: (first step not sent, first step not finished)."""
        store = self.timer.recorder.store
        if store.gen != self._gen:  # reset(): steps start again from 0
            self._gen, self._next, self._marked = store.gen, 0, 0
            self._rank, self._names, self._keep = {}, {}, {}
            self._give_back_marks()
        current = store.step
        if current > self._marked and self._mark(current):
            self._marked = current
        finished = self._next
        while self._marks:
            upto, events = self._marks[0]
            if not _all_done(events):
                break
            self._marks.popleft()
            for rec, ev in events:
                rec.give(ev)
            finished = upto
        if finished > self._next:
            for rec in _core.all_streams():
                rec.harvest()  # resolves the finished samples only, never blocks
        return self._next, max(finished, self._next)

    def _mark(self, upto: int) -> bool:
        """Record a boundary event on every stream regions used; False (try again at the next
        poll) while the current stream captures a CUDA graph, where no event may be recorded
        (and none queried), or when a record fails."""
        recs = _core.all_streams()
        if recs and _device.capturing(_device.current_key()):
            return False
        events: list[tuple[Any, Any]] = []
        try:
            for rec in recs:
                # torch's record (it switches to the stream's device first): a few us, once
                # per stream and step, never per region.
                events.append((rec, rec.take(True)))
        except RuntimeError:
            for rec, ev in events:
                rec.give(ev)
            return False
        self._marks.append((upto, events))
        return True

    def _give_back_marks(self) -> None:
        for _, events in self._marks:
            for rec, ev in events:
                rec.give(ev)
        self._marks.clear()

    def _times(self, rows: Iterable[Any], first: int, stop: int) -> list[StepTimes]:
        """One StepTimes per step in [first, stop) from the store's rows. Written for ~200
        rows a step: raw values read in place (memoryview), names, clocks and tree ranks
        cached, a single value (one call) taken as it is."""
        tree = self.timer.recorder.tree
        match = self.match
        per_step: dict[int, list[tuple[int, int, Row]]] = {s: [] for s in range(first, stop)}
        rank = self._rank
        names = self._names
        fsum = math.fsum
        for row in rows:
            slot = row.slot
            name = names.get(slot)
            if name is None:
                name = names[slot] = tree.path(slot)
                self._keep[slot] = match is None or _matches(name, match)
            if not self._keep[slot]:
                continue
            if slot not in rank:
                rank = self._rank = {s: i for i, s in enumerate(tree.order())}
            cpu = memoryview(row.cpu_ms).cast("d")
            n = len(cpu)
            dev = row.dev
            gpu_ms: float | None = None
            if dev >= 0:
                gpu = memoryview(row.gpu_ms).cast("d")
                gpu_ms = gpu[0] if n == 1 else fsum(gpu)
            clock = _CLOCKS.get(dev) or _CLOCKS.setdefault(dev, f"cuda:{dev}")
            item = (name, clock, n, gpu_ms, cpu[0] if n == 1 else fsum(cpu))
            per_step[row.step].append((rank.get(slot, len(rank)), dev, item))
        flops = self._flops(first, stop, per_step)
        return [
            StepTimes(step, tuple(r for _, _, r in sorted(items, key=_order)), flops.get(step, {}))
            for step, items in per_step.items()
        ]

    def _flops(
        self, first: int, stop: int, per_step: dict[int, list[tuple[int, int, Row]]]
    ) -> dict[int, dict[tuple[str, str], tuple[float | None, float | None, float | None]]]:
        """The FLOPs of the steps' counted rows (flops=True): none read where no region
        counts (one dict test a poll)."""
        rec = self.timer.recorder
        rec.flops.flush()
        values = rec.values.steps_of(range(first, stop))
        out: dict[int, dict[tuple[str, str], tuple[float | None, float | None, float | None]]] = {}
        if not values:
            return out
        slots = {name: slot for slot, name in self._names.items()}
        for step, items in per_step.items():
            table = values.get(step)
            if not table:
                continue
            for _, dev, (name, clock, n, gpu_ms, cpu_ms) in items:
                v = table.get((slots.get(name, -1), dev))
                if v is not None and "flop" in v:
                    out.setdefault(step, {})[(name, clock)] = step_flops(v, n, gpu_ms, cpu_ms)
        return out

    def _deliver(self, times: Iterable[StepTimes]) -> None:
        batch = list(times)
        self.sent += len(batch)
        for outlet in self._outlets:
            backlog = outlet.backlog
            backlog.extend(batch)
            while len(backlog) > MAX_BACKLOG:
                backlog.popleft()
                self.dropped += 1
                if not outlet.dropped_warned:
                    outlet.dropped_warned = True
                    warnings.warn(
                        f"cudatimer: step sink {_sink_name(outlet.sink)} kept failing and "
                        f"{MAX_BACKLOG} steps waited for it; the oldest are dropped from its "
                        "backlog (StepFeed.dropped counts them)",
                        RuntimeWarning,
                        stacklevel=4,
                    )
            while backlog:
                item = backlog[0]
                try:
                    outlet.sink(item)
                except Exception as exc:  # a sink's error must never stop the run
                    outlet.failures += 1
                    self._report(outlet, item, exc)
                    break
                backlog.popleft()

    @staticmethod
    def _report(outlet: _Outlet, item: StepTimes, exc: Exception) -> None:
        name = _sink_name(outlet.sink)
        if outlet.warned:
            _log.debug("cudatimer: step sink %s raised again on step %d: %r", name, item.step, exc)
            return
        outlet.warned = True
        warnings.warn(
            f"cudatimer: step sink {name} raised {exc!r} on step {item.step}; the run goes on, "
            f"and the sink gets step {item.step} and the steps after it again at the next poll "
            "(further errors of this sink are logged at DEBUG on the 'cudatimer' logger)",
            RuntimeWarning,
            stacklevel=4,
        )


_CLOCKS: dict[int, str] = {-1: "host"}


def _order(item: tuple[int, int, Row]) -> tuple[int, int]:
    return item[0], item[1]


def _all_done(events: list[tuple[Any, Any]]) -> bool:
    """Whether the GPU passed every event of a boundary (``query()`` never blocks; a stream
    that captures a CUDA graph cannot be queried now: not done yet)."""
    try:
        return all(ev.query() for _, ev in events)
    except RuntimeError:
        return False


def _matches(name: str, pattern: str) -> bool:
    from ..render._report import matches

    return matches(name, pattern)
