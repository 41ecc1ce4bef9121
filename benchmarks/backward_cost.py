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

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import cudatimer  # noqa: E402
from _workloads import GPT, GPTConfig  # noqa: E402

# Steps per timing and timings per variant; the environment variable keeps the smoke test short.
STEPS = int(os.environ.get("CUDATIMER_BENCH_N", "200"))
ROUNDS = 7
VARIANTS = ("plain", "forward", "backward")


def _model(device: str) -> tuple[GPT, Callable[[], None]]:
    if device == "cpu":
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
    """Seconds per step: the best of ROUNDS runs of STEPS steps (the least disturbed)."""
    best = float("inf")
    for _ in range(ROUNDS):
        if device != "cpu":
            torch.cuda.synchronize()
        gc.collect()
        t0 = time.perf_counter()
        for _ in range(STEPS):
            step()
        if device != "cpu":
            torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / STEPS)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    device = parser.parse_args().device
    model, step = _model(device)
    timer = cudatimer.Timer(name="backward-cost")
    for _ in range(3):
        step()  # warm up: allocator, kernels
    times: dict[str, float] = {}
    modules = 0
    for variant in VARIANTS:
        if variant == "plain":
            times[variant] = _time(step, device)
            continue
        with cudatimer.instrument(model, backward=variant == "backward", timer=timer) as h:
            modules = len(h)
            step()
            times[variant] = _time(step, device)
            cudatimer.step()
    timer.summary()  # resolves every sample: nothing left pending
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
