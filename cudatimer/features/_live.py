"""Publishing a running job for ``cudatimer watch``: ``cudatimer.live(path)``,
``cudatimer.sinks.live(path)`` and ``CUDATIMER_LIVE=path``.

A daemon thread takes the Timer's finished steps the way ``StepFeed`` does (a boundary event
per stream and step, queried without blocking: nothing waits for the GPU) and, every
``every_s``, replaces one file per rank (``render/_livefile.py`` has the format): the last
``steps`` finished steps' region times, a reference (the ``steps`` steps after the first
``warmup``), and the regions open right now on each thread with how long they have been
open, read from the recorder's stacks without changing them (``Recorder.open_regions``): a
job stuck in ``train/backward/lm_head`` says so while it is stuck.

What it costs the training thread is the publisher's own work, done under the GIL: reading
the newest steps' rows and turning each into JSON once (~1 us a row on the CPU machine: 2.6
ms of CPU a write for 50 steps of 49 regions, the whole write included). So a write reads at
most ``steps`` steps however many finished, and the thread measures each write's CPU time
and waits at least ``1 / DUTY`` times as long before its next round (every round, the
checks as well as the writes): it holds the GIL at most 0.4% of the time, whatever the model
and the step rate (a model of 200 regions at 50 steps/s or more is then written every ~2.5 s
instead of every second).

At normal exit, on an exception that ends the program and on SIGTERM (any handler that was
installed is called afterwards; the default one then ends the process as it would have), the
file gets a final state holding the whole run as ``save()`` writes it (``cudatimer show``
reads it). A writer killed outright leaves its last file: the viewer sees it stale and its
process gone. Nothing is written in a forked child.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import math
import os
import signal
import socket
import struct
import sys
import threading
import time
import warnings
from collections import deque
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any

from .._config import DISABLED_AT_IMPORT
from ..core import _core
from ..render._export import summary_to_dict
from ..render._livefile import LIVE_FORMAT, LIVE_SCHEMA, MAX_BYTES
from ..render._write import write_atomic
from ..sources import _capture
from ._feed import StepFeed, StepTimes

if TYPE_CHECKING:
    from ..regions._timer import Timer

__all__ = [
    "DUTY",
    "ENV",
    "FINAL_WAIT_S",
    "FROM_ENV",
    "Live",
    "live",
    "live_sink",
    "start_from_env",
]

#: The environment variable that publishes the default Timer with no code change.
ENV = "CUDATIMER_LIVE"
#: The largest share of the time the publishing thread spends on its own work (see above).
DUTY = 0.004
#: How long the final state waits for the GPU to finish the marked steps (and for the whole
#: run's summary): a SIGTERM leaves a job seconds, not minutes, before SIGKILL.
FINAL_WAIT_S = 2.0
# The thread looks for newly finished steps four times per every_s (a few us each: a step
# counter, and on a GPU one event record and query per stream), so a step the GPU finished
# is in the next write, at most every_s + every_s / 4 later.
_CHECKS_PER_WRITE = 4
# Bounds of what one file holds besides the steps: open regions per thread (innermost
# kept), threads, characters of a path, step-rate samples (one per check that saw the step
# change: at 0.25 s apart, 64 cover 16 s or more).
_OPEN_PER_THREAD = 32
_OPEN_THREADS = 64
_PATH_CHARS = 2048
_RATE_SAMPLES = 64
_CLOCKS: dict[int, str] = {-1: "host"}
_unpack_one = struct.Struct("d").unpack


def _clock(dev: int) -> str:
    return _CLOCKS.get(dev) or _CLOCKS.setdefault(dev, f"cuda:{dev}")


def _num(value: float) -> str:
    """A time in ms for the file: 6 significant digits (0.1 us on a 100 ms region)."""
    return format(value, ".6g") if math.isfinite(value) else "null"


def _this_rank() -> tuple[int, int]:
    """(global rank, world size): torch.distributed once initialised, else torchrun's
    environment, else (0, 1)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    try:
        return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 0, 1


def _check_number(name: str, value: object, low: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    if not (math.isfinite(value) and value >= low):
        raise ValueError(f"{name} must be a finite number >= {low:g}, got {value!r}")
    return float(value)


def _check_count(name: str, value: object, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < low:
        raise ValueError(f"{name} must be >= {low}, got {value}")
    return value


class _Step:
    """One finished step as the file holds it: its JSON, made once."""

    __slots__ = ("json", "step")

    def __init__(self, step: int, seen: float, rows: list[str]) -> None:
        self.step = step
        self.json = f"[{step},{seen:.3f},[{','.join(rows)}]]"


# A row of a step: [region, calls, gpu_ms, cpu_ms]; 6 significant digits (0.1 us of a 100
# ms region). %-formatting is the cheapest way found: 0.4 us a row, against 0.64 for an
# f-string and 1.3 for json.dumps of rounded values (CPU machine).
_ROW = "[%d,%d,%.6g,%.6g]"
_HOST_ROW = "[%d,%d,null,%.6g]"
_NAN = math.nan


class Live:
    """The handle of a live publisher: :meth:`close` writes the final state and stops it.
    Made by :func:`cudatimer.live` (which polls the Timer itself) or
    :func:`cudatimer.sinks.live` (a sink: a ``StepFeed`` of an integration calls it with each
    finished step). A context manager too: the final state says ``failed`` when the block
    raised.

    >>> import cudatimer, json, tempfile, os
    >>> timer = cudatimer.Timer(name="live-doc")
    >>> path = os.path.join(tempfile.mkdtemp(), "live.json")
    >>> with cudatimer.live(path, timer=timer) as pub:
    ...     for _ in range(3):
    ...         with timer.region("step"):
    ...             pass
    ...         _ = timer.step()
    >>> data = json.load(open(path))
    >>> data["state"], data["finished"], [r[0] for r in data["regions"]]
    ('finished', 3, ['step'])
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        timer: Timer | None,
        every_s: float,
        steps: int,
        warmup: int,
        *,
        polls: bool,
    ) -> None:
        from ..regions._timer import Timer, default_timer

        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(
                f"path must be a file path (str or os.PathLike), got {type(path).__name__}"
            )
        if timer is None:
            timer = default_timer()
        if not isinstance(timer, Timer):
            raise TypeError(f"timer must be a cudatimer.Timer or None, got {type(timer).__name__}")
        self.every_s = _check_number("every_s", every_s, 0.01)
        self.steps = _check_count("steps", steps, 1)
        self.warmup = _check_count("warmup", warmup, 0)
        if polls and timer.keep_steps == 0:
            raise ValueError(
                "the timer keeps no per-step samples (keep_steps=0), so no step can be "
                "published; create it with Timer(keep_steps=N), N >= 1"
            )
        self.timer = timer
        self.pattern = os.fspath(path)
        if not self.pattern:
            raise ValueError("path must be a file path, got ''")
        self.path = ""  # resolved ({rank}) at the first write
        self.closed = False
        #: CPU seconds the publishing thread has spent on its own work (under the GIL, so
        #: taken from the training thread): what publishing costs, measured as it runs.
        self.busy_s = 0.0
        self.rank, self.world_size = 0, 1
        self._polls = polls
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._owner = os.getpid()
        self._host = socket.gethostname()
        self._started = time.time()
        self._last_write = 0.0
        self._next_write = 0.0
        self._errors = 0
        self._feed = StepFeed(timer=timer) if polls else None
        self._gen = timer.recorder.store.gen
        self._unread: range | None = None  # finished steps not read yet (polls)
        self._given: deque[tuple[StepTimes, float]] = deque(maxlen=self.steps)  # sink
        self._given_ref: deque[tuple[StepTimes, float]] = deque(maxlen=self.steps)
        # What was read of the run (see _clear): regions by (path, clock) and by the store's
        # (slot, device), the kept steps, the reference's sums, the step counter's samples.
        self._index: dict[tuple[str, str], int] = {}
        self._names: list[tuple[str, str]] = []
        self._slots: dict[tuple[int, int], int] = {}
        self._kept: deque[_Step] = deque(maxlen=self.steps)
        self._ref: dict[int, list[float]] = {}
        self._ref_steps = 0
        self._rate: deque[tuple[float, int]] = deque(maxlen=_RATE_SAMPLES)
        self._finished = 0
        self._last_step: float | None = None

    # -- what users call ---------------------------------------------------------------------
    def close(self) -> None:
        """Write the final state (``finished``) and stop publishing. Idempotent."""
        self._finish("finished", "")

    def __enter__(self) -> Live:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self._finish("finished", "")
        else:
            self._finish("failed", _reason(exc_type, exc))

    def __call__(self, times: StepTimes) -> None:
        """A finished step from a ``StepFeed`` (sink use): kept for the next write; the
        thread starts with the first step."""
        if not isinstance(times, StepTimes):
            raise TypeError(f"a live sink takes cudatimer.StepTimes, got {type(times).__name__}")
        if self.closed or self._polls:
            return
        now = time.time()
        self._given.append((times, now))
        if self.warmup <= times.step < self.warmup + self.steps:
            self._given_ref.append((times, now))
        if self._thread is None:
            with self._lock:
                if self._thread is None and not self.closed:
                    try:
                        self._start()
                    except (OSError, ValueError) as exc:  # said once; the feed goes on
                        self.closed = True
                        warnings.warn(
                            f"cudatimer.sinks.live: publishing to {self.pattern!r} could not "
                            f"start: {exc}",
                            RuntimeWarning,
                            stacklevel=2,
                        )

    def __repr__(self) -> str:
        state = "closed" if self.closed else "publishing"
        return (
            f"<cudatimer live {self.path or self.pattern!r} ({state}, timer {self.timer.name!r})>"
        )

    # -- starting ----------------------------------------------------------------------------
    def _start(self, lazy: bool = False) -> None:
        """Start the thread; the first state is written here (errors raise in the caller)
        or, ``lazy``, by the thread once the Timer has seen a region (CUDATIMER_LIVE)."""
        self._next_write = time.monotonic() + self.every_s
        if not lazy:
            self._begin()
        _install_hooks()
        self._thread = threading.Thread(target=self._run, name="cudatimer-live", daemon=True)
        self._thread.start()

    def _begin(self) -> None:
        """Resolve the path ({rank}) and write the first state."""
        self.rank, self.world_size = _this_rank()
        if self.world_size > 1 and "{rank}" not in self.pattern:
            raise ValueError(
                f"path {self.pattern!r} has no {{rank}} and this job has {self.world_size} "
                "ranks: each would overwrite the others' file; use e.g. 'live/rank{rank}.json'"
            )
        path = os.path.abspath(self.pattern.replace("{rank}", str(self.rank)))
        with _registry_lock:
            for other in _publishers:
                if other is not self and other.path == path and not other.closed:
                    raise ValueError(
                        f"{path} is already published by {other!r} in this process; give "
                        "each live publisher its own file"
                    )
            self.path = path
            try:
                self._write("running", "", None)
            except BaseException:
                self.path = ""
                raise
            _publishers.append(self)

    def _ready(self) -> bool:
        """CUDATIMER_LIVE: the Timer has seen a region, in a process that is not a worker
        (a multiprocessing child without torch.distributed: a DataLoader worker would write
        its parent's file)."""
        if not self.timer.recorder.tree.roots:
            return False
        import multiprocessing

        import torch.distributed as dist

        if multiprocessing.parent_process() is None:
            return True
        return bool(dist.is_available() and dist.is_initialized())

    # -- the thread --------------------------------------------------------------------------
    def _run(self) -> None:
        check_s = self.every_s / _CHECKS_PER_WRITE
        wait_s = check_s
        while not self._stop.wait(wait_s):
            if not self.path:  # lazy (CUDATIMER_LIVE): nothing written yet
                try:
                    with self._lock:
                        if self.closed:
                            return
                        if not self._ready():
                            continue
                        self._begin()
                except Exception as exc:
                    self.closed = True
                    warnings.warn(
                        f"cudatimer: {ENV}={self.pattern!r}: publishing could not start: {exc}",
                        RuntimeWarning,
                        stacklevel=1,
                    )
                    return
            start = time.thread_time()
            try:
                with self._lock:
                    if self.closed:
                        return
                    self._check()
                    if time.monotonic() >= self._next_write:
                        cpu0 = time.thread_time()
                        self._read()
                        self._write("running", "", None)
                        work_s = time.thread_time() - cpu0
                        self._next_write = time.monotonic() + max(self.every_s, work_s / DUTY)
            except Exception as exc:  # publishing must never stop the run
                self._errors += 1
                if self._errors == 1:
                    warnings.warn(
                        f"cudatimer.live: publishing {self.path} failed: {exc!r}; trying again "
                        "every round (the run goes on)",
                        RuntimeWarning,
                        stacklevel=1,
                    )
                self._next_write = time.monotonic() + self.every_s
            finally:
                spent_s = time.thread_time() - start
                self.busy_s += spent_s
                # Every round counts against DUTY, the checks as well as the writes: with
                # only the writes budgeted, GPT-2 on an H200 (125 regions a step, 38 steps
                # a second) had the thread at 0.66% of wall time, the checks' event queries
                # the difference.
                wait_s = max(check_s, spent_s / DUTY)

    def _check(self) -> None:
        """Note the step counter, and (polling) which steps the GPU has finished."""
        store = self.timer.recorder.store
        if store.gen != self._gen:  # reset(): the run's steps start again from 0
            self._gen = store.gen
            self._clear()
        marked = store.step
        if not self._rate or self._rate[-1][1] != marked:
            self._rate.append((time.time(), marked))
        if self._feed is None:
            return
        with _capture.no_capture() as quiet:
            if not quiet:  # a CUDA graph is being captured: no event may be queried now
                return
            done = self._feed.advance()
        if len(done):
            start = self._unread.start if self._unread is not None else done.start
            self._unread = range(start, done.stop)
            self._finished = done.stop
            self._last_step = time.time()

    def _clear(self) -> None:
        """Forget every step read (a new publisher, or the Timer's reset())."""
        self._index = {}
        self._names = []
        self._slots = {}
        self._kept = deque(maxlen=self.steps)
        self._ref = {}
        self._ref_steps = 0
        self._rate = deque(maxlen=_RATE_SAMPLES)
        self._finished = 0
        self._last_step = None
        self._unread = None
        self._given.clear()
        self._given_ref.clear()

    # -- reading steps -----------------------------------------------------------------------
    def _read(self) -> None:
        if self._feed is None:
            self._read_given()
            return
        unread, self._unread = self._unread, None
        if unread is None:
            return
        store = self.timer.recorder.store
        newest = range(max(unread.start, unread.stop - self.steps), unread.stop)
        early = range(max(unread.start, self.warmup), min(newest.start, self.warmup + self.steps))
        seen = self._last_step or time.time()
        if len(early):  # reference steps older than the newest: summed, not kept
            self._ingest(store.step_rows(early.start, early.stop), seen, keep=False)
        self._ingest(store.step_rows(newest.start, newest.stop), seen, keep=True)

    def _ingest(self, rows: list[Any], seen: float, keep: bool) -> None:
        """The store's rows of whole steps (in step order) as the kept steps' JSON (``keep``)
        and, for the reference's steps, its sums. Written for ~2,500 rows a write (50 steps
        of 50 regions): each row is turned into its JSON text at once, without an object in
        between (~1 us a row; a tuple per row and the text made later cost 1.5-3 us)."""
        tree = self.timer.recorder.tree
        slots = self._slots
        unpack = _unpack_one
        fsum = math.fsum
        lo, hi = self.warmup, self.warmup + self.steps
        parts: list[str] | None = None
        current = -1
        in_ref = False
        for step, slot, dev, gpu_b, cpu_b in rows:  # SeriesRow, unpacked: no attribute reads
            if step != current:
                if parts is not None and keep:
                    self._kept.append(_Step(current, seen, parts))
                parts, current = [], step
                in_ref = lo <= step < hi and self._ref_steps < self.steps
                if in_ref:
                    self._ref_steps += 1
            idx = slots.get((slot, dev))
            if idx is None:
                try:
                    name = tree.path(slot)
                except KeyError:  # forgotten by a racing reset(): left out
                    continue
                idx = slots[(slot, dev)] = self._region(name, _clock(dev))
            if len(cpu_b) == 8:
                n = 1
                cpu = unpack(cpu_b)[0]
                gpu = unpack(gpu_b)[0] if dev >= 0 else _NAN
            else:
                n = len(cpu_b) >> 3
                cpu = fsum(memoryview(cpu_b).cast("d"))
                gpu = fsum(memoryview(gpu_b).cast("d")) if dev >= 0 else _NAN
            if gpu == gpu:  # not NaN: timed on a GPU
                parts.append(_ROW % (idx, n, gpu, cpu))  # type: ignore[union-attr]
            else:
                parts.append(_HOST_ROW % (idx, n, cpu))  # type: ignore[union-attr]
            if in_ref:
                self._add_ref(idx, n, gpu, cpu)
        if parts is not None and keep:
            self._kept.append(_Step(current, seen, parts))

    def _read_given(self) -> None:
        given, refs = _drain_deque(self._given), _drain_deque(self._given_ref)
        newest = {t.step for t, _ in given}
        lo, hi = self.warmup, self.warmup + self.steps
        for times, seen in [(t, s) for t, s in refs if t.step not in newest] + given:
            in_ref = lo <= times.step < hi and self._ref_steps < self.steps
            if in_ref:
                self._ref_steps += 1
            parts = []
            for name, clock, calls, gpu, cpu in times.rows:
                idx = self._index.get((name, clock))
                if idx is None:
                    idx = self._region(name, clock)
                g = _NAN if gpu is None else gpu
                parts.append(
                    _ROW % (idx, calls, g, cpu) if g == g else _HOST_ROW % (idx, calls, cpu)
                )
                if in_ref:
                    self._add_ref(idx, calls, g, cpu)
            if times.step in newest:
                self._kept.append(_Step(times.step, seen, parts))
                self._finished = max(self._finished, times.step + 1)
                self._last_step = seen

    def _region(self, name: str, clock: str) -> int:
        idx = self._index.get((name, clock))
        if idx is None:
            idx = self._index[(name, clock)] = len(self._names)
            self._names.append((name[:_PATH_CHARS], clock))
        return idx

    def _add_ref(self, idx: int, n: int, gpu: float, cpu: float) -> None:
        acc = self._ref.get(idx)
        if acc is None:
            acc = self._ref[idx] = [0, 0.0, 0.0]
        acc[0] += n
        acc[1] += gpu  # NaN on the host clock stays NaN: written as null
        acc[2] += cpu

    # -- writing -----------------------------------------------------------------------------
    def _open_now(self) -> list[dict[str, Any]]:
        now = _core.now_ns()
        names = {t.ident: t.name for t in threading.enumerate()}
        threads = []
        for tid, frames in self.timer.recorder.open_regions()[:_OPEN_THREADS]:
            kept = frames[-_OPEN_PER_THREAD:]
            threads.append(
                {
                    "thread": names.get(tid, f"thread {tid}"),
                    "regions": [
                        [path[:_PATH_CHARS], round((now - t0) * 1e-9, 3) if t0 > 0 else None]
                        for path, t0 in kept
                    ],
                }
            )
        threads.sort(key=lambda t: t["thread"] != "MainThread")
        return threads

    def _write(self, state: str, reason: str, summary: dict[str, Any] | None) -> None:
        now = time.time()
        store = self.timer.recorder.store
        reference = None
        if self._ref_steps:
            reference = {
                "first": self.warmup,
                "stop": self.warmup + self.steps,
                "steps": self._ref_steps,
                "rows": "@REF@",
            }
        head: dict[str, Any] = {
            "format": LIVE_FORMAT,
            "schema": LIVE_SCHEMA,
            "state": state,
            "reason": reason,
            "pid": os.getpid(),
            "host": self._host,
            "rank": self.rank,
            "world_size": self.world_size,
            "timer": self.timer.name,
            "started_unix_s": round(self._started, 3),
            "updated_unix_s": round(now, 3),
            "every_s": self.every_s,
            "keep": self.steps,
            "step": store.step,
            "finished": self._finished,
            "last_step_unix_s": None if self._last_step is None else round(self._last_step, 3),
            "rate": [[round(t, 3), s] for t, s in self._rate],
            "regions": self._names,
            "reference": reference,
            "open": self._open_now(),
            "steps": "@STEPS@",
            "summary": "@SUMMARY@",
        }
        text = json.dumps(head, separators=(",", ":"))
        ref_json = ",".join(
            f"[{i},{int(n)},{_num(g)},{_num(c)}]" for i, (n, g, c) in sorted(self._ref.items())
        )
        summary_json = "null" if summary is None else json.dumps(summary, separators=(",", ":"))
        budget = MAX_BYTES - len(text.encode()) - len(ref_json) - 64
        if len(summary_json) > budget:  # the whole run does not fit: the steps do
            summary_json = "null"
        budget -= len(summary_json)
        kept: list[str] = []
        for step in reversed(self._kept):  # the newest first, while they fit
            size = len(step.json) + 2
            if size > budget:
                break
            budget -= size
            kept.append(step.json)
        kept.reverse()
        text = (
            text.replace('"@REF@"', f"[{ref_json}]", 1)
            .replace('"@STEPS@"', "[\n" + ",\n".join(kept) + "\n]", 1)
            .replace('"@SUMMARY@"', summary_json, 1)
        )
        write_atomic(self.path, (text + "\n").encode())
        self._last_write = now

    # -- the end -----------------------------------------------------------------------------
    def _finish(self, state: str, reason: str, wait_s: float = FINAL_WAIT_S) -> None:
        """Write the final state once (the GPU waited for at most ``wait_s``, by polling).
        A second caller (the signal handler while the watcher thread writes) waits for the
        first: the publisher leaves the registry only once its final state is written."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            self._stop.set()
            try:
                if self.path and os.getpid() == self._owner:  # not a sink no step reached
                    self._final(state, reason, time.monotonic() + wait_s)
            finally:
                with _registry_lock:
                    if self in _publishers:
                        _publishers.remove(self)
                _uninstall_hooks()

    def _final(self, state: str, reason: str, deadline: float) -> None:
        try:
            self._drain(deadline)
            self._read()
        except Exception as exc:  # the final state is written with what was read
            reason = reason or f"reading the last steps failed: {exc!r}"
        summary = _summary_within(self.timer, max(0.1, deadline - time.monotonic()))
        if summary is not None:
            summary["meta"].update(
                {"rank": str(self.rank), "world_size": str(self.world_size), "host": self._host}
            )
        try:
            self._write(state, reason, summary)
        except Exception as exc:
            warnings.warn(
                f"cudatimer.live: the final state of {self.path} was not written: {exc!r}",
                RuntimeWarning,
                stacklevel=4,
            )

    def _drain(self, deadline: float) -> None:
        """Poll (never a blocking CUDA call) until the marked steps are finished or time is
        up."""
        if self._feed is None:
            return
        pause = 1e-4
        while True:
            self._check()
            if self._finished >= self.timer.recorder.store.step or time.monotonic() >= deadline:
                return
            time.sleep(pause)
            pause = min(pause * 2, 0.02)


def _drain_deque(items: deque[Any]) -> list[Any]:
    """What another thread appended so far, taken out oldest first (popleft and append are
    atomic; a copy then a clear() would lose what came in between)."""
    out = []
    while items:
        out.append(items.popleft())
    return out


def _reason(exc_type: type[BaseException], exc: BaseException | None) -> str:
    text = f"{exc_type.__name__}: {exc}" if exc is not None and str(exc) else exc_type.__name__
    line = text.splitlines()[0] if text else exc_type.__name__
    return line if len(line) <= 200 else line[:197] + "..."


def _summary_within(timer: Timer, timeout_s: float) -> dict[str, Any] | None:
    """The whole run's summary as ``save()`` writes it (without the per-step rows and the
    trace, which the live file bounds), made on a helper thread joined with a deadline: at a
    signal the interrupted thread may hold a lock of the recorder. None when late or failed."""
    out: list[dict[str, Any]] = []

    def work() -> None:
        with contextlib.suppress(Exception):
            s = timer.summary(timeout_s=timeout_s)
            out.append(summary_to_dict(dataclasses.replace(s, step_stats=(), trace=())))

    worker = threading.Thread(target=work, name="cudatimer-live-final", daemon=True)
    worker.start()
    worker.join(timeout_s + 1.0)
    return out[0] if out else None


# -- process hooks: exit, uncaught exceptions, SIGTERM, fork -----------------------------------
_registry_lock = threading.RLock()
_publishers: list[Live] = []
_hooks = {"installed": False}
_failure: list[str] = []  # the uncaught exception that is ending the program
_previous: dict[str, Any] = {}
# After a SIGTERM whose handler did not run (the main thread stuck in C code: a collective,
# a CUDA call), the default action is taken this long after the final state is written.
_GRACE_S = 1.0


def _install_hooks() -> None:
    """Chain ``sys.excepthook`` and, from the main thread, SIGTERM (unless ignored). Python
    runs a signal handler only when the main thread runs Python code, and a hung job's main
    thread may never: so the signal is also seen through the interpreter's wakeup file (when
    nothing else uses it, e.g. asyncio), by a watcher thread that writes the final state and
    then, if the handler still has not run and the previous one was the default, ends the
    process as the default would have."""
    with _registry_lock:
        if _hooks["installed"]:
            return
        _hooks["installed"] = True
        _previous["excepthook"] = sys.excepthook
        sys.excepthook = _excepthook
        if threading.current_thread() is not threading.main_thread():
            return
        current = signal.getsignal(signal.SIGTERM)
        if current is signal.SIG_IGN or current is None:
            return
        try:
            signal.signal(signal.SIGTERM, _on_sigterm)
        except (ValueError, OSError):
            return
        _previous["sigterm"] = current
        _watch_wakeups()


def _watch_wakeups() -> None:
    if os.name != "posix" or "wakeup" in _previous:
        return
    r, w = os.pipe()
    os.set_blocking(w, False)
    try:
        old = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    except (ValueError, OSError):
        os.close(r)
        os.close(w)
        return
    if old != -1:  # someone else's (asyncio): theirs stays
        signal.set_wakeup_fd(old)
        os.close(r)
        os.close(w)
        return
    _previous["wakeup"] = (r, w)
    threading.Thread(target=_watcher, args=(r,), name="cudatimer-live-signals", daemon=True).start()


def _watcher(fd: int) -> None:
    while True:
        try:
            data = os.read(fd, 64)
        except OSError:
            return
        if not data:
            return
        if signal.SIGTERM in data:
            if signal.getsignal(signal.SIGTERM) is not _on_sigterm:
                continue  # a handler installed after ours owns the signal now
            previous = _previous.get("sigterm", signal.SIG_DFL)
            for pub in list(_publishers):
                pub._finish("terminated", "SIGTERM")
            if previous is signal.SIG_DFL:  # even with nothing published: as without us
                time.sleep(_GRACE_S)  # the handler, if the main thread runs, ends it first
                _default_action(signal.SIGTERM)


def _default_action(signum: int) -> None:
    """End the process by ``signum`` from any thread (``signal.signal`` is main-thread only):
    the disposition reset through libc, then the signal sent again."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.signal.restype = ctypes.c_void_p
    libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.signal(signum, None)  # SIG_DFL
    os.kill(os.getpid(), signum)


def _uninstall_hooks() -> None:
    with _registry_lock:
        if _publishers or not _hooks["installed"]:
            return
        if threading.current_thread() is not threading.main_thread() and "sigterm" in _previous:
            return  # signal handlers can be put back from the main thread only
        _hooks["installed"] = False
        if sys.excepthook is _excepthook:
            sys.excepthook = _previous.pop("excepthook")
        if "sigterm" in _previous:
            with contextlib.suppress(ValueError, OSError):
                if signal.getsignal(signal.SIGTERM) is _on_sigterm:
                    signal.signal(signal.SIGTERM, _previous["sigterm"])
            _previous.pop("sigterm")
        wake = _previous.pop("wakeup", None)
        if wake is not None:
            with contextlib.suppress(ValueError, OSError):
                if signal.set_wakeup_fd(-1) != wake[1]:  # replaced since: theirs stays
                    signal.set_wakeup_fd(-1)
            with contextlib.suppress(OSError):
                os.close(wake[1])  # the watcher reads end-of-file and stops


def _excepthook(
    exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None
) -> None:
    _failure.append(_reason(exc_type, exc))
    previous = _previous.get("excepthook") or sys.__excepthook__
    previous(exc_type, exc, tb)


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    previous = _previous.get("sigterm", signal.SIG_DFL)  # before _finish puts it back
    for pub in list(_publishers):
        pub._finish("terminated", "SIGTERM")
    if callable(previous):
        previous(signum, frame)
        return
    # The default action: end the process by the signal, as it would have without us.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def _at_exit() -> None:
    reason = _failure[-1] if _failure else ""
    for pub in list(_publishers):
        pub._finish("failed" if reason else "finished", reason)


def _forget_in_child() -> None:
    """A forked child (a DataLoader worker) publishes nothing: the file is its parent's."""
    with contextlib.suppress(Exception):
        for pub in list(_publishers):
            pub.closed = True
        _publishers.clear()
        if "wakeup" in _previous:  # the pipe is the parent's: its watcher must not read ours
            signal.set_wakeup_fd(-1)


atexit.register(_at_exit)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


# -- the three ways in -----------------------------------------------------------------------
def live(
    path: str | os.PathLike[str],
    timer: Timer | None = None,
    *,
    every_s: float = 1.0,
    steps: int = 50,
    warmup: int = 5,
) -> Live:
    """Publish ``timer`` (default: the module's) to ``path`` for ``cudatimer watch``: every
    ``every_s`` the last ``steps`` finished steps' region times, the regions open right now
    and how long, from a daemon thread that never waits for the GPU; a final state at exit,
    on an uncaught exception and on SIGTERM. ``{rank}`` in ``path`` becomes the global rank
    (one file per rank). The changes ``watch`` shows are against the ``steps`` steps after the
    first ``warmup``. Returns the handle; ``close()`` ends publishing. The first state is
    written before this returns (a path that cannot be written raises here).

    >>> import cudatimer, tempfile, os
    >>> pub = cudatimer.live(os.path.join(tempfile.mkdtemp(), "rank{rank}.json"),
    ...                      timer=cudatimer.Timer(name="live-fn"))
    >>> os.path.basename(pub.path)
    'rank0.json'
    >>> pub.close()
    """
    pub = Live(path, timer, every_s, steps, warmup, polls=True)
    pub._start()
    return pub


def live_sink(
    path: str | os.PathLike[str],
    timer: Timer | None = None,
    *,
    every_s: float = 1.0,
    steps: int = 50,
    warmup: int = 5,
) -> Live:
    """``cudatimer.live`` as a sink for a ``StepFeed`` that someone else polls (the Lightning
    and Hugging Face callbacks): it publishes the steps it is given. ``timer``: the Timer
    whose open regions it shows (default: the module's). The file is written from the first
    step on."""
    return Live(path, timer, every_s, steps, warmup, polls=False)


def start_from_env(environ: dict[str, str] | None = None) -> Live | None:
    """``CUDATIMER_LIVE=path``: publish the default Timer there, from the first region on
    (None when unset or under CUDATIMER_DISABLE). A path that cannot be written is warned
    about once, and the program runs on. A process that never enters a region (the
    ``cudatimer`` command itself) and a DataLoader worker write nothing."""
    env = os.environ if environ is None else environ
    path = env.get(ENV, "").strip()
    if not path or DISABLED_AT_IMPORT:
        return None
    try:
        pub = Live(path, None, 1.0, 50, 5, polls=True)
        pub._start(lazy=True)
    except (OSError, ValueError, TypeError) as exc:
        warnings.warn(
            f"cudatimer: {ENV}={path!r} is set but publishing could not start: {exc}",
            RuntimeWarning,
            stacklevel=2,
        )
        return None
    return pub


#: The publisher CUDATIMER_LIVE started at import (None: not set).
FROM_ENV: Live | None = start_from_env()
