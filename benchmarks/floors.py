"""The floor of each open cost target, measured beside cudatimer in one process.

The cost targets of compiled regions and of backward rows compare a launch-bound training
step with every module timed against the same step untimed. Part of what timing adds is the
mechanism itself: one stream operation per region boundary, and for backward rows torch's own
cost of a Python pre-hook per module call. This script runs each step with the mechanism alone
beside cudatimer, so a ratio shows how much of it cudatimer's own work is.

``compiled``: the GPT-2-small training step of ``compile_targets.py`` (batch 8 x 512,
bf16 autocast, inductor default mode), compiled twice: plain, and with every module
instrumented before ``torch.compile``. The instrumented step then runs with its marks doing

- ``cudatimer``: what they do (the region's enter or exit);
- ``records``: one pooled event recorded on the current stream through the recorder's stream
  record (the C core's raw ``cudaEventRecord``), given back at once: the stream operations of
  the marks, nothing else;
- ``calls``: nothing (Inductor's code still calls the marks' kernels, the graph keeps their
  dependencies): what a mark costs before it does anything.

``backward``: the 6-layer GPT-2 step of ``backward_cost.py`` with ``backward=True``, its
rows' hook bodies swapped the same way (``records``: one record per hook call; ``calls``:
nothing), beside plain, forward-only and the bare-hook floor of ``backward_cost.py``.

On the H200 (benchmarks/RESULTS.md, sections C and B; 24 rounds on a quiet host) the compiled
step read 1.000x with marks doing nothing, 1.059x with one record a mark and 1.078x with
cudatimer; the backward step 1.016x, 1.022x and 1.029x (forward rows alone 1.012x).

The swaps go through cudatimer's module state (``_compile``'s mark tables, ``_backward``'s
hook body), which no user code should touch: this is a diagnostic.

    python benchmarks/floors.py --rounds 24 --json floors.json   # on a GPU
    python benchmarks/floors.py --smoke                          # CPU: the script runs
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import backward_cost
from _workloads import GPT
from compile_targets import _step_fn, _sync, _timed_steps, workload

import cudatimer
from cudatimer.core import _core, _device
from cudatimer.sources import _backward, _compile

PARTS = ("compiled", "backward")


def _recorder() -> Callable[..., None]:
    """One stream operation as the recorder makes it: a pooled event recorded on the current
    stream's record (raw ``cudaEventRecord`` in the C core), given back to the pool at once;
    the record looked up once (the steps run on the default stream). Without a GPU, a read
    of the host clock."""
    rec = _device.current_rec() if _device.usable() else None
    if rec is None:

        def host_clock(*args: Any) -> None:
            _core.now_ns()

        return host_clock
    take, give = rec.take, rec.give
    return lambda *args: give(take())


def _nothing(*args: Any) -> None:
    return None


@contextlib.contextmanager
def _marks_doing(body: Callable[..., None] | None) -> Iterator[None]:
    """The compiled marks' kernels call ``body`` instead of the region's enter and exit
    (None: the regions, as usual)."""
    enters, exits = list(_compile._ENTERS), list(_compile._EXITS)
    if body is not None:
        _compile._ENTERS[:] = [body] * len(enters)
        _compile._EXITS[:] = [body] * len(exits)
    try:
        yield
    finally:
        _compile._ENTERS[:] = enters
        _compile._EXITS[:] = exits


@contextlib.contextmanager
def _hooks_doing(body: Callable[..., None] | None) -> Iterator[None]:
    """Backward rows' hooks call ``body(seq, calls)`` instead of opening and closing rows."""
    fire = _backward._fire
    if body is not None:
        _backward._fire = body  # type: ignore[assignment]
    try:
        yield
    finally:
        _backward._fire = fire  # type: ignore[assignment]


def compiled(smoke: bool, rounds: int, steps: int) -> dict[str, Any]:
    device, cfg, idx = workload(smoke)
    plain = GPT(cfg).to(device)
    timed = GPT(cfg).to(device)
    timed.load_state_dict(plain.state_dict())
    timer = cudatimer.Timer(name="floors-compiled")
    handle = cudatimer.instrument(timed, timer=timer)
    step_of: dict[str, Callable[[], None]] = {}
    for name, model in (("plain", plain), ("timed", timed)):
        step = _step_fn(model, torch.compile(model), idx, device)
        for _ in range(4):  # compile, then warm
            step()
        step_of[name] = step
    _sync(device)
    timer.reset()
    bodies: dict[str, Callable[..., None] | None] = {
        "cudatimer": None,
        "records": _recorder(),
        "calls": _nothing,
    }

    def block(name: str) -> Callable[[], float]:
        if name == "plain":
            return lambda: _timed_steps(step_of["plain"], steps, device)

        def run() -> float:
            with _marks_doing(bodies[name]):
                return _timed_steps(step_of["timed"], steps, device)

        return run

    per = backward_cost.rotated_rounds({n: block(n) for n in ("plain", *bodies)}, rounds)[1]
    # The marks do their regions' work again once the swaps are undone: one step, every row.
    timer.reset()
    step_of["timed"]()
    rows = len(timer.summary().regions)
    return {
        "modules": len(handle.regions),
        "marks_per_forward": 2 * len(handle.regions),
        "rows_after": rows,
        "ratio_median": {n: statistics.median(r) for n, r in per.items()},
        "ratios": {n: [round(r, 4) for r in v] for n, v in per.items()},
    }


def backward(smoke: bool, rounds: int, steps: int) -> dict[str, Any]:
    if smoke:
        model, step = backward_cost._cpu_model()
        device = "cpu"
    else:
        model, step, _ = backward_cost._gpt2_cuda()
        device = "cuda"
    timer = cudatimer.Timer(name="floors-backward")
    for _ in range(3):
        step(contextlib.nullcontext)

    def time_it() -> float:
        return backward_cost._time(step, device, steps) * 1e3

    def instrumented(backward_rows: bool, body: Callable[..., None] | None) -> float:
        with cudatimer.instrument(model, backward=backward_rows, timer=timer), _hooks_doing(body):
            step(contextlib.nullcontext)
            ms = time_it()
        timer.summary()
        timer.reset()
        return ms

    def floor() -> float:
        with backward_cost._bare_hooks(model):
            step(contextlib.nullcontext)
            return time_it()

    record = _recorder()
    blocks: dict[str, Callable[[], float]] = {
        "plain": time_it,
        "hook_floor": floor,
        "forward": lambda: instrumented(False, None),
        "backward": lambda: instrumented(True, None),
        "backward_records": lambda: instrumented(True, record),
        "backward_calls": lambda: instrumented(True, _nothing),
    }
    per = backward_cost.rotated_rounds(blocks, rounds)[1]
    return {
        "ratio_median": {n: statistics.median(r) for n, r in per.items()},
        "ratios": {n: [round(r, 4) for r in v] for n, v in per.items()},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--parts", default=",".join(PARTS), help="comma-separated: compiled, backward")
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny models: the script runs")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    parts = args.parts.split(",")
    if not set(parts) <= set(PARTS):
        ap.error(f"--parts: unknown {sorted(set(parts) - set(PARTS))} (known: {', '.join(PARTS)})")
    smoke = args.smoke or not torch.cuda.is_available()
    rounds = 2 if smoke else args.rounds
    out: dict[str, Any] = {
        "device": "cpu" if smoke else torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "core": _core.IMPL,
    }
    for part in parts:
        t0 = time.perf_counter()
        if part == "compiled":
            out[part] = compiled(smoke, rounds, 2 if smoke else 5)
        else:
            out[part] = backward(smoke, rounds, 2 if smoke else 10)
        out[part]["seconds"] = round(time.perf_counter() - t0, 1)
        print(part, json.dumps(out[part]["ratio_median"]), flush=True)
    print(json.dumps(out, indent=2))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
