"""The live file: what ``cudatimer.live`` publishes while a run goes on and ``cudatimer watch``
reads. One JSON object per rank, replaced atomically (never seen half written), at most
``MAX_BYTES``::

    {"format": "cudatimer.live", "schema": 1,
     "state": "running" | "finished" | "failed" | "terminated", "reason": "",
     "pid": 4242, "host": "node1", "rank": 0, "world_size": 1, "timer": "default",
     "started_unix_s": ..., "updated_unix_s": ..., "every_s": 1.0, "keep": 50,
     "step": 412,                   # steps marked so far (the one in progress)
     "finished": 410,               # steps whose GPU work finished
     "last_step_unix_s": ...,       # when the newest of them was seen finished (null: none)
     "rate": [[unix_s, step], ...], # the marked step, sampled as the run went (steps/s)
     "regions": [[path, clock], ...],
     "steps": [[step, seen_unix_s, [[region, calls, gpu_ms | null, cpu_ms], ...]], ...],
     "reference": {"first": 5, "stop": 55, "steps": 50, "rows": [[region, calls, gpu_ms, cpu_ms]]},
     "open": [{"thread": "MainThread", "regions": [[path, open_s | null], ...]}, ...],
     "summary": {...}}              # final states only: the whole run, as save() writes it

``steps`` holds the last ``keep`` finished steps, oldest first; a row's ``region`` indexes
``regions``, its times are the step's sums over its calls (``gpu_ms`` null on the host clock).
``reference`` sums the steps ``first`` to ``stop - 1`` (the ``steps`` of them seen so far).
``open`` lists, per thread, the regions open when the file was written, outermost first, with
how long each had been open (null: the call keeps no start time). ``summary`` is what
``cudatimer show`` and ``cudatimer.load`` read of a final state.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

from ._export import FORMAT as SUMMARY_FORMAT
from ._export import LIVE_FORMAT, RANKS_FORMAT, read_json

__all__ = [
    "FINAL_STATES",
    "LIVE_FORMAT",
    "LIVE_SCHEMA",
    "MAX_BYTES",
    "STATES",
    "LiveFile",
    "LiveStep",
    "OpenThread",
    "Reference",
    "parse_live",
    "read_live",
]

LIVE_SCHEMA = 1
#: A live file never grows past this (the writer drops the oldest steps first): a viewer
#: polling several ranks' files each second reads a few MiB at most.
MAX_BYTES = 1 << 20
#: Files larger than this are refused unread: not one of ours (or not written by this
#: version, which stays under MAX_BYTES).
_READ_LIMIT_BYTES = 16 * MAX_BYTES
STATES = ("running", "finished", "failed", "terminated")
FINAL_STATES = frozenset(STATES[1:])

Row = tuple[int, int, "float | None", float]


@dataclass(frozen=True)
class LiveStep:
    """One finished step: its number, when the writer saw it finished, and its rows
    ``(region index, calls, gpu_ms or None, cpu_ms)``."""

    step: int
    seen_unix_s: float
    rows: tuple[Row, ...]


@dataclass(frozen=True)
class Reference:
    """Summed rows of the steps ``first`` to ``stop - 1`` (``steps`` of them seen)."""

    first: int
    stop: int
    steps: int
    rows: tuple[Row, ...]


@dataclass(frozen=True)
class OpenThread:
    """The regions open on one thread when the file was written, outermost first:
    ``(path, seconds open or None)``."""

    thread: str
    regions: tuple[tuple[str, float | None], ...]


@dataclass(frozen=True)
class LiveFile:
    """A live file as read (every field checked)."""

    path: str
    state: str
    reason: str
    pid: int
    host: str
    rank: int
    world_size: int
    timer: str
    started_unix_s: float
    updated_unix_s: float
    every_s: float
    keep: int
    step: int
    finished: int
    last_step_unix_s: float | None
    rate: tuple[tuple[float, int], ...]
    regions: tuple[tuple[str, str], ...]
    steps: tuple[LiveStep, ...]
    reference: Reference | None
    open: tuple[OpenThread, ...]
    has_summary: bool

    @property
    def final(self) -> bool:
        return self.state in FINAL_STATES


class _Bad(ValueError):
    pass


def _shown(value: object) -> str:
    text = repr(value) if not isinstance(value, (dict, list)) else type(value).__name__
    return text if len(text) <= 40 else f"{text[:30]}... ({len(text)} characters)"


def _need(ok: bool, where: str, expected: str, value: object) -> None:
    if not ok:
        raise _Bad(f"{where} must be {expected}, got {_shown(value)}")


def _int(value: object, where: str) -> int:
    _need(type(value) is int and value >= 0, where, "an integer >= 0", value)  # type: ignore[operator]
    return value  # type: ignore[return-value]


def _num(value: object, where: str) -> float:
    ok = type(value) in (int, float) and math.isfinite(value) and value >= 0  # type: ignore[arg-type,operator]
    _need(ok, where, "a finite number >= 0", value)
    return float(value)  # type: ignore[arg-type]


def _opt_num(value: object, where: str) -> float | None:
    return None if value is None else _num(value, where)


def _str(value: object, where: str) -> str:
    _need(isinstance(value, str), where, "a string", value)
    return value  # type: ignore[return-value]


def _list(value: object, where: str, size: int | None = None) -> list[Any]:
    ok = isinstance(value, list) and (size is None or len(value) == size)
    _need(ok, where, "a list" if size is None else f"a list of {size}", value)
    return value  # type: ignore[return-value]


def _rows(value: object, where: str, regions: int) -> tuple[Row, ...]:
    out = []
    for i, row in enumerate(_list(value, where)):
        at = f"{where}[{i}]"
        idx, calls, gpu, cpu = _list(row, at, 4)
        _need(type(idx) is int and 0 <= idx < regions, f"{at}[0]", "a region index", idx)
        out.append((idx, _int(calls, f"{at}[1]"), _opt_num(gpu, f"{at}[2]"), _num(cpu, f"{at}[3]")))
    return tuple(out)


def parse_live(data: Any, path: str = "live file") -> LiveFile:
    """A live file's JSON as a :class:`LiveFile`; a one-line ValueError naming ``path`` and
    what is wrong for anything else (another cudatimer file says what it is and what reads
    it)."""
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a cudatimer live file (a JSON {type(data).__name__})")
    fmt = data.get("format")
    if fmt != LIVE_FORMAT:
        if fmt == SUMMARY_FORMAT:
            raise ValueError(
                f"{path}: a saved run (format {SUMMARY_FORMAT!r}), not a live file: read it with "
                f"`cudatimer show {path}`, or watch against it with --against"
            )
        if fmt == RANKS_FORMAT:
            raise ValueError(
                f"{path}: a merged cross-rank file, not a live file: read it with "
                f"`python -m cudatimer.distributed show {path}`"
            )
        raise ValueError(
            f"{path}: not a cudatimer live file (no 'format': {LIVE_FORMAT!r}; it is written "
            "by cudatimer.live(path) or CUDATIMER_LIVE=path)"
        )
    schema = data.get("schema")
    if schema != LIVE_SCHEMA or type(schema) is not int:
        raise ValueError(
            f"{path}: live file schema {_shown(schema)} is not the one this cudatimer reads "
            f"({LIVE_SCHEMA}); run the same cudatimer version as the job"
        )
    try:
        return _fields(data, path)
    except _Bad as exc:
        raise ValueError(f"{path}: malformed cudatimer live file: {exc}") from None
    except (TypeError, ValueError, KeyError) as exc:  # a shape the checks above missed
        raise ValueError(f"{path}: malformed cudatimer live file: {exc!r}") from None


def _fields(d: dict[str, Any], path: str) -> LiveFile:
    state = d.get("state")
    _need(state in STATES, "state", f"one of {', '.join(STATES)}", state)
    regions = []
    for i, item in enumerate(_list(d.get("regions"), "regions")):
        name, clock = _list(item, f"regions[{i}]", 2)
        regions.append((_str(name, f"regions[{i}][0]"), _str(clock, f"regions[{i}][1]")))
    n = len(regions)
    steps = []
    for i, item in enumerate(_list(d.get("steps"), "steps")):
        step, seen, rows = _list(item, f"steps[{i}]", 3)
        steps.append(
            LiveStep(
                _int(step, f"steps[{i}][0]"),
                _num(seen, f"steps[{i}][1]"),
                _rows(rows, f"steps[{i}][2]", n),
            )
        )
    ref = d.get("reference")
    reference = None
    if ref is not None:
        _need(isinstance(ref, dict), "reference", "an object or null", ref)
        reference = Reference(
            _int(ref.get("first"), "reference.first"),
            _int(ref.get("stop"), "reference.stop"),
            _int(ref.get("steps"), "reference.steps"),
            _rows(ref.get("rows"), "reference.rows", n),
        )
    threads = []
    for i, item in enumerate(_list(d.get("open"), "open")):
        _need(isinstance(item, dict), f"open[{i}]", "an object", item)
        held = []
        for k, pair in enumerate(_list(item.get("regions"), f"open[{i}].regions")):
            name, age = _list(pair, f"open[{i}].regions[{k}]", 2)
            held.append(
                (
                    _str(name, f"open[{i}].regions[{k}][0]"),
                    _opt_num(age, f"open[{i}].regions[{k}][1]"),
                )
            )
        threads.append(OpenThread(_str(item.get("thread"), f"open[{i}].thread"), tuple(held)))
    rate = []
    for i, pair in enumerate(_list(d.get("rate"), "rate")):
        at, step = _list(pair, f"rate[{i}]", 2)
        rate.append((_num(at, f"rate[{i}][0]"), _int(step, f"rate[{i}][1]")))
    summary = d.get("summary")
    _need(summary is None or isinstance(summary, dict), "summary", "an object or null", summary)
    return LiveFile(
        path=path,
        state=state,  # type: ignore[arg-type]
        reason=_str(d.get("reason", ""), "reason"),
        pid=_int(d.get("pid"), "pid"),
        host=_str(d.get("host"), "host"),
        rank=_int(d.get("rank"), "rank"),
        world_size=_int(d.get("world_size"), "world_size"),
        timer=_str(d.get("timer"), "timer"),
        started_unix_s=_num(d.get("started_unix_s"), "started_unix_s"),
        updated_unix_s=_num(d.get("updated_unix_s"), "updated_unix_s"),
        every_s=_num(d.get("every_s"), "every_s"),
        keep=_int(d.get("keep"), "keep"),
        step=_int(d.get("step"), "step"),
        finished=_int(d.get("finished"), "finished"),
        last_step_unix_s=_opt_num(d.get("last_step_unix_s"), "last_step_unix_s"),
        rate=tuple(rate),
        regions=tuple(regions),
        steps=tuple(steps),
        reference=reference,
        open=tuple(threads),
        has_summary=summary is not None,
    )


def read_live(path: str | os.PathLike[str]) -> LiveFile:
    """The live file at ``path``; OSError when it cannot be read, a one-line ValueError
    naming it when it is not a complete live file (half written by something else, another
    kind of file, another schema)."""
    where = os.fspath(path)
    size = os.stat(where).st_size
    if size > _READ_LIMIT_BYTES:
        raise ValueError(
            f"{where}: not a cudatimer live file ({size / 2**20:.1f} MiB; a live file stays "
            f"under {MAX_BYTES // 2**20} MiB)"
        )
    if size == 0:
        raise ValueError(
            f"{where}: empty, not a cudatimer live file (cudatimer never writes one empty)"
        )
    try:
        data = read_json(where)
    except ValueError as exc:
        text = str(exc).removeprefix(f"{where}: ")
        raise ValueError(
            f"{where}: not a complete cudatimer live file ({text}); cudatimer replaces it "
            "whole, so something else wrote or cut it"
        ) from None
    return parse_live(data, where)
