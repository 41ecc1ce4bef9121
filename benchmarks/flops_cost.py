"""What ``flops=True`` costs and what it reads, on a GPT-2 training step.

The model: HF ``GPT2LMHeadModel`` built from a config (no download), bf16 autocast, fused
AdamW, every module instrumented. On a GPU (``--device cuda``): 12 layers x 768, batch
8 x 512. Parts:

1. ``signature``: host us per call of the signature check a counted module call makes
   (``_flops.signature`` on a GPT-2 block's arguments), median of ``--rounds`` rounds.
2. ``total``: the whole step counted once (a ``flops=True`` region around forward, backward
   and the optimizer) against the analytic count 6ND + 12*L*b*s^2*d (N the parameters
   without the position embedding, D the tokens; the second term the attention matmuls,
   forward and backward). Target: within 2%.
3. ``train``: the step plain, timed (``instrument``, every module) and with ``flops=True``,
   blocks of ``CUDATIMER_BENCH_N`` steps in rotated rounds (``backward_cost.rotated_rounds``;
   each variant attached, one step run to count, then timed, and removed, per round). The
   figure: median over rounds of flops / timed (target <= 1.01). The one-time counting cost:
   the first step of each flops block (every signature counted) minus the median step.
4. the per-layer table (``--table PATH``, Markdown): each module row's GFLOP a call,
   GPU ms, TFLOP/s and MFU from the flops variant's rows, the step row on top (its FLOPs
   over the plain step's time), and the check that a block's children and its own ops add up
   to the block.

``--device cpu``: the same on the CPU with a 4-layer x 256 model, batch 4 x 128, fp32, the host
clock (``--peak-tflops``: the peak MFU is taken against; the CPU has none in the table).
``--smoke``: 2 layers x 64, batch 2 x 32, seconds (tests/benchmarks runs it).

    python benchmarks/flops_cost.py --smoke
    python benchmarks/flops_cost.py --device cuda --out flops_gpu.json --table flops_layers.md
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import statistics
import sys
import time
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from backward_cost import rotated_rounds
from torch import nn

import cudatimer
from cudatimer import Timer
from cudatimer.records._records import RegionStats
from cudatimer.sources import _flops

ROUNDS = 12
VARIANTS = ("plain", "timed", "flops")
# (layers, width, heads, batch, seq, vocab): the GPU model is GPT-2 small's.
SIZES = {
    "cuda": (12, 768, 12, 8, 512, 50257),
    "cpu": (4, 256, 4, 4, 128, 8192),
    "smoke": (2, 64, 4, 2, 32, 1000),
}


def build(kind: str) -> tuple[nn.Module, Callable[[], None], dict[str, Any]]:
    """The model, one training step, and its sizes."""
    from transformers import GPT2Config, GPT2LMHeadModel

    layers, d, heads, b, s, vocab = SIZES[kind]
    cfg = GPT2Config(
        n_layer=layers,
        n_embd=d,
        n_head=heads,
        n_positions=s,
        vocab_size=vocab,
        bos_token_id=0,
        eos_token_id=0,
    )
    device = "cuda" if kind == "cuda" else "cpu"
    model = GPT2LMHeadModel(cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device == "cuda")
    idx = torch.randint(0, vocab, (b, s), device=device)

    def step() -> None:
        amp: contextlib.AbstractContextManager[Any] = (
            torch.autocast(device_type="cuda", dtype=torch.bfloat16)
            if device == "cuda"
            else contextlib.nullcontext()
        )
        with amp:
            loss = model(input_ids=idx, labels=idx, use_cache=False).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    n = sum(p.numel() for p in model.parameters()) - model.transformer.wpe.weight.numel()
    sizes = {"layers": layers, "width": d, "batch": b, "seq": s, "vocab": vocab, "params": n}
    sizes["analytic_flop"] = 6 * n * b * s + 12 * layers * b * s * s * d
    what = f"HF GPT2LMHeadModel {layers} x {d}, batch {b} x {s}, " + (
        "bf16 autocast, fused AdamW" if device == "cuda" else "fp32, AdamW, host clock"
    )
    sizes["what"] = what
    return model, step, sizes


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def signature_us(rounds: int) -> float:
    """Host us a call of the signature check on a GPT-2 block's arguments (self, hidden
    states, cache None, three keywords)."""
    block = nn.Linear(4, 4)
    x = torch.ones(8, 512, 768, device="meta")
    kwargs = {"attention_mask": None, "use_cache": False, "position_ids": None}
    n = 5000
    per = [
        timeit.timeit(lambda: _flops.signature((block, x, None), kwargs), number=n) / n * 1e6
        for _ in range(rounds)
    ]
    return statistics.median(per)


def total(step: Callable[[], None], sizes: dict[str, Any], peak: float | None) -> dict[str, Any]:
    """The whole step counted once, against the analytic count."""
    t = Timer(name="flops-total", peak_tflops=peak)
    t0 = time.perf_counter()
    with t.region("step", flops=True):
        step()
    counting_s = time.perf_counter() - t0
    flop = t.summary()["step"].flop_mean
    assert flop is not None
    return {
        "step_flop": flop,
        "analytic_flop": sizes["analytic_flop"],
        "counted_over_analytic": flop / sizes["analytic_flop"],
        "whole_step_counting_s": counting_s,
    }


def train(
    model: nn.Module, step: Callable[[], None], device: str, steps: int, rounds: int, peak: Any
) -> tuple[dict[str, Any], Timer]:
    """Interleaved rounds of plain, timed and flops; the flops Timer for the table."""
    timed_timer = Timer(name="flops-timed")
    flops_timer = Timer(name="flops-counted", peak_tflops=peak)
    for _ in range(3):
        step()  # warm-up: allocator, kernels, optimizer state
    first_s: list[float] = []
    modules = 0

    def run(n: int) -> float:
        _sync(device)
        gc.collect()
        t0 = time.perf_counter()
        for _ in range(n):
            step()
        _sync(device)
        return (time.perf_counter() - t0) / n

    def block(variant: str) -> float:
        nonlocal modules
        if variant == "plain":
            return run(steps)
        on = variant == "flops"
        timer = flops_timer if on else timed_timer
        with cudatimer.instrument(model, flops=on, timer=timer) as handle:
            modules = len(handle)
            first = run(1)  # the flops variant counts every signature here
            if on:
                first_s.append(first)
            seconds = run(steps)
        timer.summary()  # resolves every sample: nothing left pending
        return seconds

    times, _ = rotated_rounds({v: (lambda v=v: block(v)) for v in VARIANTS}, rounds)
    ratios = [f / t for f, t in zip(times["flops"], times["timed"], strict=True)]
    out: dict[str, Any] = {"steps": steps, "rounds": rounds, "modules": modules}
    for v in VARIANTS:
        out[f"{v}_ms_median"] = statistics.median(times[v]) * 1e3
        out[f"{v}_ms_spread"] = [min(times[v]) * 1e3, max(times[v]) * 1e3]
    out["flops_over_timed_median"] = statistics.median(ratios)
    out["flops_over_timed"] = [round(r, 4) for r in ratios]
    out["flops_over_timed_spread"] = [min(ratios), max(ratios)]
    out["timed_over_plain_median"] = statistics.median(
        t / p for t, p in zip(times["timed"], times["plain"], strict=True)
    )
    steady = statistics.median(times["flops"])
    out["counting_cost_s_median"] = statistics.median(first_s) - steady
    out["counting_cost_s_spread"] = [min(first_s) - steady, max(first_s) - steady]
    return out, flops_timer


def _ms(r: RegionStats) -> float | None:
    return r.gpu_mean_ms if r.gpu_mean_ms is not None else r.cpu_mean_ms


def table(timer: Timer, res: dict[str, Any], sizes: dict[str, Any], peak_note: str) -> str:
    """The per-layer Markdown table of the flops variant's rows (the first block's modules,
    the model's own rows), the step row on top."""
    s = timer.summary()
    keep = []
    for r in s.regions:
        parts = r.name.split("/")
        leaf = parts[-1]
        if "h." in r.name and not any(p == "h.0" for p in parts):
            continue  # one block stands for the others
        if leaf in ("wte", "wpe", "drop", "ln_1", "ln_2", "ln_f", "resid_dropout", "dropout"):
            continue
        if "flop" in r.values:
            keep.append(r)
    step_ms = res["train"]["plain_ms_median"]
    flop = res["total"]["step_flop"]
    rate = flop / step_ms * 1e-9
    lines = [
        "| region | GFLOP/call | ms/call | TFLOP/s | MFU |",
        "| --- | ---: | ---: | ---: | ---: |",
        f"| whole step (fwd+bwd+opt, plain step time) | {flop / 1e9:.4g} | {step_ms:.2f} | "
        f"{rate:.3g} | {_mfu_of(rate, s)} |",
    ]
    for r in keep:
        ms = _ms(r)
        lines.append(
            f"| {r.name} | {(r.flop_mean or 0) / 1e9:.3g} | "
            f"{'-' if ms is None else f'{ms:.3f}'} | "
            f"{'-' if r.tflop_per_s is None else f'{r.tflop_per_s:.3g}'} | "
            f"{'-' if r.mfu is None else f'{100 * r.mfu:.1f}%'} |"
        )
    lines.append("")
    lines.append(f"{sizes['what']}; forward rows per module (instrument(flops=True)). {peak_note}")
    return "\n".join(lines) + "\n"


def _mfu_of(rate: float, s: Any) -> str:
    peaks = [r.values["flop_peak"].mean for r in s.regions if "flop_peak" in r.values]
    return "-" if not peaks else f"{100 * rate / max(peaks):.1f}%"


def block_sums(timer: Timer) -> dict[str, float]:
    """Each counted row's children and its own ops against the row: the largest relative
    gap between a parent's FLOPs and the sum of its children's (the own part: >= 0)."""
    s = timer.summary()
    rows = {r.name: r for r in s.regions if r.flop_mean is not None}
    worst_over = 0.0
    for name, r in rows.items():
        kids = [k for n, k in rows.items() if n.rpartition("/")[0] == name]
        if not kids or not r.flop_mean:
            continue
        over = sum(k.flop_mean or 0.0 for k in kids) / r.flop_mean - 1.0
        worst_over = max(worst_over, over)
    block = rows.get(next((n for n in rows if n.endswith("/h.0")), ""))
    out = {"children_over_parent_max": worst_over}
    if block is not None and block.flop_mean:
        kids = [k for n, k in rows.items() if n.rpartition("/")[0] == block.name]
        out["block_own_fraction"] = 1.0 - sum(k.flop_mean or 0.0 for k in kids) / block.flop_mean
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny model, seconds")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--peak-tflops", type=float, default=None, help="peak for MFU")
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON")
    parser.add_argument("--table", type=Path, default=None, help="write the per-layer table")
    args = parser.parse_args()
    kind = "smoke" if args.smoke else args.device
    if kind == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda needs a CUDA device (--smoke runs on the CPU)")
    if kind not in SIZES:
        parser.error(f"--device must be cuda or cpu, got {args.device!r}")
    if kind != "cuda":
        # One intra-op thread: two on a loaded 2-core machine wait on each other.
        torch.set_num_threads(1)
    rounds = min(args.rounds, 2) if args.smoke else args.rounds
    steps = int(os.environ.get("CUDATIMER_BENCH_N", "1" if args.smoke else "8"))
    started = time.perf_counter()
    torch.manual_seed(0)
    model, step, sizes = build(kind)
    results: dict[str, Any] = {"torch": torch.__version__, "device": kind, "what": sizes["what"]}
    if kind == "cuda":
        results["gpu"] = torch.cuda.get_device_name()
    results["signature_us"] = signature_us(rounds=max(rounds, 5))
    print(f"signature check: {results['signature_us']:.3f} us a call (median)")
    results["total"] = total(step, sizes, args.peak_tflops)
    tot = results["total"]
    print(
        f"step total: counted {tot['step_flop'] / 1e12:.4f} TFLOP, analytic 6ND + 12Lbs^2d "
        f"{tot['analytic_flop'] / 1e12:.4f} TFLOP: {tot['counted_over_analytic']:.4f}x "
        "(target within 2%)"
    )
    res, timer = train(
        model, step, kind if kind == "cuda" else "cpu", steps, rounds, args.peak_tflops
    )
    results["train"] = res
    print(f"train: {sizes['what']}; {res['modules']} modules, {steps} steps x {rounds} rounds")
    for v in VARIANTS:
        lo, hi = res[f"{v}_ms_spread"]
        print(f"  {v:6s} {res[f'{v}_ms_median']:9.3f} ms/step (median; {lo:.3f}-{hi:.3f})")
    lo, hi = res["flops_over_timed_spread"]
    print(
        f"  flops / timed {res['flops_over_timed_median']:.4f}x (median of rounds, "
        f"{lo:.4f}-{hi:.4f}; target <= 1.01), timed / plain {res['timed_over_plain_median']:.3f}x"
    )
    lo, hi = res["counting_cost_s_spread"]
    print(
        f"  one-time counting cost: {res['counting_cost_s_median']:.3f} s "
        f"({lo:.3f}-{hi:.3f}) per attach (every module's first call counted)"
    )
    results["sums"] = block_sums(timer)
    print(
        f"  children / parent - 1, largest: {results['sums']['children_over_parent_max']:.2e} "
        f"(<= 0: a parent holds its children); h.0's own ops: "
        f"{results['sums'].get('block_own_fraction', float('nan')):.4f} of the block"
    )
    peak_note = (
        f"MFU against {args.peak_tflops:g} TFLOP/s (given)."
        if args.peak_tflops
        else "MFU against the peak table (docs/flops.md)."
    )
    text = table(timer, results, sizes, peak_note)
    print(text)
    if args.table is not None:
        args.table.write_text(text)
    results["wall_s"] = time.perf_counter() - started
    print(f"wall time {results['wall_s']:.1f} s")
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
