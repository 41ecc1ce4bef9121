"""What a decorated function and a region cost when cudatimer is disabled, per call.

``CUDATIMER_DISABLE=1`` is read once, at import: this script runs itself again in a child
process with it set and compares, in that process, an undecorated function with the same
function under ``@cuda_timed``, and an empty loop body with ``with cuda_region("r"):``. The
runtime switch (``cudatimer.disable()``, decided per call) is measured beside it. Host-side
only: a disabled region touches no GPU, so any machine gives the figure.

    python benchmarks/disabled_cost.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

REPEAT = 9
# Runs per timing; the environment variable lets the smoke test keep it short.
N = int(os.environ.get("CUDATIMER_BENCH_N", "200000"))


def per_call_ns(stmt: str, env: dict[str, object]) -> float:
    """Best of REPEAT timings of N runs of ``stmt``, in ns per run (the minimum: the least
    disturbed run, as timeit advises)."""
    return min(timeit.repeat(stmt, globals=env, number=N, repeat=REPEAT)) / N * 1e9


def measure(label: str) -> None:
    import cudatimer

    def plain(x: int) -> int:
        return x + 1

    timed = cudatimer.cuda_timed(plain)
    region = cudatimer.cuda_region
    held = region("r")
    env: dict[str, object] = {"plain": plain, "timed": timed, "region": region, "held": held}
    base_call = per_call_ns("plain(1)", env)
    base_body = per_call_ns("pass", env)
    call = per_call_ns("timed(1)", env)
    body = per_call_ns("with region('r'):\n    pass", env)
    body_held = per_call_ns("with held:\n    pass", env)
    print(
        f"{label:<32} decorated call +{call - base_call:7.1f} ns   "
        f"with cuda_region('r') +{body - base_body:7.1f} ns   "
        f"with a held region +{body_held - base_body:7.1f} ns   "
        f"(undecorated call {base_call:.1f} ns)"
    )


def main() -> None:
    if os.environ.get("_CUDATIMER_DISABLED_CHILD"):
        measure(sys.argv[1])
        return
    here = str(Path(__file__).resolve())
    for label, extra in (
        ("CUDATIMER_DISABLE=1", {"CUDATIMER_DISABLE": "1"}),
        ("enabled (for comparison)", {}),
    ):
        env = {**os.environ, "_CUDATIMER_DISABLED_CHILD": "1", **extra}
        if not extra:
            env.pop("CUDATIMER_DISABLE", None)
        subprocess.run([sys.executable, here, label], env=env, check=True)
    import cudatimer

    cudatimer.disable()
    measure("cudatimer.disable() at run time")


if __name__ == "__main__":
    main()
