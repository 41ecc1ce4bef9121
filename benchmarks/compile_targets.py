"""Regions inside torch.compile: what timing every module of a compiled model costs.

A GPT-2-small training step (batch 8 x 512 tokens, bf16 autocast, inductor default mode),
compiled twice in one process: plain, and with every module instrumented (each forward's
regions become cudatimer's enter/exit marks inside the graph), and with every module
instrumented with ``backward=True`` (also one mark per call in the backward graph). The three
compiled steps then run in interleaved rounds (plain, timed, backward, then reversed ...); the
figures are the ratios of the median step times to plain's. Also: each compile's wall time,
and that every module has a GPU total (and a backward row).

    python benchmarks/compile_targets.py --rounds 15 --json results/compile_targets.json
    python benchmarks/compile_targets.py --smoke   # CPU, a tiny model: the script runs

Needs CUDA for the real figures; with ``--smoke`` it runs a 2-layer model on the CPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _workloads import GPT, GPTConfig

import cudatimer


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _step_fn(
    model: torch.nn.Module, compiled: Any, idx: torch.Tensor, device: str
) -> Callable[[], None]:
    tgt = idx.roll(1, dims=1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device == "cuda" or None)
    dtype = torch.bfloat16

    def step() -> None:
        with torch.autocast(device_type=device, dtype=dtype):
            logits = compiled(idx)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)).float(), tgt.view(-1))
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def _timed_steps(step: Callable[[], None], n: int, device: str) -> float:
    """Milliseconds per step over ``n`` steps (one sync at each end)."""
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    _sync(device)
    return (time.perf_counter() - t0) * 1e3 / n


def _mark_cost(device: str, n: int = 5000) -> dict[str, float]:
    """Host microseconds one region adds: eager (enter + exit called directly), and inside a
    compiled function (its two marks, as Inductor's code calls them), against the same
    compiled function without the region."""
    timer = cudatimer.Timer(name="mark-cost")
    region = timer.region("r")
    x = torch.ones(4, device=device)

    def bare(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    def marked(x: torch.Tensor) -> torch.Tensor:
        with timer.region("r"):
            x = x + 1
        return x

    fns = {
        "bare": torch.compile(bare, fullgraph=True),
        "marked": torch.compile(marked, fullgraph=True),
    }

    def direct() -> None:
        region.__enter__()
        region.__exit__(None, None, None)

    got: dict[str, float] = {}
    for name, fn in (("bare", lambda: fns["bare"](x)), ("marked", lambda: fns["marked"](x))):
        fn()
        got[name] = min(timeit.repeat(fn, number=n, repeat=5)) / n * 1e6
    direct()
    eager = min(timeit.repeat(direct, number=n, repeat=5)) / n * 1e6
    _sync(device)
    return {"eager_region_us": eager, "compiled_region_us": got["marked"] - got["bare"]}


def workload(smoke: bool) -> tuple[str, GPTConfig, torch.Tensor]:
    """(device, model config, token batch): GPT-2-small at 8 x 512 on CUDA, or with ``smoke``
    (or no CUDA) a 2-layer model on the CPU; the seed set first."""
    device = "cpu" if smoke or not torch.cuda.is_available() else "cuda"
    if smoke:
        cfg, batch, seq = GPTConfig(vocab=256, seq=32, layers=2, width=64, heads=4), 2, 32
    else:
        cfg, batch, seq = GPTConfig(), 8, 512
    torch.manual_seed(0)
    return device, cfg, torch.randint(0, cfg.vocab, (batch, seq), device=device)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--steps", type=int, default=5, help="steps per round and variant")
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny model: the script runs")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)

    device, cfg, idx = workload(args.smoke)
    plain = GPT(cfg).to(device)
    timed = GPT(cfg).to(device)
    timed.load_state_dict(plain.state_dict())
    both = GPT(cfg).to(device)
    both.load_state_dict(plain.state_dict())
    timer = cudatimer.Timer(name="compiled-gpt2")
    handle = cudatimer.instrument(timed, timer=timer)
    modules = len(handle.regions)
    both_timer = cudatimer.Timer(name="compiled-gpt2-backward")
    both_handle = cudatimer.instrument(both, timer=both_timer, backward=True)

    out: dict[str, Any] = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu"}
    out["torch"] = torch.__version__
    out["modules"] = modules
    steps: dict[str, Callable[[], None]] = {}
    for name, model in (("plain", plain), ("timed", timed), ("backward", both)):
        compiled = torch.compile(model)
        step = _step_fn(model, compiled, idx, device)
        _sync(device)
        t0 = time.perf_counter()
        step()  # compiles forward and backward
        _sync(device)
        out[f"compile_s_{name}"] = time.perf_counter() - t0
        for _ in range(3):
            step()  # warm: autotuning done, allocator settled
        steps[name] = step
    timer.reset()
    both_timer.reset()

    per: dict[str, list[float]] = {"plain": [], "timed": [], "backward": []}
    order = ["plain", "timed", "backward"]
    for r in range(args.rounds):
        for name in order if r % 2 == 0 else order[::-1]:
            per[name].append(_timed_steps(steps[name], args.steps, device))
    plain_ms = statistics.median(per["plain"])
    timed_ms = statistics.median(per["timed"])
    out["plain_ms"] = plain_ms
    out["timed_ms"] = timed_ms
    out["ratio"] = timed_ms / plain_ms
    out["ratios_per_round"] = [t / p for p, t in zip(per["plain"], per["timed"], strict=True)]
    out["backward_ms"] = statistics.median(per["backward"])
    out["backward_ratio"] = out["backward_ms"] / plain_ms
    rows = [r for r in both_timer.summary().regions if ".backward" in r.name]
    out["backward_rows"] = len(rows)
    out["backward_calls_per_row"] = sorted({r.calls for r in rows})
    s = timer.summary()
    names = {r.name for r in s.regions if r.gpu_total_ms is not None or device == "cpu"}
    out["regions_with_gpu_time"] = len(names)
    out["calls_per_module"] = sorted({r.calls for r in s.regions})
    handle.remove()
    both_handle.remove()
    out.update(_mark_cost(device))
    print(json.dumps(out, indent=2))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    if out["regions_with_gpu_time"] < modules:
        print(f"only {out['regions_with_gpu_time']} of {modules} modules timed", file=sys.stderr)
        return 1
    if out["backward_rows"] < len(set(both_handle.backward_regions.values())):
        print(f"only {out['backward_rows']} backward rows", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
