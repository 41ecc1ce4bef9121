"""The opt-in report at interpreter exit (``CUDATIMER_REPORT_AT_EXIT=1``), which never hangs.

At exit the report runs in a daemon thread joined with a deadline: a daemon thread of the
user's may still hold the recorder's lock, or the GPU may still be busy; after
``EXIT_TIMEOUT_S`` we print a one-line apology instead and let the interpreter finish (the
daemon thread is then stopped with the process). GPU work still running gets half of that
deadline; what has not finished by then is counted as pending in the report.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import IO

from .._config import env_flag

__all__ = ["ENABLED", "EXIT_TIMEOUT_S", "report_at_exit"]

#: Seconds the report at exit may take in all before it is abandoned.
EXIT_TIMEOUT_S = 10.0

ENABLED: bool = env_flag("CUDATIMER_REPORT_AT_EXIT", default=False)


def report_at_exit(stream: IO[str] | None = None, timeout_s: float | None = None) -> bool:
    """Write the report of every Timer that recorded something to ``stream`` (stderr by
    default, so stdout stays the program's data); False if it had to give up at the deadline
    (``EXIT_TIMEOUT_S`` unless ``timeout_s`` is given)."""
    from ..regions._timer import live_timers
    from ..render._report import render

    out = sys.stderr if stream is None else stream
    if timeout_s is None:
        timeout_s = EXIT_TIMEOUT_S
    texts: list[str] = []

    def work() -> None:
        timers = sorted(live_timers(), key=lambda t: (t.name != "default", t.name))
        for timer in timers:
            result = timer.summary(timeout_s=timeout_s / 2)
            if result.regions:
                texts.append(f"cudatimer report (timer {timer.name!r})\n{render(result)}")

    worker = threading.Thread(target=_guard(work, out), name="cudatimer-exit", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        print(
            f"cudatimer: the report at exit did not finish within {timeout_s:g} s "
            "(the GPU or another thread is stuck); skipped",
            file=out,
        )
        return False
    if texts:
        print("\n\n".join(texts), file=out)
    return True


def _guard(work: Callable[[], None], out: IO[str]) -> Callable[[], None]:
    def run() -> None:
        try:
            work()
        except Exception as exc:  # a failed report must not turn a clean exit into a traceback
            print(f"cudatimer: the report at exit failed: {exc!r}", file=out)

    return run
