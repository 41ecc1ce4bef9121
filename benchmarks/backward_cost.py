"""What ``instrument(model, backward=True)`` costs: host time per module per training step
(CPU), and on a GPU the step-time ratio against the uninstrumented step.

A GPT-2-style model (``_workloads.GPT``) trains with forward, cross-entropy and backward
(no optimizer: it touches no module). On the CPU the model is tiny (width 16, 8 tokens), so
the step is almost all host work and the difference between the variants is the
instrumentation's host cost; it is divided by the number of instrumented modules. On a GPU
(``--device cuda``) the model is the 6-layer GPT-2 of issue #21 (batch 8 x 1024 tokens) and
the figure that matters is the step ratio (target <= 1.05x).

    python benchmarks/backward_cost.py               # CPU: us per module per step
    python benchmarks/backward_cost.py --device cuda # GPU: step ratios
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
import torch.nn.functional as F
from _workloads import GPT, GPTConfig

import cudatimer

# Steps per timing and timings per variant; the environment variable keeps the smoke test short.
STEPS = int(os.environ.get("CUDATIMER_BENCH_N", "100"))
ROUNDS = 9
VARIANTS = ("plain", "forward", "backward")


def _model(device: str) -> tuple[GPT, Callable[[], None]]:
    if device == "cpu":
        # One intra-op thread: with two on a loaded 2-core machine a 16-wide linear took 2 ms
        # (threads waiting on each other) instead of 10 us, and the host cost drowned in it.
        torch.set_num_threads(1)
        cfg, batch = GPTConfig(vocab=64, seq=8, layers=6, width=16, heads=2), 1
    else:
        cfg, batch = GPTConfig(layers=6), 8
    torch.manual_seed(0)
    model = GPT(cfg).to(device)
    idx = torch.randint(0, cfg.vocab, (batch, cfg.seq), device=device)
    tgt = torch.randint(0, cfg.vocab, (batch, cfg.seq), device=device)

    def step() -> None:
        logits = model(idx)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), tgt.view(-1))
        loss.backward()  # type: ignore[no-untyped-call]
        for p in model.parameters():
            p.grad = None

    return model, step


def _time(step: Callable[[], None], device: str) -> float:
    """Seconds per step over STEPS steps: on the CPU this process's CPU time (other jobs on a
    shared machine moved wall time by 2x between runs, CPU time by a few %), on a GPU wall
    time between two synchronisations."""
    clock = time.process_time if device == "cpu" else time.perf_counter
    if device != "cpu":
        torch.cuda.synchronize()
    gc.collect()
    t0 = clock()
    for _ in range(STEPS):
        step()
    if device != "cpu":
        torch.cuda.synchronize()
    return (clock() - t0) / STEPS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    device = parser.parse_args().device
    model, step = _model(device)
    timer = cudatimer.Timer(name="backward-cost")
    for _ in range(3):
        step()  # warm up: allocator, kernels
    # Rounds interleave the variants, and each keeps its best round (the least disturbed):
    # on a shared 2-core machine a block of rounds per variant drifted by 30% between runs.
    times = dict.fromkeys(VARIANTS, float("inf"))
    modules = 0
    for _ in range(ROUNDS):
        for variant in VARIANTS:
            if variant == "plain":
                times[variant] = min(times[variant], _time(step, device))
                continue
            backward = variant == "backward"
            with cudatimer.instrument(model, backward=backward, timer=timer) as handle:
                modules = len(handle)
                step()
                times[variant] = min(times[variant], _time(step, device))
            timer.summary()  # resolves every sample: nothing left pending
            timer.reset()
    plain = times["plain"]
    print(f"{device}: {modules} modules, {STEPS} steps x {ROUNDS} rounds (best round)")
    for variant in VARIANTS:
        t = times[variant]
        extra_us = (t - plain) * 1e6 / modules
        print(
            f"{variant:9s} {t * 1e3:8.3f} ms/step  {t / plain:5.2f}x  "
            f"{extra_us:+7.2f} us per module per step"
        )


if __name__ == "__main__":
    main()
