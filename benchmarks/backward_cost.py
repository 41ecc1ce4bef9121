"""What ``instrument(model, backward=True)`` costs: host time per module per training step
(CPU), and on a GPU the step-time ratios and the backward coverage.

On the CPU a GPT-2-style model (``_workloads.GPT``) trains with forward, cross-entropy and
backward (no optimizer: it touches no module). The model is tiny (width 16, 8 tokens), so the
step is almost all host work and the difference between the variants is the instrumentation's
host cost; it is divided by the number of instrumented modules.

On a GPU (``--device cuda``) two training steps are timed: a 6-layer HF GPT-2
(batch 8 x 512, bf16 autocast, fused AdamW; ``_workloads.GPT`` with the same sizes where
transformers is missing) and torchvision's ResNet-50 (batch 256, channels_last, bf16, SGD).
Each step runs plain, with every module's forward instrumented, with ``backward=True``, and
as the floor: a do-nothing Python pre-hook where ``backward=True`` puts its hook, no cudatimer;
the targets are <= 1.05x (GPT-2) and <= 1.03x (ResNet-50) for ``backward``. One more
instrumented step per round, with a region around ``loss.backward()``, gives the coverage:
the share of the ``<Model>.backward`` root that its child rows cover (target >= 95%), and the
share of the whole ``loss.backward()`` that the root covers.

    python benchmarks/backward_cost.py                          # CPU: us per module per step
    python benchmarks/backward_cost.py --device cuda --rounds 16 --out backward_cost.json  # GPU
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
import torch.nn.functional as F
from _workloads import GPT, GPTConfig
from torch import nn

import cudatimer

# Steps per timing and timings per variant; the environment variable keeps the smoke test short.
STEPS = int(os.environ.get("CUDATIMER_BENCH_N", "100"))
ROUNDS = 15
VARIANTS = ("plain", "forward", "backward", "floor")
# A step with a context manager around its backward call (a region, or nothing).
Step = Callable[[Callable[[], contextlib.AbstractContextManager[Any]]], None]


def _cpu_model() -> tuple[nn.Module, Step]:
    # One intra-op thread: with two on a loaded 2-core machine a 16-wide linear took 2 ms
    # (threads waiting on each other) instead of 10 us, and the host cost drowned in it.
    torch.set_num_threads(1)
    cfg = GPTConfig(vocab=64, seq=8, layers=6, width=16, heads=2)
    torch.manual_seed(0)
    model = GPT(cfg)
    idx = torch.randint(0, cfg.vocab, (1, cfg.seq))
    tgt = torch.randint(0, cfg.vocab, (1, cfg.seq))

    def step(around: Callable[[], contextlib.AbstractContextManager[Any]]) -> None:
        logits = model(idx)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), tgt.view(-1))
        with around():
            loss.backward()  # type: ignore[no-untyped-call]
        for p in model.parameters():
            p.grad = None

    return model, step


def _gpt2_cuda() -> tuple[nn.Module, Step, str]:
    """The GPU step: 6-layer GPT-2 (768 wide, 12 heads), batch 8 x 512, bf16, AdamW."""
    torch.manual_seed(0)
    batch, seq, vocab = 8, 512, 50257
    try:
        from transformers import GPT2Config, GPT2LMHeadModel

        model: nn.Module = GPT2LMHeadModel(GPT2Config(n_layer=6, n_positions=seq)).cuda()
        what = "HF GPT2LMHeadModel, 6 x 768, 12 heads, batch 8 x 512, bf16 autocast, fused AdamW"
        hf = True
    except ImportError:
        model = GPT(GPTConfig(seq=seq, layers=6)).cuda()
        what = "_workloads.GPT, 6 x 768, 12 heads, batch 8 x 512, bf16 autocast, fused AdamW"
        hf, vocab = False, GPTConfig.vocab
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    idx = torch.randint(0, vocab, (batch, seq), device="cuda")

    def step(around: Callable[[], contextlib.AbstractContextManager[Any]]) -> None:
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            if hf:
                loss = model(input_ids=idx, labels=idx).loss
            else:
                logits = model(idx)
                loss = F.cross_entropy(logits.view(-1, logits.size(-1)), idx.view(-1))
        with around():
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return model, step, what


def _resnet50_cuda() -> tuple[nn.Module, Step, str]:
    """torchvision's ResNet-50, batch 256 x 224^2, channels_last, bf16 autocast, SGD."""
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet50(weights=None)
    model = model.to(device="cuda", memory_format=torch.channels_last)  # type: ignore[call-overload]
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(256, 3, 224, 224, device="cuda").contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (256,), device="cuda")

    def step(around: Callable[[], contextlib.AbstractContextManager[Any]]) -> None:
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        with around():
            loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
        opt.zero_grad(set_to_none=True)

    return model, step, "torchvision ResNet-50, batch 256 x 224^2, channels_last, bf16, SGD"


def _output_tensor(out: Any) -> torch.Tensor | None:
    """The first tensor with a grad_fn in a module's output (a tensor, or one directly in a
    tuple, list, dict or HF ModelOutput)."""
    if isinstance(out, torch.Tensor):
        return out if out.grad_fn is not None else None
    items = out.values() if isinstance(out, dict) else out if isinstance(out, tuple | list) else ()
    for t in items:
        if isinstance(t, torch.Tensor) and t.grad_fn is not None:
            return t
    return None


@contextlib.contextmanager
def _bare_hooks(model: nn.Module) -> Any:
    """The floor of the mechanism without cudatimer: each module's forward wrapped to put one
    do-nothing Python pre-hook on the node that made its output (its first output tensor with
    a node; nested modules returning one tensor share it), as ``instrument(backward=True)``
    puts one per module; nothing timed, no region."""
    last = [-1]

    def nothing(grad_outputs: Any) -> None:
        return None

    def wrap(forward: Callable[..., Any]) -> Callable[..., Any]:
        def hooked(*args: Any, **kwargs: Any) -> Any:
            out = forward(*args, **kwargs)
            t = _output_tensor(out)
            if t is not None:
                node = t.grad_fn
                seq = node._sequence_nr()  # type: ignore[union-attr]
                if seq != last[0]:
                    node.register_prehook(nothing)  # type: ignore[union-attr]
                    last[0] = seq
            return out

        return hooked

    modules = list(model.modules())
    for m in modules:
        m.forward = wrap(m.forward)  # type: ignore[method-assign]
    try:
        yield
    finally:
        for m in modules:
            del m.forward


def _time(step: Step, device: str, steps: int) -> float:
    """Seconds per step over ``steps`` steps: on the CPU this process's CPU time (other jobs on
    a shared machine moved wall time by 2x between runs, CPU time by a few %), on a GPU wall
    time between two synchronisations."""
    clock = time.process_time if device == "cpu" else time.perf_counter
    if device != "cpu":
        torch.cuda.synchronize()
    gc.collect()
    t0 = clock()
    for _ in range(steps):
        step(contextlib.nullcontext)
    if device != "cpu":
        torch.cuda.synchronize()
    return (clock() - t0) / steps


def rotated_rounds(
    blocks: dict[str, Callable[[], float]], rounds: int
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Each round runs every block (one of them "plain") in an order rotated by one each round,
    then "plain" once more; a block's ratio is its time over the mean of its round's two plain
    blocks. Returns each block's times and each other block's ratios, round by round."""
    names = list(blocks)
    times: dict[str, list[float]] = {n: [] for n in names}
    ratios: dict[str, list[float]] = {n: [] for n in names if n != "plain"}
    for i in range(rounds):
        order = names[i % len(names) :] + names[: i % len(names)]
        got = {n: blocks[n]() for n in order}
        plain = (got["plain"] + blocks["plain"]()) / 2
        for n in names:
            times[n].append(got[n])
        for n in ratios:
            ratios[n].append(got[n] / plain)
    return times, ratios


def _measure(model: nn.Module, step: Step, device: str, steps: int, rounds: int) -> dict[str, Any]:
    """Interleaved rounds of the three variants, then the coverage steps."""
    timer = cudatimer.Timer(name="backward-cost")
    for _ in range(3):
        step(contextlib.nullcontext)  # warm up: allocator, kernels, autotuning
    # Each round times plain, forward, backward and the floor (a do-nothing Python pre-hook
    # where backward=True puts its hook, without cudatimer) in a rotated order and plain once
    # more at its end; a variant's ratio is taken against the mean of its own round's two
    # plain blocks.
    # On the H200 machine the plain step moved between 21.9 and 24.5 ms from one block to the
    # next (one run, 5 rounds): ratios of medians taken across rounds read 1.15x where the
    # same code had read 1.02x on a quieter machine.
    modules = 0

    def block(variant: str) -> float:
        nonlocal modules
        if variant == "plain":
            return _time(step, device, steps)
        if variant == "floor":
            with _bare_hooks(model):
                step(contextlib.nullcontext)
                return _time(step, device, steps)
        with cudatimer.instrument(model, backward=variant == "backward", timer=timer) as handle:
            modules = len(handle)
            step(contextlib.nullcontext)
            seconds = _time(step, device, steps)
        timer.summary()  # resolves every sample: nothing left pending
        timer.reset()
        return seconds

    times, ratios = rotated_rounds({v: functools.partial(block, v) for v in VARIANTS}, rounds)
    # Coverage, apart from the timings: the same step with a region around loss.backward().
    cov_timer = cudatimer.Timer(name="backward-coverage")
    with cudatimer.instrument(model, backward=True, timer=cov_timer) as handle:
        for _ in range(steps):
            step(lambda: cov_timer.region("loss.backward"))
    s = cov_timer.summary()
    root_name = handle.backward_regions[""]
    clock = "host" if device == "cpu" else "cuda:0"
    root = s.get(root_name, clock=clock)
    whole = s.get("loss.backward", clock=clock)
    covs = [c for c in s.backward_coverage if c.clock == clock and c.region == root_name]
    out: dict[str, Any] = {"modules": modules, "steps": steps, "rounds": rounds}
    for v in VARIANTS:
        out[f"{v}_ms_median"] = statistics.median(times[v]) * 1e3
        out[f"{v}_ms_best"] = min(times[v]) * 1e3
    for v in VARIANTS[1:]:
        out[f"{v}_ratio_median"] = statistics.median(ratios[v])
        out[f"{v}_ratios"] = [round(r, 4) for r in ratios[v]]
        out[f"{v}_ratio_best"] = out[f"{v}_ms_best"] / out["plain_ms_best"]
    # What cudatimer adds on top of torch's own cost of Python pre-hooks, round by round.
    out["backward_over_floor_median"] = statistics.median(
        b / f for b, f in zip(times["backward"], times["floor"], strict=True)
    )
    if covs and root is not None and whole is not None:
        out["coverage"] = covs[0].fraction
        out["uncovered_ms_per_step"] = covs[0].uncovered_ms / steps
        out["root_ms_per_step"] = root.total_ms / steps
        out["loss_backward_ms_per_step"] = whole.total_ms / steps
        out["root_of_whole_backward"] = root.total_ms / whole.total_ms
    return out


def _print(name: str, what: str, r: dict[str, Any]) -> None:
    print(f"{name}: {what}; {r['modules']} modules, {r['steps']} steps x {r['rounds']} rounds")
    for v in VARIANTS:
        med, best = r[f"{v}_ms_median"], r[f"{v}_ms_best"]
        ratio = "" if v == "plain" else f"  {r[f'{v}_ratio_median']:.3f}x median of rounds"
        ratio += "" if v == "plain" else f"  {r[f'{v}_ratio_best']:.3f}x of best blocks"
        print(f"  {v:9s} {med:8.3f} ms/step median  {best:8.3f} best{ratio}")
    print(f"  backward / floor {r['backward_over_floor_median']:.3f}x median of rounds")
    if "coverage" in r:
        print(
            f"  coverage {r['coverage']:.1%} of the root ({r['root_ms_per_step']:.3f} ms/step, "
            f"{r['uncovered_ms_per_step']:.3f} uncovered); the root is "
            f"{r['root_of_whole_backward']:.1%} of loss.backward() "
            f"({r['loss_backward_ms_per_step']:.3f} ms/step)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--workloads", default="gpt2,resnet50", help="GPU: gpt2, resnet50")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON")
    args = parser.parse_args()
    results: dict[str, Any] = {"torch": torch.__version__, "device": args.device}
    if args.device == "cpu":
        model, step = _cpu_model()
        r = _measure(model, step, "cpu", STEPS, args.rounds)
        plain = r["plain_ms_best"]
        print(f"cpu: {r['modules']} modules, {STEPS} steps x {args.rounds} rounds (best round)")
        for v in VARIANTS:
            t = r[f"{v}_ms_best"]
            extra_us = (t - plain) * 1e3 / r["modules"]
            print(
                f"{v:9s} {t:8.3f} ms/step  {t / plain:5.2f}x  "
                f"{extra_us:+7.2f} us per module per step"
            )
        results["cpu"] = r
    else:
        results["gpu"] = torch.cuda.get_device_name()
        builders = {"gpt2": (_gpt2_cuda, 10), "resnet50": (_resnet50_cuda, 4)}
        for name in args.workloads.split(","):
            builder, steps = builders[name]
            model, step, what = builder()
            r = _measure(
                model, step, "cuda", int(os.environ.get("CUDATIMER_BENCH_N", steps)), args.rounds
            )
            r["what"] = what
            _print(name, what, r)
            results[name] = r
            del model, step
            gc.collect()
            torch.cuda.empty_cache()
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
