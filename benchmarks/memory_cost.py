"""What ``memory=True`` costs, and why it reads the allocator's event history instead of its
statistics at each boundary, measuring one episode in ``memory_every`` (default 10).

On a GPU (``--device cuda``), three parts:

1. ``readers``: host microseconds per call of each way to learn the allocator's state at a
   region boundary, each in a loop of ``--calls`` calls, medians of ``--rounds`` interleaved
   rounds: ``torch.cuda.memory_allocated()`` (the statistics dict, flattened in Python),
   ``torch._C._cuda_memoryStats`` (the same dict, nested, as C++ builds it), and what a
   measured boundary of ``memory=True`` does: one ``torch._C._cuda_setMemoryMetadata`` call.
   Then the cost per event of reading the history back (``torch.cuda.memory._snapshot()`` and
   cudatimer's replay), from a region with ``--events`` allocations and frees.
2. ``region``: one region around a tiny op (``x.add_(1)`` and a 512-byte temporary), enter +
   exit, us per region: without memory, with the default ``memory_every`` (each call is its
   own episode: one in 10 measured), with ``memory_every=1`` (every call measured), and a
   call inside an episode that is not measured (``skipped``: what most boundaries cost).
3. ``train``: the issue's target: a 12-layer GPT-2 (HF ``GPT2LMHeadModel``; ``_workloads.GPT``
   with the same sizes where transformers is missing), batch 8 x 512, bf16 autocast, fused
   AdamW, every module instrumented with ``backward=True``: the step plain, timed (memory
   off), with ``memory=True`` (the default ``memory_every``) and with ``memory_every=1``,
   blocks of ``CUDATIMER_BENCH_N`` steps (default: ``memory_every``, so each block holds one
   measured step) in rotated rounds (each round runs every variant, then plain again). The
   figure is the median over rounds of memory / timed: target <= 1.05.

``--smoke``: the same parts on the CPU through the fake GPU of the tests
(``tests/helpers/fake_cuda.py``): its allocator's boundary marks and history reads cost almost
nothing, so what is measured is cudatimer's own Python per boundary and per event, on a tiny
model (2 layers, width 64).

    python benchmarks/memory_cost.py --smoke
    python benchmarks/memory_cost.py --device cuda --out benchmarks/results/memory_gpu.json
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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
import torch.nn.functional as F
from _workloads import GPT, GPTConfig
from backward_cost import rotated_rounds
from torch import nn

import cudatimer
from cudatimer import Timer
from cudatimer.sources._memory import MEMORY_EVERY

ROUNDS = 12
VARIANTS = ("plain", "timed", "memory", "memory_all")
#: The region options of each variant but plain.
OPTIONS: dict[str, dict[str, Any]] = {
    "timed": {},
    "memory": {"memory": True},
    "memory_all": {"memory": True, "memory_every": 1},
}


def _median_us(fn: Callable[[], None], calls: int, rounds: int) -> float:
    """Median over ``rounds`` of the host us per call of ``fn`` run ``calls`` times."""
    per = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        per.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(per)


def readers(device: str, calls: int, rounds: int, events: int) -> dict[str, float]:
    """Host us per call of each allocator reader, and per event of reading the history."""
    out: dict[str, float] = {}
    if device == "cuda":
        dev = torch.cuda.current_device()
        stats: Any = torch._C._cuda_memoryStats
        tag: Any = getattr(torch._C, "_cuda_setMemoryMetadata", None)
        candidates: dict[str, Callable[[], None]] = {
            "memory_allocated_us": lambda: torch.cuda.memory_allocated(dev),
            "cuda_memoryStats_us": lambda: stats(dev),
        }
        if tag is not None:
            candidates["setMemoryMetadata_us"] = lambda: tag("\x01ct123456789")
        for _ in range(rounds):  # interleaved: each round runs every candidate
            for name, fn in candidates.items():
                out.setdefault(name, []).append(_median_us(fn, calls, 1))  # type: ignore[attr-defined]
        for name in candidates:
            out[name] = statistics.median(out[name])  # type: ignore[arg-type]
    t = Timer(name="memory-readers")
    alloc = _allocator(device)
    region = t.region("many", memory=True, memory_every=1)
    with region:  # turns the history on (cudatimer's first memory region)
        alloc(1)
    t.summary()
    per_event = []
    for _ in range(max(3, rounds // 4)):
        with region:
            for _ in range(events // 2):
                alloc(512)
        gc.collect()
        t0 = time.perf_counter()
        t.recorder.memory.drain(0.0)
        per_event.append((time.perf_counter() - t0) / events * 1e6)
    out["history_read_us_per_event"] = statistics.median(per_event)
    return out


def _allocator(device: str) -> Callable[[int], None]:
    """Allocate and free ``n`` bytes on ``device``: a real tensor on the GPU, the fake
    allocator's two events on the CPU."""
    if device == "cuda":

        def alloc(n: int) -> None:
            torch.empty(n, dtype=torch.uint8, device="cuda")  # freed at once: a temporary

        return alloc
    from cudatimer.core import _device
    from tests.helpers.fake_cuda import FakeAllocator  # the smoke run's fake GPU is installed

    fake = _device.allocator()
    assert isinstance(fake, FakeAllocator)
    return fake.temp


def region_cost(device: str, calls: int, rounds: int) -> dict[str, float]:
    """us per region (enter + exit) around a tiny op: without memory, with the default
    memory_every, with memory_every=1, and inside an episode that is not measured."""
    t = Timer(name="memory-region")
    x = torch.zeros(16, device=device)
    alloc = _allocator(device)
    regions = {
        "plain": t.region("plain"),
        "memory": t.region("measured", memory=True),
        "memory_all": t.region("all", memory=True, memory_every=1),
    }
    outer = t.region("outer", memory=True, memory_every=1 << 40)
    inner = t.region("skipped", memory=True)

    def run(region: Any) -> Callable[[], None]:
        def once() -> None:
            with region:
                x.add_(1)
                alloc(512)

        return once

    def skipped() -> float:
        with outer:  # its first episode: measured
            pass
        with outer:  # its second: not measured, nor any call inside it
            return _median_us(run(inner), calls, 1)

    got: dict[str, list[float]] = {k: [] for k in (*regions, "skipped")}
    for _ in range(rounds):
        for name, region in regions.items():
            got[name].append(_median_us(run(region), calls, 1))
        got["skipped"].append(skipped())
        t.summary()
    out = {f"{k}_us_per_region": statistics.median(v) for k, v in got.items()}
    for k in ("memory", "memory_all", "skipped"):
        out[f"{k}_added_us_per_region"] = statistics.median(
            m - p for m, p in zip(got[k], got["plain"], strict=True)
        )
    return out


def _gpt2(device: str, smoke: bool) -> tuple[nn.Module, Callable[[], None], str]:
    torch.manual_seed(0)
    if smoke:
        cfg = GPTConfig(vocab=128, seq=16, layers=2, width=64, heads=4)
        model: nn.Module = GPT(cfg)
        idx = torch.randint(0, cfg.vocab, (2, cfg.seq))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step() -> None:
            logits = model(idx)
            F.cross_entropy(logits.view(-1, logits.size(-1)), idx.view(-1)).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        return model, step, "smoke: _workloads.GPT 2 x 64, batch 2 x 16, fp32, AdamW (CPU)"
    batch, seq = 8, 512
    try:
        from transformers import GPT2Config, GPT2LMHeadModel

        model = GPT2LMHeadModel(GPT2Config(n_layer=12, n_positions=seq)).cuda()
        what, hf, vocab = "HF GPT2LMHeadModel", True, 50257
    except ImportError:
        model = GPT(GPTConfig(seq=seq, layers=12)).cuda()
        what, hf, vocab = "_workloads.GPT", False, GPTConfig.vocab
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    idx = torch.randint(0, vocab, (batch, seq), device="cuda")

    def gpu_step() -> None:
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            if hf:
                loss = model(input_ids=idx, labels=idx).loss
            else:
                logits = model(idx)
                loss = F.cross_entropy(logits.view(-1, logits.size(-1)), idx.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return model, gpu_step, f"{what}, 12 x 768, batch 8 x 512, bf16 autocast, fused AdamW"


def train(device: str, smoke: bool, steps: int, rounds: int) -> dict[str, Any]:
    """Step times plain, timed (every module, backward=True), with memory=True (the default
    memory_every) and with memory_every=1."""
    model, step, what = _gpt2(device, smoke)
    timer = Timer(name="memory-train")
    for _ in range(3):
        step()  # warm-up: allocator, kernels, optimizer state

    def timed(seconds: Callable[[], float]) -> float:
        if device == "cuda":
            torch.cuda.synchronize()
        gc.collect()
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        if device == "cuda":
            torch.cuda.synchronize()
        return (time.perf_counter() - t0) / steps

    @contextlib.contextmanager
    def variant(name: str) -> Iterator[None]:
        if name == "plain":
            yield
            return
        # The step before the block is each variant's first (a measured one with memory):
        # reset() below counts episodes anew, so every block of `steps` steps holds the same
        # measured steps.
        with cudatimer.instrument(model, backward=True, timer=timer, **OPTIONS[name]):
            step()
            yield
        timer.summary()
        timer.reset()

    def block(name: str) -> float:
        with variant(name):
            return timed(lambda: 0.0)

    times, _ = rotated_rounds({v: (lambda v=v: block(v)) for v in VARIANTS}, rounds)
    out: dict[str, Any] = {
        "what": what,
        "steps": steps,
        "rounds": rounds,
        "memory_every": MEMORY_EVERY,
    }
    for v in VARIANTS:
        out[f"{v}_ms_median"] = statistics.median(times[v]) * 1e3
    for v in ("memory", "memory_all"):
        ratios = [m / t for m, t in zip(times[v], times["timed"], strict=True)]
        out[f"{v}_over_timed_median"] = statistics.median(ratios)
        out[f"{v}_over_timed"] = [round(r, 4) for r in ratios]
        out[f"{v}_added_ms_per_step_median"] = statistics.median(
            (m - t) * 1e3 for m, t in zip(times[v], times["timed"], strict=True)
        )
    out["timed_over_plain_median"] = statistics.median(
        t / p for t, p in zip(times["timed"], times["plain"], strict=True)
    )
    # The rows of `steps` + 1 steps with the default: how many calls each row measured.
    with cudatimer.instrument(model, backward=True, memory=True, timer=timer) as handle:
        for _ in range(steps + 1):
            step()
        out["modules"] = len(handle)
    s = timer.summary()
    measured = [r for r in s.regions if "mem_delta" in r.values]
    out["rows_with_memory"] = len(measured)
    out["calls_per_row"] = max((r.calls for r in measured), default=0)
    out["measured_calls_per_row"] = max((r.values["mem_delta"].count for r in measured), default=0)
    timer.reset()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--smoke", action="store_true", help="CPU, the tests' fake GPU, small")
    parser.add_argument("--parts", default="readers,region,train")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--events", type=int, default=20000)
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON")
    args = parser.parse_args()
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    bad = set(parts) - {"readers", "region", "train"}
    if bad:
        parser.error(f"--parts: unknown {', '.join(sorted(bad))} (readers, region, train)")
    steps = int(os.environ.get("CUDATIMER_BENCH_N", "2" if args.smoke else str(MEMORY_EVERY)))
    if args.smoke:
        # One intra-op thread: two threads on a loaded 2-core machine wait on each other
        # (a 16-wide linear took 2 ms instead of 10 us in backward_cost.py).
        torch.set_num_threads(1)
        args.device = "cpu"
        args.rounds = min(args.rounds, 3)
        args.calls, args.events = min(args.calls, 200), min(args.events, 2000)
    elif args.device != "cuda" or not torch.cuda.is_available():
        parser.error("needs a CUDA device (--smoke runs on the CPU)")
    results: dict[str, Any] = {"torch": torch.__version__, "device": args.device}
    with contextlib.ExitStack() as stack:
        if args.smoke:
            from tests.helpers.fake_cuda import install

            stack.enter_context(install())
        else:
            torch.cuda.init()
            results["gpu"] = torch.cuda.get_device_name()
        if "readers" in parts:
            r = readers(args.device, args.calls, args.rounds, args.events)
            results["readers"] = r
            for name, us in r.items():
                print(f"readers: {name:28s} {us:9.3f}")
        if "region" in parts:
            r = region_cost(args.device, args.calls, args.rounds)
            results["region"] = r
            for name, us in r.items():
                print(f"region:  {name:28s} {us:9.3f}")
        if "train" in parts:
            r = train(args.device, args.smoke, steps, args.rounds)
            results["train"] = r
            head = f"{r['modules']} modules, {steps} steps x {args.rounds} rounds"
            print(f"train: {r['what']}; {head}")
            for v in VARIANTS:
                print(f"  {v:10s} {r[f'{v}_ms_median']:9.3f} ms/step (median)")
            print(
                f"  memory / timed {r['memory_over_timed_median']:.3f}x (memory_every="
                f"{MEMORY_EVERY}, median of rounds; target <= 1.05; "
                f"+{r['memory_added_ms_per_step_median']:.3f} ms/step), memory_every=1 / timed "
                f"{r['memory_all_over_timed_median']:.3f}x "
                f"(+{r['memory_all_added_ms_per_step_median']:.3f} ms/step), timed / plain "
                f"{r['timed_over_plain_median']:.3f}x; {r['rows_with_memory']} rows with memory "
                f"values, {r['measured_calls_per_row']} of {r['calls_per_row']} calls measured"
            )
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
