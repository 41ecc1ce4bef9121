"""The ``cudatimer`` command (also ``python -m cudatimer``): read runs saved with ``save()``.

    cudatimer show RUN.json [--view tree] [--sort mean] [--fmt github] [--match 'fwd*']
    cudatimer compare BASE.json NEW.json [--stat mean|total|per_step|p50|p90|p99|min|max]
    cudatimer compare BASE... NEW --max-slowdown 0.05 [--fmt github] [--json verdict.json]
    cudatimer trace RUN.json -o trace.json     # open in https://ui.perfetto.dev
    cudatimer plot RUN.json -o report.png      # or .svg, .pdf; needs matplotlib
    cudatimer html RUN.json -o report.html     # one page, no network; html BASE.json NEW.json
    cudatimer csv RUN.json -o regions.csv [--what regions|steps|trace]
    cudatimer watch LIVE.json [--once] [--against RUN.json]   # a running job (cudatimer.live)

    cudatimer --version                        # version, torch, and which recorder core runs

Exit status: 0 on success, 1 when a file cannot be read or written (the message says which
and why), 2 for a bad command line (an unknown command or option, or a bad option value such
as ``--columns speed`` or ``--last 5``: a saved run holds the window it was saved with),
141 (128 + SIGPIPE, what a shell reports for any tool that a closed pipe stopped) when
standard output closes early, as in ``cudatimer show RUN.json | head -1``: the command then
stops quietly, without a traceback. (``--help`` into a closed pipe exits 0: argparse ignores
the failed write.) ``compare --max-slowdown`` (the performance gate) exits 3 when a region got
significantly slower (or undecided / in one run only with ``--fail-undecided`` /
``--fail-missing``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import sys
from collections.abc import Sequence
from typing import Any

from .records._ranks import RankSummary
from .records._records import Summary
from .render._export import RANKS_FORMAT, WHATS, read_json, summary_from_dict, to_csv
from .render._gate import DEFAULT_STAT, GATE_STATS, compare_sides, load_side, write_json
from .render._report import (
    COLUMNS,
    COMPARE_STATS,
    SORTS,
    VIEWS,
    render,
    render_compare,
    render_gate,
)

__all__ = ["EXIT_BROKEN_PIPE", "EXIT_SLOWER", "main"]

#: Exit status when standard output was closed before the command finished writing to it.
EXIT_BROKEN_PIPE = 141
#: Exit status of ``compare --max-slowdown`` when the gate fails (a region got slower).
EXIT_SLOWER = 3
#: Statistics ``compare`` and ``html`` take: the report's, and the gate's lower quantiles.
_STATS = tuple(dict.fromkeys([*COMPARE_STATS, *GATE_STATS]))
#: Options of ``compare`` that only the gate (``--max-slowdown``) reads.
_GATE_ONLY = (
    "confidence",
    "fail_undecided",
    "fail_missing",
    "match",
    "min_ms",
    "json",
    "absolute",
    "between_run",
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cudatimer",
        description="Read cudatimer runs saved with cudatimer.save(path).",
        epilog="Exit status: 0 ok; 1 a file could not be read or written; 2 a bad command "
        f"line; {EXIT_SLOWER} compare --max-slowdown found a region slower; "
        f"{EXIT_BROKEN_PIPE} standard output closed early (e.g. piped into head).",
    )
    parser.add_argument("--version", action=_Version, help="print versions and which core runs")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def table_options(p: argparse.ArgumentParser) -> None:
        p.add_argument("--fmt", default="simple", help="any tabulate format (github, plain...)")

    show = sub.add_parser("show", help="print the report of a saved run")
    show.add_argument("run", help="a JSON file written by cudatimer.save()")
    show.add_argument("--view", choices=VIEWS, default="flat")
    show.add_argument("--sort", choices=SORTS, default="total")
    table_options(show)
    show.add_argument(
        "--columns", help=f"comma-separated, from: {', '.join(COLUMNS)}", default=None
    )
    show.add_argument("--match", help="keep regions matching this glob (or substring)")
    show.add_argument(
        "--min-share", type=float, default=0.0, help="keep regions with this fraction of total"
    )
    # Accepted so that they are refused with the reason: a window is rebuilt from the raw
    # samples a live Timer keeps, and a saved run holds only the window it was saved with.
    # Not listed in --help, which would offer options only to refuse them.
    for flag in ("--last", "--steps", "--warmup"):
        show.add_argument(flag, help=argparse.SUPPRESS)

    compare = sub.add_parser(
        "compare",
        help="compare saved runs region by region; with --max-slowdown, a performance gate",
        description="Compare NEW with BASE region by region. With --max-slowdown, a gate: "
        "each region's ratio gets a confidence interval and a verdict, and the command exits "
        f"{EXIT_SLOWER} when a region got significantly slower (docs/gate.md).",
    )
    compare.add_argument(
        "runs",
        nargs="+",
        metavar="RUN",
        help="BASE NEW (JSON files of save()); with --max-slowdown, BASE may be several runs "
        "or folders (pooled), and folders of rank{N}.json files compare rank by rank",
    )
    compare.add_argument(
        "--stat",
        choices=_STATS,
        default=None,
        help=f"default: mean; with --max-slowdown {DEFAULT_STAT} (one of {', '.join(GATE_STATS)})",
    )
    compare.add_argument(
        "--tolerance", type=float, default=0.02, help="changes within it read 'same' (0.02=2%%)"
    )
    table_options(compare)
    gate = compare.add_argument_group("the gate")
    gate.add_argument(
        "--max-slowdown",
        type=float,
        default=None,
        metavar="FRACTION",
        help=f"gate: exit {EXIT_SLOWER} when a region is significantly slower and may be "
        "slower by more than this (0.05 = 5%%)",
    )
    gate.add_argument(
        "--confidence", type=float, default=None, help="for all regions together (0.95)"
    )
    gate.add_argument("--match", help="gate only regions matching this glob (or substring)")
    gate.add_argument(
        "--min-ms", type=float, default=None, help="ignore regions under this in both runs"
    )
    gate.add_argument("--fail-undecided", action="store_true", help="undecided regions fail")
    gate.add_argument("--fail-missing", action="store_true", help="regions in one run only fail")
    gate.add_argument(
        "--allow-other-device",
        action="store_true",
        help="compare runs of different devices (refused otherwise)",
    )
    gate.add_argument(
        "--absolute",
        action="store_true",
        help="gate raw ratios (default: each divided by the run-wide speed factor, the median "
        "ratio of the other regions)",
    )
    gate.add_argument(
        "--between-run",
        type=float,
        default=None,
        metavar="FRACTION",
        help="spread between runs of a region assumed with one base run (default 0.005)",
    )
    gate.add_argument("--json", metavar="PATH", help="write the verdicts as JSON too")

    trace = sub.add_parser("trace", help="write a Chrome/Perfetto trace of a saved run")
    trace.add_argument("run")
    trace.add_argument("-o", "--output", help="default: RUN.trace.json")

    plot = sub.add_parser(
        "plot", help="write a picture of where time goes: PNG, SVG or PDF (needs matplotlib)"
    )
    plot.add_argument("run")
    plot.add_argument("-o", "--output", help="default: RUN.png; .svg and .pdf write those")
    plot.add_argument("--top", type=_positive, default=12, help="how many regions to draw")

    html = sub.add_parser(
        "html", help="write a self-contained HTML report; of two runs, a comparison"
    )
    html.add_argument(
        "runs",
        nargs="+",
        metavar="RUN",
        help="a saved run (or a cross-rank file); two runs, BASE NEW, are compared",
    )
    html.add_argument("-o", "--output", help="default: RUN.html (NEW-vs-BASE.html for two)")
    html.add_argument("--top", type=_positive, default=8, help="regions in the per-step chart")
    html.add_argument("--title", help="the page's title")
    html.add_argument(
        "--stat",
        choices=_STATS,
        default=None,
        help=f"of the comparison (default: mean; with --max-slowdown {DEFAULT_STAT})",
    )
    html.add_argument(
        "--tolerance", type=float, default=0.02, help="changes within it read 'same' (0.02=2%%)"
    )
    html.add_argument(
        "--max-slowdown",
        type=float,
        default=None,
        metavar="FRACTION",
        help="show the gate's verdicts of `compare --max-slowdown` (0.05 = 5%%)",
    )
    html.add_argument("--confidence", type=float, default=0.95, help="of the gate (0.95)")
    html.add_argument(
        "--absolute", action="store_true", help="the gate on raw ratios (see compare --absolute)"
    )
    html.add_argument(
        "--allow-other-device", action="store_true", help="gate runs of different devices"
    )

    csv = sub.add_parser("csv", help="write regions, per-step stats or trace samples as CSV")
    csv.add_argument("run")
    csv.add_argument("-o", "--output", help="default: standard output")
    csv.add_argument("--what", choices=WHATS, default="regions")
    _watch_parser(sub)
    for command, sub_parser in sub.choices.items():
        # A bad option value is reported with the usage of its command, not the top level's.
        sub_parser.set_defaults(usage_of=sub_parser)
        sub_parser.prog = f"cudatimer {command}"
    return parser


def _watch_parser(sub: Any) -> None:
    from .render._watch import SORTS as WATCH_SORTS
    from .render._watch import VIEWS as WATCH_VIEWS

    watch = sub.add_parser(
        "watch", help="a live view of a running job (the files of cudatimer.live)"
    )
    watch.add_argument(
        "path", help="a live file, a folder of them, or a glob of rank files ('live/rank*.json')"
    )
    watch.add_argument("--once", action="store_true", help="print one frame as text and exit")
    watch.add_argument(
        "--against", help="a saved run (JSON) to compare with (default: the steps after warm-up)"
    )
    watch.add_argument("--view", choices=WATCH_VIEWS, default="tree")
    watch.add_argument("--sort", choices=WATCH_SORTS, default="time")
    watch.add_argument("--depth", type=_positive, help="levels of regions shown (default: all)")
    watch.add_argument(
        "--width", type=_positive, help="--once: characters a line (default: the terminal's)"
    )


def _watch(args: argparse.Namespace) -> str:
    """``watch``: one frame (--once), or the full-screen view until q or the run's end."""
    import shutil

    from .render import _watch as watch

    against, label = None, ""
    if args.against:
        against, label = (
            watch.reference_of(_load(args.against, "watch"), args.against),
            args.against,
        )
    options = watch.Options(view=args.view, sort=args.sort, depth=args.depth)
    if args.once:
        files, problems = watch.load(args.path)
        if problems and not files:
            raise ValueError(problems[0])
        model = watch.build(
            files, args.path, against=against, against_label=label, problems=tuple(problems)
        )
        width = args.width or shutil.get_terminal_size((100, 24)).columns
        return watch.frame(model, options, width=width, ascii_only=watch.ascii_terminal())
    if not (sys.stdout.isatty() and sys.stdin.isatty()):
        raise ValueError("standard input and output must be a terminal; use --once for a frame")
    try:
        return watch.run_tty(args.path, options, against=against, against_label=label)
    except KeyboardInterrupt:
        return ""


class _Version(argparse.Action):
    """``--version``: argparse's own action rewraps the line to the terminal's width."""

    def __init__(self, option_strings: Sequence[str], dest: str, help: str) -> None:
        super().__init__(option_strings, dest, nargs=0, help=help)

    def __call__(self, parser: argparse.ArgumentParser, *args: object) -> None:
        print(_version())
        parser.exit()


def _version() -> str:
    """Read without importing torch (2-4 s): its version from the installed metadata, and the
    recorder core that the chooser picks (importing it imports no torch)."""
    from importlib import metadata

    from ._config import PURE_PYTHON
    from ._version import __version__
    from .core import _core

    try:
        torch = f"torch {metadata.version('torch')}"
    except metadata.PackageNotFoundError:
        torch = "torch not installed"
    if _core.IMPL == "c":
        core = "core: C (cudatimer.core._speedups)"
    elif PURE_PYTHON:
        core = "core: Python (CUDATIMER_PURE_PYTHON is set)"
    else:
        core = "core: Python (cudatimer.core._speedups was not built)"
    return f"cudatimer {__version__} ({torch}; {core})"


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _check_options(args: argparse.Namespace) -> None:
    """Refuse option values argparse cannot check (a format, column names, fractions) as a bad
    command line (exit 2), before any file is read: they are checked on an empty run."""
    command = args.command
    empty = Summary(regions=())
    try:
        if command == "show":
            window = [f"--{k}" for k in ("last", "steps", "warmup") if getattr(args, k)]
            if window:
                raise ValueError(
                    f"{', '.join(window)}: a saved run holds the window it was saved with "
                    "(cudatimer.save(path, warmup=5)); windows need the raw samples a live "
                    "Timer keeps, so choose the window when saving"
                )
            _show(empty, args)
        elif command == "compare":
            _check_compare(args, empty)
        elif command == "plot" and args.output is not None:
            from .render._plot import format_of

            format_of(args.output)
        elif command == "html":
            if len(args.runs) > 2:
                raise ValueError(
                    f"give one run, or two to compare (BASE NEW); got {len(args.runs)} files"
                )
            if args.max_slowdown is not None and len(args.runs) != 2:
                raise ValueError("--max-slowdown gates a comparison: give two runs, BASE NEW")
            from .render._html import render_html

            render_html(
                empty,
                base=empty,
                top=args.top,
                title=args.title,
                tolerance=args.tolerance,
                stat=args.stat,
                max_slowdown=args.max_slowdown,
                confidence=args.confidence,
            )
    except (TypeError, ValueError) as exc:
        args.usage_of.error(str(exc))


def _check_compare(args: argparse.Namespace, empty: Summary) -> None:
    """``compare``'s options: two runs, or a gate's several; gate options with the gate."""
    if len(args.runs) < 2:
        raise ValueError("give two runs, BASE NEW (the last one is NEW)")
    if args.max_slowdown is None:
        given = [
            f"--{k.replace('_', '-')}"
            for k in (*_GATE_ONLY, "allow_other_device")
            if getattr(args, k) not in (None, False)
        ]
        if given:
            raise ValueError(f"{', '.join(given)}: gate options; add --max-slowdown FRACTION")
        if len(args.runs) > 2:
            raise ValueError(
                f"give two runs, BASE NEW; got {len(args.runs)}: several BASE runs pool in the "
                "gate only (add --max-slowdown FRACTION)"
            )
        render_compare(
            empty, empty, fmt=args.fmt, tolerance=args.tolerance, stat=args.stat or "mean"
        )
        return
    comparison = compare_sides(
        {None: [empty]},
        {None: [empty]},
        max_slowdown=args.max_slowdown,
        stat=args.stat or DEFAULT_STAT,
        confidence=0.95 if args.confidence is None else args.confidence,
        match=args.match,
        min_ms=args.min_ms or 0.0,
        between_run=args.between_run,
    )
    render_gate(comparison, fmt=args.fmt)


def _gate(args: argparse.Namespace) -> tuple[str, int]:
    """``compare --max-slowdown``: the gate's table and exit status (EXIT_SLOWER on a fail)."""
    base, new = load_side(args.runs[:-1]), load_side(args.runs[-1:])
    comparison = compare_sides(
        base,
        new,
        max_slowdown=args.max_slowdown,
        stat=args.stat or DEFAULT_STAT,
        confidence=0.95 if args.confidence is None else args.confidence,
        match=args.match,
        min_ms=args.min_ms or 0.0,
        fail_undecided=args.fail_undecided,
        fail_missing=args.fail_missing,
        allow_other_device=args.allow_other_device,
        absolute=args.absolute,
        between_run=args.between_run,
    )
    if args.json:
        write_json(comparison, args.json)
    return render_gate(comparison, fmt=args.fmt), 0 if comparison.ok else EXIT_SLOWER


def _column_list(text: str | None) -> list[str] | None:
    return [c.strip() for c in text.split(",") if c.strip()] if text else None


def _show(summary: Summary, args: argparse.Namespace) -> str:
    """``show``'s table of ``summary`` with the command's options."""
    return render(
        summary,
        view=args.view,
        sort=args.sort,
        fmt=args.fmt,
        columns=_column_list(args.columns),
        match=args.match,
        min_share=args.min_share,
    )


def _stem(path: str) -> str:
    root, ext = os.path.splitext(path)
    return root if ext.lower() == ".json" else path


def _load(path: str, command: str) -> Summary:
    """The run saved at ``path``; for a cross-rank file, a ValueError that says which commands
    read it, in commands (the reader is at a shell, not in Python)."""
    data = read_json(path)
    if isinstance(data, dict) and data.get("format") == RANKS_FORMAT:
        quoted = shlex.quote(path)
        advice = (
            f"`python -m cudatimer.distributed show {quoted}` prints its cross-rank table and "
            f"`cudatimer html {quoted}` writes its page"
        )
        if command == "trace":
            advice += (
                "; a trace holds one process's calls: give `cudatimer trace` one of the "
                "per-rank files that were merged"
            )
        else:
            advice += (
                f"; to read all ranks as one run, fold them first: `python -m "
                f"cudatimer.distributed merge {quoted} --flat -o all.json`, then "
                f"`cudatimer {command} all.json`"
            )
        raise ValueError(
            f"{path}: a cross-rank file (written by `python -m cudatimer.distributed merge`), "
            f"not one run: {advice}"
        )
    try:
        return summary_from_dict(data)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from exc


def _run(args: argparse.Namespace) -> str:
    """Do the command; the text to print. Raises ValueError/OSError/ImportError on failure."""
    if args.command == "compare":
        base, new = _load(args.runs[0], "compare"), _load(args.runs[1], "compare")
        labels = ("base", "new")
        stat = args.stat or "mean"
        return render_compare(
            base, new, stat=stat, fmt=args.fmt, tolerance=args.tolerance, labels=labels
        )
    if args.command == "html":
        return _html(args)
    if args.command == "watch":
        return _watch(args)
    summary = _load(args.run, args.command)
    if args.command == "show":
        return _show(summary, args)
    if args.command == "trace":
        from .render._trace import write_chrome

        out = args.output or f"{_stem(args.run)}.trace.json"
        write_chrome(summary, out)
        return f"wrote {out} ({len(summary.trace)} calls); open it in https://ui.perfetto.dev"
    if args.command == "plot":
        from .render._plot import plot

        out = args.output or f"{_stem(args.run)}.png"
        plot(summary, out, top=args.top)
        return f"wrote {out}"
    if args.output is None:  # csv to stdout
        to_csv(summary, sys.stdout, what=args.what)
        return ""
    to_csv(summary, args.output, what=args.what)
    return f"wrote {args.output}"


def _load_run(path: str) -> Summary | RankSummary:
    """A run saved with ``save()``, or a cross-rank file (``python -m cudatimer.distributed
    merge``) as a RankSummary."""
    data = read_json(path)
    if isinstance(data, dict) and data.get("format") == RANKS_FORMAT:
        from .distributed import load_ranks

        return load_ranks(path)
    try:
        return summary_from_dict(data)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from exc


def _html(args: argparse.Namespace) -> str:
    from .render._html import write_html

    options = {"top": args.top, "title": args.title}
    if len(args.runs) == 1:
        (path,) = args.runs
        out = args.output or f"{_stem(path)}.html"
        run = _load_run(path)
        if args.title is None:  # a page kept among others says which run it shows
            ranks = f" ({len(run.ranks)} ranks)" if isinstance(run, RankSummary) else ""
            options["title"] = f"cudatimer: {path}{ranks}"
        write_html(run, out, **options)
        return f"wrote {out}"
    base_path, new_path = args.runs
    base, new = _load(base_path, "compare"), _load(new_path, "compare")
    out = args.output or f"{_stem(new_path)}-vs-{os.path.basename(_stem(base_path))}.html"
    if args.title is None:
        options["title"] = f"cudatimer: {new_path} (new) against {base_path} (base)"
    gate = {"max_slowdown": args.max_slowdown, "confidence": args.confidence}
    write_html(
        new,
        out,
        base=base,
        stat=args.stat,
        tolerance=args.tolerance,
        allow_other_device=args.allow_other_device,
        absolute=args.absolute,
        **gate,
        **options,
    )
    return f"wrote {out}"


def _silence_stdout() -> None:
    """Point standard output at the null device, so that the interpreter's last flush of what
    is still buffered for the closed pipe does not print a BrokenPipeError of its own."""
    with contextlib.suppress(OSError, ValueError, AttributeError):  # no descriptor (captured)
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, sys.stdout.fileno())
        finally:
            os.close(devnull)


def _command(args: argparse.Namespace) -> int:
    status = 0
    try:
        if args.command == "compare" and args.max_slowdown is not None:
            text, status = _gate(args)
        else:
            text = _run(args)
    except BrokenPipeError:
        raise
    except (OSError, ValueError, ImportError, TypeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        where = f": {exc.filename}" if isinstance(exc, OSError) and exc.filename else ""
        with contextlib.suppress(OSError):  # a closed stderr: the exit status still says it
            print(f"cudatimer {args.command}: error: {reason}{where}", file=sys.stderr)
        return 1
    if text:
        print(text)
    sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's flush at exit
    return status


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``cudatimer`` console script; returns the exit status (see the
    module's docstring: EXIT_BROKEN_PIPE, quietly, when standard output closes early)."""
    try:
        try:
            parser = _parser()
            args = parser.parse_args(argv)
            _check_options(args)
        finally:
            sys.stdout.flush()  # --help's text
        return _command(args)
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_BROKEN_PIPE
