"""The ``cudatimer`` command (also ``python -m cudatimer``): read runs saved with ``save()``.

    cudatimer show RUN.json [--view tree] [--sort mean] [--fmt github] [--match 'fwd*']
    cudatimer compare BASE.json NEW.json [--stat mean|total|per_step|p50|p90|p99|min|max]
    cudatimer trace RUN.json -o trace.json     # open in https://ui.perfetto.dev
    cudatimer plot RUN.json -o report.png      # needs matplotlib
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
the failed write.)
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Sequence
from typing import Any

from .records._ranks import RankSummary
from .records._records import Summary
from .regions._timer import core_line
from .render._export import RANKS_FORMAT, WHATS, load, read_json, summary_from_dict, to_csv
from .render._report import COLUMNS, COMPARE_STATS, SORTS, VIEWS, render, render_compare

__all__ = ["EXIT_BROKEN_PIPE", "main"]

#: Exit status when standard output was closed before the command finished writing to it.
EXIT_BROKEN_PIPE = 141


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cudatimer",
        description="Read cudatimer runs saved with cudatimer.save(path).",
        epilog="Exit status: 0 ok; 1 a file could not be read or written; 2 a bad command "
        f"line; {EXIT_BROKEN_PIPE} standard output closed early (e.g. piped into head).",
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
    for flag in ("--last", "--steps", "--warmup"):
        show.add_argument(flag, help="refused: choose the window when saving (save(warmup=5))")

    compare = sub.add_parser("compare", help="compare two saved runs region by region")
    compare.add_argument("base", help="the reference run (JSON)")
    compare.add_argument("new", help="the run to compare with it (JSON)")
    compare.add_argument("--stat", choices=COMPARE_STATS, default="mean")
    compare.add_argument(
        "--tolerance", type=float, default=0.02, help="changes within it read 'same' (0.02=2%%)"
    )
    table_options(compare)

    trace = sub.add_parser("trace", help="write a Chrome/Perfetto trace of a saved run")
    trace.add_argument("run")
    trace.add_argument("-o", "--output", help="default: RUN.trace.json")

    plot = sub.add_parser("plot", help="write a PNG of where time goes (needs matplotlib)")
    plot.add_argument("run")
    plot.add_argument("-o", "--output", help="default: RUN.png")
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
    html.add_argument("--stat", choices=COMPARE_STATS, default="mean", help="of the comparison")
    html.add_argument(
        "--tolerance", type=float, default=0.02, help="changes within it read 'same' (0.02=2%%)"
    )

    csv = sub.add_parser("csv", help="write regions, per-step stats or trace samples as CSV")
    csv.add_argument("run")
    csv.add_argument("-o", "--output", help="default: standard output")
    csv.add_argument("--what", choices=WHATS, default="regions")
    _watch_parser(sub)
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
        against, label = watch.reference_of(load(args.against), args.against), args.against
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
    import torch

    from ._version import __version__

    return f"cudatimer {__version__} (torch {torch.__version__}; {core_line()})"


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _check_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
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
            render_compare(empty, empty, fmt=args.fmt, tolerance=args.tolerance)
        elif command == "html":
            if len(args.runs) > 2:
                raise ValueError(
                    f"give one run, or two to compare (BASE NEW); got {len(args.runs)} files"
                )
            from .render._html import render_html

            render_html(empty, base=empty, top=args.top, title=args.title, tolerance=args.tolerance)
    except (TypeError, ValueError) as exc:
        parser.error(f"{command}: {exc}")


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


def _run(args: argparse.Namespace) -> str:
    """Do the command; the text to print. Raises ValueError/OSError/ImportError on failure."""
    if args.command == "compare":
        base, new = load(args.base), load(args.new)
        labels = ("base", "new")
        return render_compare(
            base, new, stat=args.stat, fmt=args.fmt, tolerance=args.tolerance, labels=labels
        )
    if args.command == "html":
        return _html(args)
    if args.command == "watch":
        return _watch(args)
    summary: Summary = load(args.run)
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
        write_html(_load_run(path), out, **options)
        return f"wrote {out}"
    base_path, new_path = args.runs
    base, new = load(base_path), load(new_path)
    out = args.output or f"{_stem(new_path)}-vs-{os.path.basename(_stem(base_path))}.html"
    if args.title is None:
        options["title"] = f"cudatimer: {new_path} (new) against {base_path} (base)"
    write_html(new, out, base=base, stat=args.stat, tolerance=args.tolerance, **options)
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
    try:
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
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``cudatimer`` console script; returns the exit status (see the
    module's docstring: EXIT_BROKEN_PIPE, quietly, when standard output closes early)."""
    try:
        try:
            parser = _parser()
            args = parser.parse_args(argv)
            _check_options(parser, args)
        finally:
            sys.stdout.flush()  # --help's text
        return _command(args)
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_BROKEN_PIPE
