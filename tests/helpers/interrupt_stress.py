"""Interrupt cudatimer where a user's Ctrl-C lands: SIGALRM raising KeyboardInterrupt after a
random 5-200 us, inside region enter/exit, report(), a decorated function and an instrumented
module. Each trial is followed by a summary() from another thread that must finish within
10 s, and checks that no region stays open and no completed call is lost.

Run as a script (a fresh process per run: a hang must fail a test, never block it):
``python -m tests.helpers.interrupt_stress SEED [--trials N] [--reports N]``; prints one JSON
line with the counts and exits 0, or exits 3 naming the first problem.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import random
import signal
import sys
import threading
import time
from typing import Any

import torch

import cudatimer
from cudatimer.core import _core

SUMMARY_WAIT_S = 10.0


class Interrupted(KeyboardInterrupt):
    """What the alarm raises (a KeyboardInterrupt, as Ctrl-C's)."""


def _raise(signum: int, frame: Any) -> None:
    raise Interrupted


def _arm(rng: random.Random) -> None:
    signal.setitimer(signal.ITIMER_REAL, rng.uniform(5e-6, 200e-6))


def _disarm() -> None:
    signal.setitimer(signal.ITIMER_REAL, 0)


class Problem(Exception):
    """A broken promise: a hang, a region left open, a call lost."""


def _summary_elsewhere(timer: Any) -> Any:
    """timer.summary() on another thread, within SUMMARY_WAIT_S, or Problem."""
    out: list[Any] = []

    def read() -> None:
        out.append(timer.summary())

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(SUMMARY_WAIT_S)
    if t.is_alive() or not out:
        raise Problem(f"summary() from another thread did not finish within {SUMMARY_WAIT_S} s")
    return out[0]


def _calls(summary: Any, name: str) -> int:
    row = summary.get(name)
    return 0 if row is None else int(row.calls)


def _check_open(timer: Any, where: str) -> int:
    frames = timer.recorder.store.open_frames()
    if frames:
        raise Problem(f"{where}: regions left open: {frames}")
    return 0


_LAST: list[BaseException | None] = [None]


def _interrupted(rng: random.Random, body: Any) -> bool:
    """Run body() with the alarm armed; True if the interrupt landed inside it."""
    _LAST[0] = None
    try:
        _arm(rng)
        body()
        time.sleep(250e-6)  # the alarm fires by now, inside this try
    except Interrupted as exc:
        _LAST[0] = exc
        return True
    finally:
        _disarm()
    return False


def _at_exit_start() -> bool:
    """Whether the last interrupt was raised on the first instruction of the pure-Python
    core's ``RegionBase.__exit__`` (where CPython checks for signals before any of its code
    runs): the one window that core documents; the C core's exit is a C method."""
    exc = _LAST[0]
    tb = exc.__traceback__ if exc is not None else None
    frames = []
    while tb is not None:
        frames.append(tb)
        tb = tb.tb_next
    code = getattr(_core.RegionBase.__exit__, "__code__", None)
    return any(t.tb_frame.f_code is code and t.tb_lineno == code.co_firstlineno for t in frames)


def _left_in_exit_window(timer: Any, stats: dict[str, int]) -> bool:
    """Counted, not a problem: a region left open by the Python core's documented window
    (the trial's Timer is left as it is; the next trial makes a fresh one)."""
    if timer.recorder.store.open_frames() and _at_exit_start():
        stats["exit_window"] += 1
        return True
    return False


def regions(rng: random.Random, trials: int, stats: dict[str, int]) -> None:
    """``with a: with b:`` in a loop on a fresh Timer per trial."""
    for i in range(trials):
        t = cudatimer.Timer(name=f"regions{i}")
        ra, rb = t.region("a"), t.region("b")
        counts = {"done_a": 0, "done_b": 0}

        def body() -> None:
            for _ in range(20):
                with ra:  # noqa: B023
                    with rb:  # noqa: B023
                        pass
                    counts["done_b"] += 1  # noqa: B023
                counts["done_a"] += 1  # noqa: B023

        stats["interrupts"] += _interrupted(rng, body)
        if _left_in_exit_window(t, stats):
            continue
        _check_open(t, f"regions trial {i}")
        with ra:  # the next region works
            pass
        s = _summary_elsewhere(t)
        got_a, got_b = _calls(s, "a"), _calls(s, "a/b")
        # Every completed call is there, and at most the one the interrupt cut short besides
        # (entered, then closed by the exception: recorded like any call that raised).
        if not (counts["done_a"] + 1 <= got_a <= counts["done_a"] + 2):
            raise Problem(f"regions trial {i}: a has {got_a} calls, {counts} completed")
        if not (counts["done_b"] <= got_b <= counts["done_b"] + 1):
            raise Problem(f"regions trial {i}: a/b has {got_b} calls, {counts} completed")
        stats["trials"] += 1


def reports(rng: random.Random, trials: int, stats: dict[str, int]) -> None:
    """Interrupts inside report(), summary(), save() and reset() of one Timer."""
    import tempfile

    t = cudatimer.Timer(name="reports")
    r = t.region("work")
    calls = 0
    folder = tempfile.mkdtemp(prefix="cudatimer-stress-")
    for i in range(trials):
        for _ in range(5):
            with r:
                pass
            calls += 1
        what = i % 4
        if what == 0:
            stats["interrupts"] += _interrupted(rng, t.report)
        elif what == 1:
            stats["interrupts"] += _interrupted(rng, t.summary)
        elif what == 2:
            stats["interrupts"] += _interrupted(rng, lambda: t.save(f"{folder}/run.json"))
        else:
            hit = _interrupted(rng, t.step)
            stats["interrupts"] += hit
        _check_open(t, f"reports trial {i}")
        s = _summary_elsewhere(t)
        if _calls(s, "work") != calls:
            raise Problem(f"reports trial {i}: {_calls(s, 'work')} calls kept of {calls}")
        stats["trials"] += 1
    _interrupted(rng, t.reset)  # an interrupted reset leaves the Timer usable
    t.reset()
    with r:
        pass
    if _calls(_summary_elsewhere(t), "work") != 1:
        raise Problem("after reset(): the next region was not recorded")


def decorated(rng: random.Random, trials: int, stats: dict[str, int]) -> None:
    """A decorated function calling a decorated function, a fresh Timer per trial."""
    for i in range(trials):
        t = cudatimer.Timer(name=f"decorated{i}")
        counts = {"done": 0}

        @t.region("inner")
        def inner() -> None:
            pass

        @t.region("outer")
        def outer() -> None:
            inner()

        def body() -> None:
            for _ in range(20):
                outer()
                counts["done"] += 1  # noqa: B023

        stats["interrupts"] += _interrupted(rng, body)
        if _left_in_exit_window(t, stats):
            continue
        _check_open(t, f"decorated trial {i}")
        s = _summary_elsewhere(t)
        got = _calls(s, "outer/inner")
        if not (counts["done"] <= got <= counts["done"] + 1):
            raise Problem(f"decorated trial {i}: outer/inner has {got} calls, {counts}")
        stats["trials"] += 1


def instrumented(rng: random.Random, trials: int, stats: dict[str, int]) -> None:
    """An instrumented two-layer model called in a loop, a fresh Timer per trial."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    x = torch.randn(2, 8)
    for i in range(trials):
        t = cudatimer.Timer(name=f"instrumented{i}")
        counts = {"done": 0}
        with cudatimer.instrument(model, timer=t):

            def body() -> None:
                for _ in range(10):
                    model(x)
                    counts["done"] += 1  # noqa: B023

            stats["interrupts"] += _interrupted(rng, body)
            if _left_in_exit_window(t, stats):
                continue
            _check_open(t, f"instrumented trial {i}")
            model(x)  # the next call works
        s = _summary_elsewhere(t)
        got = _calls(s, "Sequential")
        if not (counts["done"] + 1 <= got <= counts["done"] + 2):
            raise Problem(f"instrumented trial {i}: Sequential has {got} calls, {counts}")
        stats["trials"] += 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("seed", type=int)
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--reports", type=int, default=300)
    parser.add_argument("--calls", type=int, default=200, help="decorated and module trials")
    args = parser.parse_args(argv)
    faulthandler.dump_traceback_later(300, exit=True)  # a hang prints where, then exits
    signal.signal(signal.SIGALRM, _raise)
    rng = random.Random(args.seed)
    stats = {"trials": 0, "interrupts": 0, "exit_window": 0}
    started = time.monotonic()
    try:
        regions(rng, args.trials, stats)
        reports(rng, args.reports, stats)
        decorated(rng, args.calls, stats)
        instrumented(rng, args.calls, stats)
    except Problem as exc:
        print(f"PROBLEM: {exc}", file=sys.stderr)
        return 3
    stats["seconds"] = round(time.monotonic() - started, 1)
    stats["core"] = "c" if cudatimer.compiled() else "python"  # type: ignore[assignment]
    print(json.dumps(stats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
