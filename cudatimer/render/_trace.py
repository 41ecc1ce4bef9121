"""Trace export: the last ``trace_samples`` calls on their timelines, as a Chrome/Perfetto trace.

GPU spans are placed on the GPU's own clock: each stream has a reference event recorded when
the stream was first seen, and the harvest reads where each sample's start event happened
after it (the core's ``StreamRec``), so the ring holds numbers, not events. The read goes
through an anchor event that moves forward along the traced samples once it is 100 ms behind,
because ``cudaEventElapsedTime`` returns a float32 of milliseconds (an hour after the reference
only good to 0.25 ms); the anchors' positions add up in double, which keeps microseconds over
hours while samples keep coming. The first sample after a long gap is read across the whole
gap: good to ~6e-8 of it (0.2 ms after an idle hour).

Host spans (every region's enter to exit) go on one track per thread. GPU and host timelines
are joined through the host clock read right after each reference event was recorded; the
alignment is off by however long that event waited in the stream's queue (nothing, on a
stream first seen while idle).
"""

from __future__ import annotations

import json
import os
from typing import IO, Any

from ..records._records import Summary
from ._write import to_file

__all__ = ["render_trace", "to_chrome", "write_chrome"]

FORMAT = "cudatimer.trace"


def _lanes(spans: list[tuple[float, float, int]]) -> dict[int, int]:
    """Give each span (start, end, id) of one track a lane in which spans nest strictly.

    Regions of one thread nest by construction, but spans of two threads sharing a stream, or
    async regions of one thread, can overlap without nesting; viewers then draw them wrongly,
    so each such span goes to the first lane where it fits inside the open span (or stands
    alone).
    """
    lanes: list[list[float]] = []  # per lane: stack of end times of open spans
    placed: dict[int, int] = {}
    for start, end, ident in sorted(spans, key=lambda s: (s[0], -s[1])):
        for index, stack in enumerate(lanes):
            while stack and stack[-1] <= start:
                stack.pop()
            if not stack or end <= stack[-1]:
                stack.append(end)
                placed[ident] = index
                break
        else:
            lanes.append([end])
            placed[ident] = len(lanes) - 1
    return placed


def _pid_of_clock(clock: str) -> int:
    # pid 1 is the host; GPU n is pid 100 + n (the host sorts first in both viewers).
    return 100 + int(clock.split(":", 1)[1]) if clock.startswith("cuda:") else 1


def to_chrome(summary: Summary) -> dict[str, Any]:
    """A Chrome trace-event document (JSON object format) of ``summary.trace``.

    One process per device ("GPU 0") with a track per stream, and a "host" process with a track
    per thread. Each call is a complete ("X") event named after the region (its leaf name;
    ``args.region`` holds the path), timestamps in microseconds after the trace's first instant.
    """
    if not isinstance(summary, Summary):
        raise TypeError(f"summary must be a cudatimer.Summary, got {type(summary).__name__}")
    # (pid, track key) -> list of (start us, end us, span index)
    tracks: dict[tuple[int, Any], list[tuple[float, float, int]]] = {}
    spans: list[dict[str, Any]] = []
    for s in summary.trace:
        leaf = s.name.rsplit("/", 1)[-1]
        args = {"region": s.name, "step": s.step, "clock": s.clock, "cpu_ms": s.cpu_ms}
        if s.gpu_start_ms is not None and s.gpu_ms is not None:
            pid = _pid_of_clock(s.clock)
            args_gpu = dict(args, gpu_ms=s.gpu_ms)
            start_us = s.gpu_start_ms * 1e3
            spans.append(
                {
                    "name": leaf,
                    "cat": "gpu",
                    "ph": "X",
                    "ts": start_us,
                    "dur": s.gpu_ms * 1e3,
                    "pid": pid,
                    "args": args_gpu,
                    "_track": (pid, ("stream", s.stream)),
                }
            )
        if s.cpu_ms == 0 and s.gpu_ms is not None:
            continue  # replayed inside a CUDA graph: the host ran nothing of it
        start_us = s.host_start_ms * 1e3
        spans.append(
            {
                "name": leaf,
                "cat": "host",
                "ph": "X",
                "ts": start_us,
                "dur": s.cpu_ms * 1e3,
                "pid": 1,
                "args": args,
                "_track": (1, ("thread", s.thread, s.thread_name)),
            }
        )
    for index, span in enumerate(spans):
        tracks.setdefault(span["_track"], []).append((span["ts"], span["ts"] + span["dur"], index))
    events: list[dict[str, Any]] = []
    pids: set[int] = set()
    tid = 0
    for (pid, key), members in sorted(tracks.items(), key=lambda kv: (kv[0][0], str(kv[0][1]))):
        pids.add(pid)
        placed = _lanes(members)
        label = f"stream {key[1]}" if key[0] == "stream" else str(key[2])
        base = tid + 1
        for lane in range(max(placed.values()) + 1):
            name = label if lane == 0 else f"{label} ({lane + 1})"
            events.append(
                {
                    "name": "thread_name",
                    "ph": "M",
                    "pid": pid,
                    "tid": base + lane,
                    "args": {"name": name},
                }
            )
            events.append(
                {
                    "name": "thread_sort_index",
                    "ph": "M",
                    "pid": pid,
                    "tid": base + lane,
                    "args": {"sort_index": base + lane},
                }
            )
        for _, _, index in members:
            spans[index]["tid"] = base + placed[index]
        tid = base + max(placed.values())
    for pid in sorted(pids):
        name = "host" if pid == 1 else f"GPU {pid - 100}"
        events.append({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": name}})
        events.append(
            {"name": "process_sort_index", "ph": "M", "pid": pid, "args": {"sort_index": pid}}
        )
    for span in spans:
        del span["_track"]
        # Whole nanoseconds at both ends: rounding each end (not the duration) is monotonic, so
        # a child that ends inside its parent still does after rounding.
        start, end = round(span["ts"], 3), round(span["ts"] + span["dur"], 3)
        span["ts"], span["dur"] = start, round(end - start, 3)
    events.extend(sorted(spans, key=lambda e: (e["pid"], e["tid"], e["ts"], -e["dur"])))
    meta = dict(summary.meta)
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"format": FORMAT, **meta},
    }


def render_trace(summary: Summary) -> str:
    """``to_chrome(summary)`` as JSON text (refused when the summary holds no trace samples)."""
    if isinstance(summary, Summary) and not summary.trace:
        raise ValueError(
            "nothing to trace: this summary holds no trace samples (take it with "
            "summary(trace=True), or save() the run; Timer(trace_samples=0) keeps none)"
        )
    return json.dumps(to_chrome(summary), allow_nan=False) + "\n"


def write_chrome(summary: Summary, path: str | os.PathLike[str] | IO[str]) -> None:
    """Write ``render_trace(summary)`` to a path (atomically: a failure, e.g. a NaN that
    ``allow_nan=False`` refuses, leaves neither a temporary file nor half a trace, and a
    previous file as it was) or a text stream."""
    target = to_file(path)
    target.write(render_trace(summary))
