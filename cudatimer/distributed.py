"""Cross-rank reports over torch.distributed: every rank's regions in one table, never hanging.

Every rank of the group calls the report at the same point (e.g. after training), the same
number of times; rank ``dst`` prints one row per region with the calls, the min / median / max
over ranks of the per-rank totals and means, the slowest rank, the skew (max / median) and
percentiles merged exactly from the ranks' histograms::

    import cudatimer, cudatimer.distributed
    ...                                   # training with cuda_region / cuda_timed
    cudatimer.report(all_ranks=True)      # or cudatimer.distributed.report()
    cudatimer.distributed.save("timings/rank{rank}.json")   # per rank, no collective

    # offline, e.g. after a crash:  python -m cudatimer.distributed show timings/rank*.json

How ranks exchange (``transport``):

- ``"store"`` (default): each rank writes its summary (JSON of its regions, a few kB; per-step
  rows and trace samples stay local) under its own key in the
  process group's key-value store (the TCPStore that ``init_process_group`` set up) and ``dst``
  waits for every key with a deadline. No collective runs, so the exchange cannot mismatch
  whatever regions each rank has, works the same under gloo and NCCL, never touches the GPU,
  and the other ranks return at once. A rank that never arrives makes ``dst`` raise
  :class:`RankExchangeError` after ``rank_timeout_s`` naming the missing ranks (``report``
  then warns and prints the local table instead).
- ``"group"``: ``gather_object`` / ``all_gather_object`` on ``group`` (a fixed sequence of two
  collectives whatever the data). Use it where the group has no store. Every rank blocks until
  all have arrived; a missing rank makes the others wait for the group's own timeout (gloo:
  raises, NCCL: the watchdog aborts the process). With NCCL, object collectives run on the
  current CUDA device: call ``torch.cuda.set_device(local_rank)`` first.

Without an initialised process group the report is the local one.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import socket
import sys
import threading
import warnings
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from .records._ranks import RankedRegion, RankSummary, clock_kind
from .records._records import Summary
from .regions._output import output
from .regions._timer import Timer
from .render._export import FORMAT as SUMMARY_FORMAT
from .render._export import RANKS_FORMAT, dumps, summary_from_dict, summary_to_dict
from .render._export import save as save_summary
from .render._write import to_path, to_print

__all__ = [
    "RankExchangeError",
    "RankSummary",
    "RankedRegion",
    "clock_kind",
    "load_ranks",
    "main",
    "merge_files",
    "report",
    "save",
    "save_ranks",
    "summary",
]

RANKS_SCHEMA = 1
_TRANSPORTS = ("store", "group")

# Per process, per group (its global ranks): how many exchanges this rank has started. Every
# rank calls the report the same number of times, so equal counters name the same exchange.
_SEQ: dict[tuple[int, ...], int] = {}
_SEQ_LOCK = threading.Lock()


class RankExchangeError(RuntimeError):
    """The ranks could not exchange their summaries (a rank missing, a store or group error)."""


# -- the local side ---------------------------------------------------------------------------
def _default_timer() -> Timer:
    from .regions._timer import default_timer

    return default_timer()


def _this_rank() -> tuple[int, int]:
    """(global rank, world size): from torch.distributed when initialised, else torchrun's
    environment, else (0, 1)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    try:
        return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 0, 1


_WINDOW = ("last", "steps", "warmup")


def _source(source: object) -> tuple[Timer, Summary | None]:
    """The Timer an exchange reads (default: the module's), or the Summary given instead."""
    if source is None:
        return _default_timer(), None
    if isinstance(source, Timer):
        return source, None
    if isinstance(source, Summary):
        return _default_timer(), source
    raise TypeError(
        f"source must be a cudatimer.Timer, a cudatimer.Summary or None (the default "
        f"Timer), got {type(source).__name__}"
    )


def _check_window(window: dict[str, Any]) -> None:
    unknown = [k for k in window if k not in _WINDOW]
    if unknown:
        raise TypeError(
            f"unexpected keyword argument(s) {', '.join(unknown)}; "
            f"window options are {', '.join(_WINDOW)}"
        )


def _ranked(local: Summary) -> Summary:
    """``local`` with this rank, the world size and the host in ``meta``."""
    rank, world = _this_rank()
    extra = {"rank": str(rank), "world_size": str(world), "host": socket.gethostname()}
    meta = tuple((k, v) for k, v in local.meta if k not in extra) + tuple(extra.items())
    return dataclasses.replace(local, meta=meta)


def _local(source: Timer | Summary | None, timeout_s: float, window: dict[str, Any]) -> Summary:
    """This rank's Summary (a window of steps if asked), its rank, world size and host added to
    ``meta``. Reading, as ``Timer.summary``: the outputs (``report``, ``save``) resolve theirs
    through the Timer's one output path instead."""
    _check_window(window)
    timer, given = _source(source)
    if given is None:
        return _ranked(timer.summary(timeout_s=timeout_s, **window))
    if window:
        raise TypeError(f"{', '.join(window)} select steps of a Timer; source is already a Summary")
    return _ranked(given)


def _bulky_cleared() -> dict[str, Any]:
    """Summary fields the cross-rank table does not read and that can weigh megabytes per rank
    (per-step rows: 1,000 steps x 50 regions = 50,000 rows; trace samples): not exchanged.
    ``save`` per rank keeps them."""
    names = {f.name for f in dataclasses.fields(Summary)}
    return {name: () for name in ("step_stats", "trace") if name in names}


def _rank_of(summary: Summary) -> int | None:
    value = dict(summary.meta).get("rank")
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _seconds(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} must be a number of seconds, got {type(value).__name__}")
    if not value > 0:
        raise ValueError(f"{what} must be > 0, got {value}")
    return float(value)


# -- the exchange -----------------------------------------------------------------------------
def _group_ranks(group: Any) -> list[int]:
    if group is None:
        return list(range(dist.get_world_size()))
    if not isinstance(group, dist.ProcessGroup):
        raise TypeError(
            f"group must be a torch.distributed.ProcessGroup or None (the default group), "
            f"got {type(group).__name__}"
        )
    return list(dist.get_process_group_ranks(group))


def _next_namespace(ranks: list[int]) -> str:
    key = tuple(ranks)
    with _SEQ_LOCK:
        seq = _SEQ[key] = _SEQ.get(key, 0) + 1
    tag = hashlib.sha1(",".join(map(str, ranks)).encode()).hexdigest()[:12]
    # torchelastic keeps its store across restarts: the attempt number keeps a restarted job
    # from reading keys a crashed attempt left behind.
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return f"cudatimer/{attempt}/{tag}/{seq}"


def _via_store(
    payload: str, rank: int, ranks: list[int], dst: int | None, timeout_s: float
) -> list[bytes] | None:
    try:
        store = dist.distributed_c10d._get_default_store()
    except (AttributeError, RuntimeError, ValueError) as exc:
        raise RankExchangeError(
            f"cudatimer: no key-value store to exchange through ({exc}); use transport='group'"
        ) from exc
    ns = _next_namespace(ranks)
    keys = [f"{ns}/{r}" for r in ranks]
    try:
        store.set(f"{ns}/{rank}", payload)
    except RuntimeError as exc:
        raise RankExchangeError(f"cudatimer: could not write to the store: {exc}") from exc
    if dst is not None and rank != dst:
        return None  # written; dst reads it whenever it gets there
    try:
        store.wait(keys, timedelta(seconds=timeout_s))
    except RuntimeError as exc:
        missing = []
        with contextlib.suppress(RuntimeError):
            missing = [r for r, k in zip(ranks, keys, strict=True) if not store.check([k])]
        raise RankExchangeError(
            f"cudatimer: rank(s) {missing or '?'} did not reach the cross-rank report within "
            f"{timeout_s:g} s (every rank of the group must call it, the same number of "
            f"times; raise rank_timeout_s if some ranks finish much later) [{exc}]"
        ) from exc
    try:
        blobs = [bytes(store.get(k)) for k in keys]
    except RuntimeError as exc:
        raise RankExchangeError(f"cudatimer: could not read from the store: {exc}") from exc
    # Housekeeping only (a few kB per rank): failing to delete must not fail the report.
    with contextlib.suppress(RuntimeError):
        if dst is not None:
            for k in keys:
                store.delete_key(k)
        elif store.add(f"{ns}/done", 1) == len(ranks):  # the last reader cleans up
            for k in [*keys, f"{ns}/done"]:
                store.delete_key(k)
    return blobs


def _via_group(
    payload: dict[str, Any], rank: int, ranks: list[int], dst: int | None, group: Any
) -> list[Any] | None:
    out: list[Any] = [None] * len(ranks)
    try:
        if dst is None:
            dist.all_gather_object(out, payload, group=group)
            return out
        dist.gather_object(payload, out if rank == dst else None, dst=dst, group=group)
    except RuntimeError as exc:
        raise RankExchangeError(
            f"cudatimer: gathering the ranks' summaries over the process group failed: {exc}"
        ) from exc
    return out if rank == dst else None


def _check(dst: object, rank_timeout_s: object, transport: object) -> None:
    if transport not in _TRANSPORTS:
        raise ValueError(f"transport must be one of {', '.join(_TRANSPORTS)}; got {transport!r}")
    _seconds(rank_timeout_s, "rank_timeout_s")
    if dst is not None and (isinstance(dst, bool) or not isinstance(dst, int)):
        raise TypeError(f"dst must be a global rank (int) or None, got {type(dst).__name__}")


def _exchange(
    local: Summary,
    *,
    group: Any,
    dst: int | None,
    rank_timeout_s: float,
    transport: str,
) -> RankSummary | None:
    """The exchange itself (arguments already checked by ``_check``)."""
    if not (dist.is_available() and dist.is_initialized()):
        rank, _ = _this_rank()
        return RankSummary((rank,), (local,))
    ranks = _group_ranks(group)
    rank = dist.get_rank()
    if dst is not None and dst not in ranks:
        raise ValueError(f"dst must be a rank of the group {ranks}, got {dst}")
    if rank not in ranks:
        return None  # not a member: nothing to contribute, nothing to receive
    data = summary_to_dict(dataclasses.replace(local, **_bulky_cleared()))
    if transport == "store":
        blobs = _via_store(
            json.dumps(data, separators=(",", ":"), allow_nan=False),
            rank,
            ranks,
            dst,
            rank_timeout_s,
        )
        received = None if blobs is None else [json.loads(b) for b in blobs]
    else:
        received = _via_group(data, rank, ranks, dst, group)
    if received is None:
        return None
    summaries = []
    for r, d in zip(ranks, received, strict=True):
        try:
            summaries.append(summary_from_dict(d))
        except ValueError as exc:
            raise ValueError(f"cudatimer: the summary of rank {r}: {exc}") from exc
    return RankSummary(tuple(ranks), tuple(summaries))


# -- public API -------------------------------------------------------------------------------
def summary(
    source: Timer | Summary | None = None,
    *,
    group: Any = None,
    dst: int | None = 0,
    timeout_s: float = 60.0,
    rank_timeout_s: float = 300.0,
    transport: str = "store",
    **window: Any,
) -> RankSummary | None:
    """Every rank's results as a :class:`RankSummary` on rank ``dst``; None on the others.

    Every rank of ``group`` (default: all ranks) must call it at the same point of the program,
    the same number of times. ``source`` is a Timer (default: the module's) or a Summary you
    computed; ``last``/``steps``/``warmup`` pick a window of the Timer's steps (as in
    ``Timer.summary``). ``dst`` is the global rank that receives the result; ``dst=None`` gives
    it to every rank. ``timeout_s`` bounds the wait for this rank's GPU work;
    ``rank_timeout_s`` bounds the wait for the other ranks: with ``transport="store"``
    (default) the other ranks only write and return, and ``dst`` raises
    :class:`RankExchangeError` naming the ranks that did not arrive in time; ``"group"`` uses
    object collectives on ``group`` (see the module docstring). With no process group
    initialised it returns this process alone (one rank).

    >>> import cudatimer, cudatimer.distributed
    >>> with cudatimer.cuda_region("step"):
    ...     pass
    >>> cudatimer.distributed.summary()["step"].calls_per_rank   # no process group: one rank
    (1,)
    >>> cudatimer.reset()
    """
    _check(dst, rank_timeout_s, transport)
    local = _local(source, timeout_s, window)
    return _exchange(
        local, group=group, dst=dst, rank_timeout_s=rank_timeout_s, transport=transport
    )


def report(
    source: Timer | Summary | None = None,
    *,
    group: Any = None,
    dst: int | None = 0,
    timeout_s: float = 60.0,
    rank_timeout_s: float = 300.0,
    transport: str = "store",
    file: Any = None,
    logger: logging.Logger | None = None,
    level: int = logging.INFO,
    **options: Any,
) -> str:
    """Print the cross-rank table on rank ``dst`` (every rank if ``dst=None``) and return it;
    the other ranks print nothing and return "".

    Arguments are those of :func:`summary` (window included), ``file``/``logger``/``level``
    (where the text goes, as in ``Timer.report``), and the table's ``fmt`` (a tabulate
    format) and ``sort`` ("total": median total, "max": largest total, "mean": median mean,
    "skew", "calls", "name", "order"); other options apply to the local table only.
    It never fails the job at the end of training: if the exchange fails (a rank missing past
    ``rank_timeout_s``) it warns and prints this rank's own table. Without a process group it
    prints the ordinary local table.
    """
    from .render._report import SORTS, render, render_ranks

    target = to_print(file, logger, level)
    _check(dst, rank_timeout_s, transport)
    timer, given = _source(source)
    window = {k: options.pop(k) for k in _WINDOW if k in options}
    # sort="skew"/"max" only exist in the cross-rank table: the local fallback keeps its default.
    local_options = {k: v for k, v in options.items() if k != "sort" or v in SORTS}

    def table(run: Summary, _: dict[str, Any]) -> str | None:
        local = _ranked(run)
        if not (dist.is_available() and dist.is_initialized()):
            return render(local, **local_options)
        try:
            ranked = _exchange(
                local, group=group, dst=dst, rank_timeout_s=rank_timeout_s, transport=transport
            )
        except RankExchangeError as exc:
            warnings.warn(f"{exc}; printing this rank's own report", RuntimeWarning, stacklevel=4)
            return render(local, **local_options) + f"\nnote: rank {dist.get_rank()} only: {exc}"
        return None if ranked is None else render_ranks(ranked, **options)

    given_options = {"summary": given, "timeout_s": timeout_s, **window}
    text = output("distributed.report", timer, given_options, table, target)[1]
    return "" if text is None else text


def save(
    path: str | os.PathLike[str],
    source: Timer | Summary | None = None,
    *,
    timeout_s: float = 60.0,
    **window: Any,
) -> Summary:
    """Write this rank's summary as JSON (as ``cudatimer.save`` does: per-step rows and trace
    samples included), with its rank in ``meta``; no collective.

    ``{rank}`` in ``path`` becomes the global rank: every rank can call
    ``save("timings/rank{rank}.json")``, e.g. in a ``finally:`` block or every N steps, so a
    job that dies before its final report still leaves files for :func:`merge_files`.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
    _check_window(window)
    rank, _ = _this_rank()
    target = to_path(os.fspath(path).replace("{rank}", str(rank)))
    timer, given = _source(source)
    given_options = {"summary": given, "timeout_s": timeout_s, **window}
    run = output(
        "distributed.save",
        timer,
        given_options,
        lambda run, _: dumps(_ranked(run)),
        target,
        step_stats=True,
        trace=True,
    )[0]
    return _ranked(run)


def ranks_to_dict(ranked: RankSummary) -> dict[str, Any]:
    """Plain data for JSON: every rank's whole summary (so the file merges exactly again)."""
    return {
        "format": RANKS_FORMAT,
        "schema": RANKS_SCHEMA,
        "ranks": [
            {"rank": r, "summary": summary_to_dict(s)}
            for r, s in zip(ranked.ranks, ranked.summaries, strict=True)
        ],
    }


def save_ranks(ranked: RankSummary, path: str | os.PathLike[str]) -> None:
    """Write a RankSummary as JSON (atomically); :func:`merge_files` / :func:`load_ranks` read
    it back."""
    if not isinstance(ranked, RankSummary):
        raise TypeError(f"ranked must be a RankSummary, got {type(ranked).__name__}")
    path = os.fspath(path)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(ranks_to_dict(ranked), f, indent=1, allow_nan=False)
        f.write("\n")
    os.replace(tmp, path)


def _read(path: str) -> list[tuple[int | None, Summary]]:
    """(rank or None, Summary) pairs from a per-rank summary file or a cross-rank file."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON ({exc})") from exc
    try:
        if isinstance(data, dict) and data.get("format") == RANKS_FORMAT:
            if data.get("schema") != RANKS_SCHEMA:
                raise ValueError(
                    f"cross-rank schema {data.get('schema')!r} is not supported by this version "
                    f"(it reads schema {RANKS_SCHEMA})"
                )
            return [(int(e["rank"]), summary_from_dict(e["summary"])) for e in data["ranks"]]
        if isinstance(data, dict) and data.get("format") == SUMMARY_FORMAT:
            s = summary_from_dict(data)
            return [(_rank_of(s), s)]
        found = data.get("format") if isinstance(data, dict) else None
        raise ValueError(
            f"not a cudatimer file (format {found!r}; expected {SUMMARY_FORMAT!r} or "
            f"{RANKS_FORMAT!r})"
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path}: {exc}") from exc


def merge_files(paths: Sequence[str | os.PathLike[str]]) -> RankSummary:
    """The cross-rank view of saved files, offline (no process group needed).

    ``paths`` are per-rank files (``cudatimer.distributed.save``, which records the rank, or
    plain ``cudatimer.save``, numbered by their position in ``paths``) and/or cross-rank files
    (:func:`save_ranks`, ``python -m cudatimer.distributed merge``). A rank found twice is a
    ValueError naming both files.
    """
    if isinstance(paths, (str, bytes, os.PathLike)) or not isinstance(paths, Sequence):
        raise TypeError(
            "paths must be a list of file paths (e.g. glob.glob('rank*.json')), "
            f"got {type(paths).__name__}"
        )
    if not paths:
        raise ValueError("paths is empty: give at least one saved summary")
    seen: dict[int, str] = {}
    ranks: list[int] = []
    summaries: list[Summary] = []
    for position, p in enumerate(paths):
        path = os.fspath(p)
        for rank, s in _read(path):
            r = position if rank is None else rank
            if r in seen:
                raise ValueError(
                    f"rank {r} appears in both {seen[r]} and {path}; give each rank's file once"
                )
            seen[r] = path
            ranks.append(r)
            summaries.append(s)
    return RankSummary(tuple(ranks), tuple(summaries))


def load_ranks(path: str | os.PathLike[str]) -> RankSummary:
    """Read one cross-rank file (or one per-rank file, as a single rank)."""
    return merge_files([path])


# -- command line -----------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    """``python -m cudatimer.distributed show|merge FILE...``: the cross-rank table, offline."""
    from .render._report import render_ranks

    parser = argparse.ArgumentParser(
        prog="python -m cudatimer.distributed",
        description="Cross-rank cudatimer reports from per-rank files (distributed.save).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    show = sub.add_parser("show", help="print the cross-rank table of saved files")
    show.add_argument("files", nargs="+", help="per-rank or cross-rank JSON files")
    show.add_argument(
        "--sort", default="total", help="total, max, mean, skew, calls, name or order"
    )
    show.add_argument("--fmt", default="simple", help="a tabulate format, e.g. github")
    merge = sub.add_parser("merge", help="merge per-rank files into one file")
    merge.add_argument("files", nargs="+", help="per-rank or cross-rank JSON files")
    merge.add_argument("-o", "--output", required=True, help="where to write the merged file")
    merge.add_argument(
        "--flat",
        action="store_true",
        help="write one Summary of all ranks folded together (cudatimer.load reads it) "
        "instead of the cross-rank file",
    )
    args = parser.parse_args(argv)
    try:
        ranked = merge_files(args.files)
        if args.command == "show":
            print(render_ranks(ranked, fmt=args.fmt, sort=args.sort))
        elif args.flat:
            save_summary(ranked.merged(), args.output)
        else:
            save_ranks(ranked, args.output)
    except (OSError, ValueError) as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2
    if args.command == "merge":
        print(f"merged {len(ranked.ranks)} rank(s) into {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
