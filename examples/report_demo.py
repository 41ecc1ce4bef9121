"""The report examples of docs/reports.md: a small training loop timed with cudatimer, read
every way.

    python examples/report_demo.py [--out DIR] [--steps 30]

Runs on the GPU when there is one (regions timed with CUDA events), else on the CPU (regions
timed on the host clock). Prints the tree and flat reports of the steps after warm-up, then
writes into DIR (default: the current directory; created if missing) run.json, run_small.json
(the same loop with a smaller model, to compare), trace.json and report.png. Then try:

    cudatimer show DIR/run.json --view tree
    cudatimer compare DIR/run.json DIR/run_small.json
    cudatimer trace DIR/run.json -o DIR/trace.json      # open in https://ui.perfetto.dev
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from torch import nn

import cudatimer
from cudatimer import cuda_region

WARMUP = 5


def train(hidden: int, steps: int, device: str) -> None:
    """``steps`` iterations of a 2-layer MLP, each region named after what it does."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(512, hidden), nn.GELU(), nn.Linear(hidden, 512)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = [torch.randn(256, 512) for _ in range(4)]  # on the host, like a data loader's
    for i in range(steps):
        with cuda_region("train_step"):
            with cuda_region("data"):
                x = batches[i % len(batches)].to(device, non_blocking=True)
            with cuda_region("forward"):
                loss = model(x).square().mean()
            with cuda_region("backward"):
                loss.backward()
            with cuda_region("optimizer"):
                opt.step()
                opt.zero_grad(set_to_none=True)
        cudatimer.step()  # one step per iteration: windows, warm-up and per-step series


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # The current directory by default, never the checkout: a run must not overwrite the
    # tracked examples/report.png (the picture in the README) unless asked to.
    parser.add_argument("--out", type=Path, default=Path("."), help="default: .")
    parser.add_argument("--png", type=Path, default=None, help="default: OUT/report.png")
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    png = args.png if args.png is not None else args.out / "report.png"
    device = "cuda" if torch.cuda.is_available() else "cpu"

    train(2048, args.steps, device)
    cudatimer.report(view="tree", warmup=WARMUP)
    print()
    cudatimer.report(warmup=WARMUP, fmt="github")
    cudatimer.save(args.out / "run.json", warmup=WARMUP)
    cudatimer.export_trace(args.out / "trace.json", warmup=WARMUP)
    try:
        cudatimer.plot(png, warmup=WARMUP)
    except ImportError as exc:
        print(f"no plot: {exc}")

    cudatimer.reset()
    train(1024, args.steps, device)
    cudatimer.save(args.out / "run_small.json", warmup=WARMUP)
    print(f"\nwrote run.json, run_small.json, trace.json and {png.name} into {args.out}")


if __name__ == "__main__":
    main()
