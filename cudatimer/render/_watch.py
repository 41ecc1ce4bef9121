"""``cudatimer watch``: a live view of the files ``cudatimer.live`` writes, one per rank.

Three parts. ``load`` reads the files (a file, a folder, a glob, or a path with ``{rank}``);
``build`` turns them into plain data (a :class:`Model`: per region its time per step over the
last steps, its share of the step, its change against a reference, its calls and trend, the
slowest rank; what state the run is in, and where it is stuck); ``frame`` draws a Model as
text of a given size. ``run_tty`` redraws that text full screen with the standard library's
``curses``: it is on every Unix Python, works in any terminal that ``TERM`` names (a plain
80x24 one, tmux, screen, over ssh), and the view needs nothing curses lacks, so no
dependency is added. Under ``NO_COLOR`` nothing is colored; where the locale is not UTF-8
(``LANG=C``) every character drawn is ASCII.
"""

from __future__ import annotations

import glob
import math
import os
import socket
import statistics
import time
from dataclasses import dataclass, field, replace
from typing import Any

from ..records._records import Summary
from ._livefile import LiveFile, read_live

__all__ = [
    "SORTS",
    "VIEWS",
    "Model",
    "Options",
    "RankView",
    "Row",
    "ascii_terminal",
    "build",
    "frame",
    "load",
    "reference_of",
    "run_tty",
]

VIEWS = ("tree", "flat")
SORTS = ("time", "change", "calls", "name")
#: A file not replaced for this many of its writer's intervals (and at least the seconds)
#: is stale: its writer stopped publishing.
STALE_INTERVALS, STALE_MIN_S = 4.0, 5.0
#: No step finished for this many typical step intervals (and at least the seconds): quiet.
QUIET_INTERVALS, QUIET_MIN_S = 10.0, 5.0
_TREND_WIDTH = 8
_BARS_UTF8 = "▁▂▃▄▅▆▇█"
_BARS_ASCII = "_.,-=+*#"


# -- reading the files ---------------------------------------------------------------------
def _magic(pattern: str) -> bool:
    return any(c in pattern for c in "*?[")


def _paths(pattern: str) -> list[str]:
    if os.path.isdir(pattern):
        return sorted(glob.glob(os.path.join(glob.escape(pattern), "*.json")))
    spec = pattern.replace("{rank}", "*")
    if _magic(spec):
        return sorted(p for p in glob.glob(spec) if p.endswith(".json") or spec.endswith("*"))
    return [pattern] if os.path.exists(pattern) else []


def load(
    pattern: str, cache: dict[str, tuple[tuple[int, int], LiveFile]] | None = None
) -> tuple[list[LiveFile], list[str]]:
    """The live files ``pattern`` names, and a one-line problem per file that is not one. In
    a folder or a glob, files that are not live files are passed over quietly when at least
    one is (a folder may hold saved runs too). ``cache``: files read before, by path, read
    again only when their size or time changed (a rank that ended or went quiet)."""
    files: list[LiveFile] = []
    problems: list[str] = []
    for path in _paths(pattern):
        if ".json.tmp" in os.path.basename(path):  # a writer's temporary file
            continue
        try:
            if cache is not None:
                st = os.stat(path)
                sig = (st.st_mtime_ns, st.st_size)
                hit = cache.get(path)
                if hit is None or hit[0] != sig:
                    hit = cache[path] = (sig, read_live(path))
                files.append(hit[1])
                continue
            files.append(read_live(path))
        except FileNotFoundError:  # replaced between the listing and the read: next time
            continue
        except (OSError, ValueError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            problems.append(reason if str(path) in reason else f"{path}: {reason}")
    single = not (os.path.isdir(pattern) or _magic(pattern.replace("{rank}", "*")))
    if files and not single:
        problems = []
    files.sort(key=lambda f: (f.rank, f.path))
    return files, problems


# -- plain data for the frame ---------------------------------------------------------------
@dataclass(frozen=True)
class RankView:
    """One rank's file as the viewer judges it. ``status``: running, quiet (no step for a
    while), stalled (not rewritten, its process alive), gone (not rewritten, its process
    gone), stale (not rewritten, on another host: cannot tell), finished, failed, terminated.
    """

    file: LiveFile
    status: str
    age_s: float  # since the file was written
    idle_s: float  # since a step last finished (or since the start)
    steps_per_s: float | None
    open: tuple[tuple[str, str, float | None], ...]  # (thread, innermost path, seconds)


@dataclass(frozen=True)
class Row:
    """One region over the last steps: time per step (GPU ms where timed on the GPU, else
    host ms; the mean over ranks), its share of its clock's step, change against the
    reference (None: no reference for it), calls per step, per-step trend, the slowest
    rank and its time (several ranks)."""

    path: str
    clock: str
    ms: float
    share: float | None
    change: float | None
    calls: float
    trend: tuple[float, ...]
    slowest: tuple[int, float] | None

    @property
    def depth(self) -> int:
        return self.path.count("/")

    @property
    def leaf(self) -> str:
        return self.path.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class Model:
    """Everything a frame shows, as plain data."""

    pattern: str
    status: str  # waiting, running, quiet, stalled, gone, stale, finished, failed, terminated
    message: str  # the status line
    ranks: tuple[RankView, ...]
    rows: tuple[Row, ...]
    window: tuple[int, int] | None  # first and last step shown
    steps: int  # steps in the window (per rank, the fewest)
    step_ms: dict[str, float] = field(default_factory=dict)  # per clock
    against: str = ""  # what the change column is against ('' none)
    notes: tuple[str, ...] = ()
    now_unix_s: float = 0.0

    @property
    def ended(self) -> bool:
        """Every rank wrote its final state."""
        return bool(self.ranks) and all(r.file.final for r in self.ranks)


@dataclass(frozen=True)
class Options:
    """What the keys change: the view, the sort, the depth shown (None: all), the scroll."""

    view: str = "tree"
    sort: str = "time"
    depth: int | None = None
    offset: int = 0


def reference_of(summary: Summary, where: str) -> dict[tuple[str, str], float]:
    """A saved run as a reference: per (path, clock) its time per step (GPU where timed on
    the GPU), from its totals over its steps."""
    if summary.steps <= 0:
        raise ValueError(
            f"{where}: the run marks no steps (cudatimer.step()), so it has no time per step "
            "to compare with"
        )
    out = {}
    for r in summary.regions:
        total = r.gpu.total if r.gpu is not None else r.cpu.total
        out[(r.name, r.clock)] = total / summary.steps
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: someone else's process, alive
        return True
    return True


def _steps_per_s(f: LiveFile, now: float) -> float | None:
    rate = [p for p in f.rate if p[0] >= now - 30.0] or list(f.rate[-2:])
    if len(rate) < 2:
        return None
    (t0, s0), (t1, s1) = rate[0], rate[-1]
    if f.state == "running":
        t1 = max(t1, min(now, f.updated_unix_s))  # the step counter did not move since
    return (s1 - s0) / (t1 - t0) if t1 > t0 and s1 >= s0 else None


def _interval(f: LiveFile) -> float:
    """The typical time between steps while steps were being marked (0: unknown)."""
    if len(f.rate) < 2:
        return 0.0
    (t0, s0), (t1, s1) = f.rate[max(0, len(f.rate) - 16)], f.rate[-1]
    return (t1 - t0) / (s1 - s0) if s1 > s0 else 0.0


def _rank_view(f: LiveFile, now: float, host: str) -> RankView:
    age = max(0.0, now - f.updated_unix_s)
    rate = _steps_per_s(f, now)
    since = f.last_step_unix_s if f.last_step_unix_s is not None else f.started_unix_s
    status = f.state
    if not f.final:
        end = now
        if age > max(STALE_MIN_S, STALE_INTERVALS * f.every_s):
            end = f.updated_unix_s  # what the file knew when last written
            status = "stale" if f.host != host else "stalled" if _alive(f.pid) else "gone"
        idle = max(0.0, end - since)
        typical = _interval(f)
        if status == "running" and idle > max(QUIET_MIN_S, QUIET_INTERVALS * typical):
            status = "quiet"
    else:
        idle = max(0.0, f.updated_unix_s - since)
    grown = age if status in ("running", "quiet") else 0.0
    held = []
    for t in f.open:
        if t.regions:
            path, secs = t.regions[-1]
            held.append((t.thread, path, None if secs is None else secs + grown))
    return RankView(f, status, age, idle, rate, tuple(held))


def _series(f: LiveFile) -> dict[tuple[str, str], tuple[list[float], float]]:
    """Per region of one rank: its time in each kept step (0 where absent), and its calls."""
    n = len(f.steps)
    out: dict[tuple[str, str], tuple[list[float], float]] = {}
    for k, step in enumerate(f.steps):
        for idx, calls, gpu, cpu in step.rows:
            key = f.regions[idx]
            if key not in out:
                out[key] = ([0.0] * n, 0.0)
            values, total_calls = out[key]
            values[k] += gpu if gpu is not None else cpu
            out[key] = (values, total_calls + calls)
    return out


def _file_reference(f: LiveFile) -> dict[tuple[str, str], float]:
    ref = f.reference
    if ref is None or ref.steps == 0:
        return {}
    out: dict[tuple[str, str], float] = {}
    for idx, _, gpu, cpu in ref.rows:
        key = f.regions[idx]
        out[key] = out.get(key, 0.0) + (gpu if gpu is not None else cpu) / ref.steps
    return out


def build(
    files: list[LiveFile],
    pattern: str,
    *,
    now_unix_s: float | None = None,
    against: dict[tuple[str, str], float] | None = None,
    against_label: str = "",
    problems: tuple[str, ...] = (),
    host: str | None = None,
) -> Model:
    """The Model of ``files`` (one per rank) at ``now_unix_s``; ``against``: a saved run's
    time per step per (path, clock) instead of each file's reference."""
    now = time.time() if now_unix_s is None else now_unix_s
    here = socket.gethostname() if host is None else host
    if not files:
        if problems:
            return Model(pattern, "bad", problems[0], (), (), None, 0, now_unix_s=now)
        message = f"not started: no file at {pattern} yet (waiting for the run to write it)"
        return Model(pattern, "waiting", message, (), (), None, 0, now_unix_s=now)
    ranks = tuple(_rank_view(f, now, here) for f in files)
    per_rank = [_series(f) for f in files]
    refs = [against if against is not None else _file_reference(f) for f in files]
    keys: dict[tuple[str, str], None] = {}
    for series in per_rank:
        keys.update(dict.fromkeys(series))
    step_ms: dict[str, list[float]] = {}
    rows = []
    for key in keys:
        means, calls, changes, trends = [], [], [], []
        for rank, (series, ref) in enumerate(zip(per_rank, refs, strict=True)):
            if key not in series or not files[rank].steps:
                continue
            values, n_calls = series[key]
            ms = math.fsum(values) / len(values)
            means.append((ms, files[rank].rank))
            calls.append(n_calls / len(values))
            trends.append(values)
            base = ref.get(key)
            if base is not None and base > 0:
                changes.append(ms / base - 1.0)
        if not means:
            continue
        ms = statistics.fmean(m for m, _ in means)
        slowest = max(means) if len(files) > 1 else None
        if "/" not in key[0]:
            step_ms.setdefault(key[1], []).append(ms)
        rows.append(
            Row(
                path=key[0],
                clock=key[1],
                ms=ms,
                share=None,
                change=statistics.fmean(changes) if changes else None,
                calls=statistics.fmean(calls),
                trend=_trend(trends),
                slowest=(slowest[1], slowest[0]) if slowest else None,
            )
        )
    totals = {clock: math.fsum(v) for clock, v in step_ms.items()}
    rows = [replace(r, share=r.ms / totals[r.clock] if totals.get(r.clock) else None) for r in rows]
    kept = [f for f in files if f.steps]
    window = None
    if kept:
        window = (min(f.steps[0].step for f in kept), max(f.steps[-1].step for f in kept))
    if against is not None:
        label = against_label
    else:
        spans = {(f.reference.first, f.reference.stop) for f in files if f.reference}
        label = ""
        if spans:
            first, stop = min(spans)
            label = f"steps {first}-{stop - 1}"
            seen = min(f.reference.steps for f in files if f.reference)
            if seen < stop - first:
                label += f" ({seen} so far)"
    status, message = _status(ranks, now)
    steps = min((len(f.steps) for f in files), default=0)
    return Model(
        pattern=pattern,
        status=status,
        message=message,
        ranks=ranks,
        rows=tuple(rows),
        window=window,
        steps=steps,
        step_ms=totals,
        against=label,
        notes=tuple(problems),
        now_unix_s=now,
    )


def _trend(series: list[list[float]]) -> tuple[float, ...]:
    """The per-step values (mean over ranks, aligned on the newest), in at most
    _TREND_WIDTH bins."""
    n = min(len(s) for s in series)
    if n == 0:
        return ()
    values = [statistics.fmean(s[len(s) - n + i] for s in series) for i in range(n)]
    if n <= _TREND_WIDTH:
        return tuple(values)
    bins = []
    for b in range(_TREND_WIDTH):
        lo, hi = b * n // _TREND_WIDTH, (b + 1) * n // _TREND_WIDTH
        bins.append(math.fsum(values[lo:hi]) / (hi - lo))
    return tuple(bins)


_ORDER = {"gone": 0, "stalled": 1, "stale": 2, "quiet": 3, "running": 4}


def _seconds(s: float) -> str:
    if s < 90:
        return f"{s:.0f} s"
    if s < 5400:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def _where(r: RankView, several: bool) -> str:
    """'open: a/b/c (38 s) on rank 3' for the thread open longest (the main thread first)."""
    if not r.open:
        return "nothing open"
    thread, path, secs = max(r.open, key=lambda o: (o[0] == "MainThread", o[2] or 0.0))
    held = f"{path} ({_seconds(secs)})" if secs is not None else path
    on = f" on rank {r.file.rank}" if several else ""
    if thread != "MainThread":
        on += f" (thread {thread})"
    return f"open: {held}{on}"


def _status(ranks: tuple[RankView, ...], now: float) -> tuple[str, str]:
    several = len(ranks) > 1
    live = [r for r in ranks if not r.file.final]
    if not live:
        failed = [r for r in ranks if r.status != "finished"]
        worst = failed[0] if failed else ranks[0]
        at = time.strftime("%H:%M:%S", time.localtime(max(r.file.updated_unix_s for r in ranks)))
        if worst.status == "finished":
            path = worst.file.path if not several else "RANK_FILE"
            return "finished", f"finished at {at}: the run ended (`cudatimer show {path}` reads it)"
        who = f"rank {worst.file.rank} " if several else ""
        why = f": {worst.file.reason}" if worst.file.reason else ""
        verb = "failed" if worst.status == "failed" else "was terminated"
        return worst.status, f"{who}{verb} at {at}{why}; {_where(worst, several)}"
    worst = min(live, key=lambda r: (_ORDER[r.status], -r.idle_s))
    who = f"rank {worst.file.rank} " if several else ""
    f = worst.file
    if worst.status == "gone":
        return "gone", (
            f"gone: {who}writer (pid {f.pid}) is not running and its file is "
            f"{_seconds(worst.age_s)} old (killed?); last seen {_where(worst, several)}"
        )
    if worst.status == "stalled":
        return "stalled", (
            f"stalled: {who}file not rewritten for {_seconds(worst.age_s)} though pid {f.pid} "
            "runs (its publishing thread gets no time: a call holding the GIL?)"
        )
    if worst.status == "stale":
        return "stale", (
            f"stale: {who}file not rewritten for {_seconds(worst.age_s)} (writer on host "
            f"{f.host}: cannot tell whether it runs)"
        )
    if worst.status == "quiet":
        what = "no step for" if f.finished else "no step finished in"
        return "quiet", f"quiet: {what} {_seconds(worst.idle_s)}; {_where(worst, several)}"
    done = [r for r in ranks if r.file.final]
    rates = [r.steps_per_s for r in live if r.steps_per_s is not None]
    parts = [f"running: step {min(r.file.step for r in live)}"]
    if rates:
        parts.append(f"{min(rates):.3g} steps/s")
    if not any(r.file.finished for r in live):
        parts.append(f"no step finished yet ({_where(worst, several)})")
    parts.append(f"updated {max(r.age_s for r in live):.1f} s ago")
    if done:
        parts.append(f"{len(done)} rank(s) ended")
    return "running", ", ".join(parts)


# -- the frame ---------------------------------------------------------------------------
def ascii_terminal(environ: Any = None) -> bool:
    """Whether only ASCII may be drawn: the locale the environment names (LC_ALL, LC_CTYPE,
    LANG, the first set) is not UTF-8 (``LANG=C``, or none set; Python's own coercion of a C
    locale to C.UTF-8 does not count: the terminal still has the C locale)."""
    env = os.environ if environ is None else environ
    lang = env.get("LANG", "")
    ctype = env.get("LC_CTYPE", "")
    if not env.get("LC_ALL") and lang in ("", "C", "POSIX") and ctype.lower() in _COERCED:
        # Python itself sets LC_CTYPE=C.UTF-8 in a C locale (PEP 538): the terminal's is C.
        return True
    for value in (env.get("LC_ALL"), ctype, lang):
        if value:
            return "utf8" not in value.lower().replace("-", "")
    return True


_COERCED = ("c.utf-8", "c.utf8", "utf-8")


def _ms(v: float) -> str:
    if v >= 1000:
        return f"{v:.0f}"
    if v >= 100:
        return f"{v:.1f}"
    if v >= 10:
        return f"{v:.2f}"
    return f"{v:.3f}"


def _pct(v: float | None, signed: bool = False) -> str:
    if v is None:
        return ""
    p = v * 100
    text = f"{p:+.1f}%" if signed and abs(p) < 10 else f"{p:+.0f}%" if signed else None
    if text is None:
        text = f"{p:.1f}%" if p < 10 else f"{p:.0f}%"
    return text


def _spark(values: tuple[float, ...], bars: str) -> str:
    if not values:
        return ""
    lo, hi = min(values), max(values)
    if hi <= 0 or (hi - lo) <= 0.02 * hi:  # within 2%: flat, not noise drawn large
        return bars[1] * len(values)
    top = len(bars) - 1
    return "".join(bars[round((v - lo) / (hi - lo) * top)] for v in values)


def _fit(text: str, width: int, ell: str, left: bool = False) -> str:
    if len(text) <= width:
        return text
    if width <= len(ell):
        return text[:width]
    return ell + text[-(width - len(ell)) :] if left else text[: width - len(ell)] + ell


def _ordered(rows: tuple[Row, ...], opts: Options) -> list[Row]:
    def key(r: Row) -> tuple[Any, ...]:
        if opts.sort == "name":
            return (r.leaf if opts.view == "tree" else r.path, r.clock)
        if opts.sort == "change":
            return (r.change is None, -(r.change or 0.0), r.path)
        if opts.sort == "calls":
            return (-r.calls, r.path)
        return (-r.ms, r.path)

    shown = [r for r in rows if opts.depth is None or r.depth < opts.depth]
    if opts.view == "flat":
        return sorted(shown, key=key)
    paths = {(r.path, r.clock) for r in shown}
    kids: dict[tuple[str, str] | None, list[Row]] = {}
    for r in shown:
        parent = r.path.rsplit("/", 1)[0] if "/" in r.path else None
        pkey = (parent, r.clock) if parent is not None and (parent, r.clock) in paths else None
        kids.setdefault(pkey, []).append(r)
    out: list[Row] = []
    todo = sorted(kids.get(None, []), key=key, reverse=True)
    while todo:  # depth first, without recursion (paths may nest deep)
        r = todo.pop()
        out.append(r)
        todo.extend(sorted(kids.get((r.path, r.clock), []), key=key, reverse=True))
    return out


def frame(
    model: Model,
    options: Options | None = None,
    *,
    width: int = 100,
    height: int | None = None,
    ascii_only: bool = False,
    keys: bool = False,
) -> str:
    """One frame of ``model`` as text, every line at most ``width`` characters; ``height``
    lines at most (None: every row), ``keys``: with the line that lists the keys."""
    opts = options or Options()
    width = max(width, 20)
    ell = "..." if ascii_only else "…"
    bars = _BARS_ASCII if ascii_only else _BARS_UTF8
    several = len(model.ranks) > 1
    lines: list[str] = []
    clock_now = time.strftime("%H:%M:%S", time.localtime(model.now_unix_s))
    suffix = ""
    if several:
        suffix = f" ({len(model.ranks)} ranks)"
    elif model.ranks:
        f = model.ranks[0].file
        suffix = f" (rank {f.rank}, pid {f.pid})"
    head = "cudatimer watch  "
    room = max(4, width - len(clock_now) - 1 - len(head) - len(suffix))
    title = head + _fit(model.pattern, room, ell, left=True) + suffix  # the file's name kept
    lines.append(
        _fit(title, width - len(clock_now) - 1, ell).ljust(width - len(clock_now)) + clock_now
    )
    lines.append(_fit(model.message, width, ell))
    clocks = sorted(model.step_ms)
    if model.window is not None:
        first, last = model.window
        step = ", ".join(f"{_ms(model.step_ms[c])} ms/step on {c}" for c in clocks)
        against = f"; change against {model.against}" if model.against else ""
        lines.append(
            _fit(f"last {model.steps} steps ({first}-{last}): {step}{against}", width, ell)
        )
    elif model.ranks:
        lines.append("no step has finished yet")
    for note in model.notes[:2]:
        lines.append(_fit(f"note: {note}", width, ell))
    if not model.rows:
        return _text(_clip(lines, height, keys), ascii_only)
    show_clock = len(clocks) > 1
    cols: list[tuple[str, int]] = [("ms/step", 9), ("share", 6), ("change", 7), ("calls", 7)]
    if show_clock:
        cols.insert(0, ("clock", 7))
    if several:
        cols.append(("slowest", 12))
    cols.append(("trend", _TREND_WIDTH))
    fixed = sum(w + 1 for _, w in cols)
    while width - fixed < 16 and len(cols) > 2:  # narrow: the last columns go first
        fixed -= cols.pop()[1] + 1
    name_w = width - fixed
    header = "region".ljust(name_w) + "".join(
        " " + (n.ljust(w) if n == "trend" else n.rjust(w)) for n, w in cols
    )
    lines.append(header.rstrip())
    body = []
    for r in _ordered(model.rows, opts):
        if opts.view == "tree":
            indent = "  " * r.depth
            name = indent + _fit(r.leaf, max(1, name_w - len(indent)), ell)
            name = _fit(name, name_w, ell)
        else:
            name = _fit(r.path, name_w, ell, left=True)
        cells = {
            "clock": r.clock,
            "ms/step": _ms(r.ms),
            "share": _pct(r.share),
            "change": _pct(r.change, signed=True)
            if r.change is not None
            else ("new" if model.against else ""),
            "calls": f"{r.calls:.3g}" if r.calls < 1000 else f"{r.calls:.0f}",
            "slowest": f"{_ms(r.slowest[1])} r{r.slowest[0]}" if r.slowest else "",
            "trend": _spark(r.trend, bars),
        }
        text = name.ljust(name_w) + "".join(
            " " + (cells[n].ljust(w) if n == "trend" else cells[n].rjust(w)) for n, w in cols
        )
        body.append(text.rstrip())
    if height is None:
        lines.extend(body)
        return _text(lines, ascii_only)
    room = max(1, height - len(lines) - (1 if keys else 0))
    top = max(0, min(opts.offset, len(body) - room))
    lines.extend(body[top : top + room])
    out = lines[: height - 1] if keys else lines[:height]
    if keys:
        depth = "all" if opts.depth is None else str(opts.depth)
        shown = min(len(body), top + room)
        more = (
            f"{len(body)} rows"
            if top == 0 and shown == len(body)
            else f"rows {top + 1}-{shown} of {len(body)} (arrows scroll)"
        )
        help_line = f"q quit  t view: {opts.view}  s sort: {opts.sort}  +/- depth: {depth}  {more}"
        out.append(_fit(help_line, width, ell))
    return _text(out, ascii_only)


def _clip(lines: list[str], height: int | None, keys: bool) -> list[str]:
    if height is None:
        return lines
    out = lines[: height - (1 if keys else 0)]
    if keys:
        out.append("q quit")
    return out


def _text(lines: list[str], ascii_only: bool) -> str:
    text = "\n".join(lines)
    return text.encode("ascii", "replace").decode("ascii") if ascii_only else text


# -- the full-screen view -------------------------------------------------------------------
def run_tty(
    pattern: str,
    options: Options,
    *,
    against: dict[tuple[str, str], float] | None = None,
    against_label: str = "",
    refresh_s: float = 1.0,
) -> str:
    """Draw the view full screen until ``q`` or the run's end; returns the last frame as
    plain text when the run ended (for the terminal's scrollback), else ''. Raises OSError
    when there is no usable terminal."""
    import curses
    import locale

    locale.setlocale(locale.LC_ALL, "")
    ascii_only = ascii_terminal()
    color = not os.environ.get("NO_COLOR")
    result: list[str] = []

    cache: dict[str, tuple[tuple[int, int], LiveFile]] = {}

    def model() -> Model:
        files, problems = load(pattern, cache)
        return build(
            files,
            pattern,
            against=against,
            against_label=against_label,
            problems=tuple(problems),
        )

    def signature() -> tuple[Any, ...]:
        out = []
        for path in _paths(pattern):
            try:
                st = os.stat(path)
            except OSError:
                continue
            out.append((path, st.st_mtime_ns, st.st_size))
        return tuple(out)

    def main(screen: Any) -> None:
        with _suppress_curses():
            curses.curs_set(0)
        screen.timeout(100)  # a key or 0.1 s, whichever first: files are checked 10x a second
        styles = {"title": curses.A_REVERSE, "status": curses.A_BOLD}
        if color and curses.has_colors():
            with _suppress_curses():
                curses.use_default_colors()
                for n, c in (
                    (1, curses.COLOR_GREEN),
                    (2, curses.COLOR_YELLOW),
                    (3, curses.COLOR_RED),
                ):
                    curses.init_pair(n, c, -1)
                styles["ok"] = curses.color_pair(1) | curses.A_BOLD
                styles["warn"] = curses.color_pair(2) | curses.A_BOLD
                styles["bad"] = curses.color_pair(3) | curses.A_BOLD
        opts = options
        m = model()
        sig = signature()
        loaded = time.monotonic()
        ended_at: float | None = None
        dirty = True
        while True:
            now = time.monotonic()
            new_sig = signature()
            if new_sig != sig or now - loaded >= refresh_s:
                sig, loaded = new_sig, now
                m = model()
                dirty = True
            if m.ended:
                ended_at = ended_at if ended_at is not None else now
                if now - ended_at >= 1.0:  # the final frame stays up a moment
                    result.append(
                        frame(
                            m, replace(opts, offset=0), width=_cols(screen), ascii_only=ascii_only
                        )
                    )
                    return
            if dirty:
                _draw(screen, m, opts, ascii_only, styles)
                dirty = False
            ch = screen.getch()
            if ch == -1:
                continue
            dirty = True
            if ch in (ord("q"), ord("Q"), 27):
                return
            if ch == curses.KEY_RESIZE:
                with _suppress_curses():
                    curses.update_lines_cols()
                continue
            opts = _key(opts, ch, m, screen.getmaxyx()[0])

    # The terminal's own size: curses takes LINES/COLUMNS from the environment first (a
    # shell or a test runner may export them), and would keep that size through resizes.
    for name in ("LINES", "COLUMNS"):
        os.environ.pop(name, None)
    try:
        curses.wrapper(main)
    except curses.error as exc:
        raise OSError(
            f"the terminal cannot be drawn on ({exc}; TERM={os.environ.get('TERM', '')!r}): "
            "use --once for a plain-text frame"
        ) from None
    return result[0] if result else ""


def _cols(screen: Any) -> int:
    return int(screen.getmaxyx()[1])


class _suppress_curses:
    """``with _suppress_curses():`` ignores what a terminal cannot do (no cursor, no colors)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        import curses

        return exc_type is not None and issubclass(exc_type, curses.error)


def _key(opts: Options, ch: int, m: Model, lines: int) -> Options:
    import curses

    page = max(1, lines - 6)
    deepest = max((r.depth + 1 for r in m.rows), default=1)
    depth = opts.depth if opts.depth is not None else deepest
    if ch == curses.KEY_DOWN:
        return replace(opts, offset=min(opts.offset + 1, max(0, len(m.rows) - 1)))
    if ch == curses.KEY_UP:
        return replace(opts, offset=max(0, opts.offset - 1))
    if ch == curses.KEY_NPAGE or ch == ord(" "):
        return replace(opts, offset=min(opts.offset + page, max(0, len(m.rows) - 1)))
    if ch == curses.KEY_PPAGE:
        return replace(opts, offset=max(0, opts.offset - page))
    if ch == curses.KEY_HOME:
        return replace(opts, offset=0)
    if ch == ord("t"):
        return replace(opts, view="flat" if opts.view == "tree" else "tree", offset=0)
    if ch == ord("s"):
        return replace(opts, sort=SORTS[(SORTS.index(opts.sort) + 1) % len(SORTS)], offset=0)
    if ch in (ord("+"), ord("=")):
        return replace(opts, depth=None if depth + 1 >= deepest else depth + 1)
    if ch in (ord("-"), ord("_")):
        return replace(opts, depth=max(1, min(depth, deepest) - 1))
    return opts


_STYLE = {
    "finished": "ok",
    "running": "",
    "quiet": "warn",
    "stale": "warn",
    "stalled": "warn",
    "waiting": "warn",
    "gone": "bad",
    "failed": "bad",
    "terminated": "bad",
    "bad": "bad",
}


def _draw(screen: Any, m: Model, opts: Options, ascii_only: bool, styles: dict[str, int]) -> None:

    rows, cols = screen.getmaxyx()
    text = frame(m, opts, width=max(20, cols - 1), height=rows, ascii_only=ascii_only, keys=True)
    screen.erase()
    for i, line in enumerate(text.split("\n")[:rows]):
        attr = 0
        if i == 0:
            attr = styles["title"]
        elif i == 1:
            attr = styles.get(_STYLE.get(m.status, ""), styles["status"]) or styles["status"]
        with _suppress_curses():  # the last cell of the screen, or a resize under way
            screen.addnstr(i, 0, line, max(1, cols - 1), attr)
    screen.refresh()
