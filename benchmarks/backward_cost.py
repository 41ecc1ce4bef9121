"""What a backward row costs against a forward row, in host time, measured in one run; the
training step with each; and whether backward rows grow over a long run.

Three variants of one training step run interleaved (order rotated by one each round, >= 9
rounds): ``plain`` (nothing), ``forward`` (``instrument(model)``) and ``backward``
(``instrument(model, backward=True)``: forward and backward rows). Each step's host time is
taken in two parts: the forward (the model and its loss) and ``loss.backward()``. Per round:

- a forward row: (forward with forward rows - plain forward) / forward rows a step;
- a backward row, in ``loss.backward()``: (its time with backward rows - with forward rows
  only) / backward rows a step; its forward side (the hook set when a call runs forward):
  (forward with backward rows - with forward rows only) / backward rows a step; and the two
  together, the whole cost of a backward row, against a forward row's (the target: <= 2x).

Medians over rounds, with the spread (min-max). Rows a step are counted from the summary.

On the CPU: 64 x (Linear(32) + Tanh), batch 8, one intra-op thread, the host clock; host
time is this process's CPU time (other jobs on a shared machine moved wall time by 2x
between runs, CPU time by a few %). On a GPU (``--device cuda``): the 6-layer HF GPT-2
(batch 8 x 256, bf16 autocast, fused AdamW; ``_workloads.GPT`` of the same sizes where
transformers is missing); host time is wall time (``loss.backward()`` launches from
autograd's thread, whose CPU time this thread's clock misses), and the step time of each
variant is taken between two synchronizations (targets: <= 12 us a backward row, <= 1.05x
the plain step with backward rows). Then the coverage of the ``<Model>.backward`` root.

``--steps N``: the growth check, N steps with backward rows in one instrumented run (no
reset): the mean step of the last 100 against the 100 after warm-up (target: within 2%),
beside plain steps before and after (the machine's own drift).

    python benchmarks/backward_cost.py                                     # CPU, 15 rounds
    python benchmarks/backward_cost.py --smoke                             # CPU, seconds
    python benchmarks/backward_cost.py --device cuda --rounds 9 --steps 1000 --out bw.json

``rotated_rounds``, ``_time``, ``_bare_hooks``, ``_cpu_model`` and ``_gpt2_cuda`` are also
``floors.py``'s.
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
STEPS = int(os.environ.get("CUDATIMER_BENCH_N", "40"))
ROUNDS = 15
VARIANTS = ("plain", "forward", "backward")
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


def _gpt2_cuda(seq: int = 512) -> tuple[nn.Module, Step, str]:
    """The GPU step: 6-layer GPT-2 (768 wide, 12 heads), batch 8 x ``seq``, bf16, AdamW."""
    torch.manual_seed(0)
    batch, vocab = 8, 50257
    try:
        from transformers import GPT2Config, GPT2LMHeadModel

        model: nn.Module = GPT2LMHeadModel(GPT2Config(n_layer=6, n_positions=seq)).cuda()
        what = f"HF GPT2LMHeadModel, 6 x 768, 12 heads, batch 8 x {seq}, bf16 autocast, fused AdamW"
        hf = True
    except ImportError:
        model = GPT(GPTConfig(seq=seq, layers=6)).cuda()
        what = f"_workloads.GPT, 6 x 768, 12 heads, batch 8 x {seq}, bf16 autocast, fused AdamW"
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


def _stack_cpu(smoke: bool) -> tuple[nn.Module, Step, str]:
    """The CPU step: 64 x (Linear(32) + Tanh), batch 8 (smoke: 8 layers); no optimizer (it
    touches no module). Small layers: the step is almost all host work."""
    torch.set_num_threads(1)  # see _cpu_model
    torch.manual_seed(0)
    layers = 8 if smoke else 64
    model = nn.Sequential(*(m for _ in range(layers) for m in (nn.Linear(32, 32), nn.Tanh())))
    x = torch.randn(8, 32)

    def step(around: Callable[[], contextlib.AbstractContextManager[Any]]) -> None:
        loss = model(x).square().mean()
        with around():
            loss.backward()  # type: ignore[no-untyped-call]
        for p in model.parameters():
            p.grad = None

    return model, step, f"{layers} x (Linear(32) + Tanh), batch 8, CPU, host clock"


class _Split:
    """The clock read where ``loss.backward()`` starts and ends (the ``around`` of a step)."""

    __slots__ = ("clock", "t_enter", "t_exit")

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.t_enter = self.t_exit = 0.0

    def __call__(self) -> _Split:
        return self

    def __enter__(self) -> None:
        self.t_enter = self.clock()

    def __exit__(self, *exc: object) -> None:
        self.t_exit = self.clock()


def _sync(device: str) -> None:
    if device != "cpu":
        torch.cuda.synchronize()


def _timed_block(step: Step, device: str, steps: int) -> dict[str, float]:
    """Seconds a step: ``forward`` (model and loss) and ``backward`` (``loss.backward()``)
    host time, the median over the block's steps (another job's burst on a shared machine
    moves a few steps, not the median); ``step``: the mean step between two
    synchronizations (the CPU: CPU time)."""
    clock = time.process_time if device == "cpu" else time.perf_counter
    split = _Split(clock)
    fwd: list[float] = []
    bwd: list[float] = []
    _sync(device)
    gc.collect()
    t_start = clock()
    for _ in range(steps):
        t0 = clock()
        step(split)
        fwd.append(split.t_enter - t0)
        bwd.append(split.t_exit - split.t_enter)
    _sync(device)
    return {
        "forward": statistics.median(fwd),
        "backward": statistics.median(bwd),
        "step": (clock() - t_start) / steps,
    }


def _rows(s: Any, steps: int) -> tuple[float, float]:
    """Forward rows and backward rows a step in summary ``s`` (calls of one clock each)."""
    fwd = bwd = 0
    seen: set[str] = set()
    for r in s.regions:
        if r.name in seen:
            continue
        seen.add(r.name)
        if r.name.split("/", 1)[0].endswith(".backward"):
            bwd += r.calls
        else:
            fwd += r.calls
    return fwd / steps, bwd / steps


def _spread(values: list[float]) -> dict[str, float]:
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
    }


def measure(model: nn.Module, step: Step, device: str, steps: int, rounds: int) -> dict[str, Any]:
    """Interleaved rounds of plain, forward rows and forward + backward rows: host time per
    forward row and per backward row, each round's step ratios; then the coverage."""
    timer = cudatimer.Timer(name="backward-cost")
    for _ in range(3):
        step(contextlib.nullcontext)  # warm up: allocator, kernels, autotuning
    rows: dict[str, tuple[float, float]] = {}
    got: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}

    def block(variant: str) -> float:
        if variant == "plain":
            got["plain"].append(_timed_block(step, device, steps))
            return got["plain"][-1]["step"]
        with cudatimer.instrument(model, backward=variant == "backward", timer=timer):
            step(contextlib.nullcontext)
            timer.reset()  # the warm step's rows out of the count
            got[variant].append(_timed_block(step, device, steps))
        rows[variant] = _rows(timer.summary(), steps)  # resolves every sample
        timer.reset()
        return got[variant][-1]["step"]

    # Each round's ratios against the mean of its two plain blocks (rotated_rounds: plain
    # once more at the round's end): on the H200 machine the plain step moved between 21.9
    # and 24.5 ms from one block to the next, so ratios across rounds mislead.
    _, ratios = rotated_rounds({v: functools.partial(block, v) for v in VARIANTS}, rounds)
    # Two plain blocks a round: its own (in its rotated place) and the closing one.
    plain = got["plain"]
    plain_pairs = [
        {k: (plain[2 * i][k] + plain[2 * i + 1][k]) / 2 for k in plain[0]} for i in range(rounds)
    ]
    fw_rows = rows["forward"][0]
    bw_rows = rows["backward"][1]
    per: dict[str, list[float]] = {
        "forward_row_us": [],
        "backward_row_in_backward_us": [],
        "backward_row_in_forward_us": [],
        "backward_row_us": [],
        "backward_over_forward_row": [],
    }
    for i in range(rounds):
        p, f, b = plain_pairs[i], got["forward"][i], got["backward"][i]
        fwd_row = (f["forward"] - p["forward"]) / fw_rows * 1e6
        in_bwd = (b["backward"] - f["backward"]) / bw_rows * 1e6
        in_fwd = (b["forward"] - f["forward"]) / bw_rows * 1e6
        per["forward_row_us"].append(fwd_row)
        per["backward_row_in_backward_us"].append(in_bwd)
        per["backward_row_in_forward_us"].append(in_fwd)
        per["backward_row_us"].append(in_bwd + in_fwd)
        per["backward_over_forward_row"].append((in_bwd + in_fwd) / fwd_row)
    out: dict[str, Any] = {
        "steps": steps,
        "rounds": rounds,
        "forward_rows_per_step": fw_rows,
        "backward_rows_per_step": bw_rows,
        "step_ms": {v: _spread([g["step"] * 1e3 for g in got[v]]) for v in VARIANTS},
        "ratio": {v: _spread(r) for v, r in ratios.items()},
        "ratios": {v: [round(x, 4) for x in r] for v, r in ratios.items()},
    }
    for k, v in per.items():
        out[k] = _spread(v)
        out[f"{k}_rounds"] = [round(x, 3) for x in v]
    # Coverage, apart from the timings: the same step with a region around loss.backward().
    cov_timer = cudatimer.Timer(name="backward-coverage")
    with cudatimer.instrument(model, backward=True, timer=cov_timer) as handle:
        for _ in range(min(steps, 10)):
            step(lambda: cov_timer.region("loss.backward"))
    s = cov_timer.summary()
    root_name = handle.backward_regions[""]
    clock = "host" if device == "cpu" else "cuda:0"
    covs = [c for c in s.backward_coverage if c.clock == clock and c.region == root_name]
    if covs:
        out["coverage"] = covs[0].fraction
    return out


def growth(model: nn.Module, step: Step, device: str, steps: int) -> dict[str, Any]:
    """``steps`` steps with backward rows in one run (no reset): the mean step of the last
    ``window`` against the ``window`` after warm-up, with plain windows before and after."""
    window = min(100, max(steps // 5, 1))
    warm = min(50, window)
    timer = cudatimer.Timer(name="backward-growth")
    plain_before = _timed_block(step, device, window)["step"]
    with cudatimer.instrument(model, backward=True, timer=timer):
        for _ in range(warm):
            step(contextlib.nullcontext)
        first = _timed_block(step, device, window)["step"]
        for _ in range(max(steps - warm - 2 * window, 0)):
            step(contextlib.nullcontext)
        last = _timed_block(step, device, window)["step"]
    s = timer.summary()
    plain_after = _timed_block(step, device, window)["step"]
    return {
        "steps": steps,
        "window": window,
        "first_ms": first * 1e3,
        "last_ms": last * 1e3,
        "last_over_first": last / first,
        "plain_before_ms": plain_before * 1e3,
        "plain_after_ms": plain_after * 1e3,
        "plain_after_over_before": plain_after / plain_before,
        "rows": len(s.regions),
    }


def _fmt(d: dict[str, float], unit: str = "", digits: int = 2) -> str:
    return f"{d['median']:.{digits}f}{unit} ({d['min']:.{digits}f}-{d['max']:.{digits}f})"


def _print(what: str, r: dict[str, Any]) -> None:
    print(
        f"{what}; {r['steps']} steps x {r['rounds']} rounds; rows a step: "
        f"{r['forward_rows_per_step']:.0f} forward, {r['backward_rows_per_step']:.0f} backward"
    )
    for v in VARIANTS:
        ratio = "" if v == "plain" else f"  {_fmt(r['ratio'][v], 'x', 3)} plain"
        print(f"  step {v:9s} {_fmt(r['step_ms'][v], ' ms', 3)}{ratio}")
    print(f"  forward row                  {_fmt(r['forward_row_us'], ' us')}")
    print(f"  backward row in backward()   {_fmt(r['backward_row_in_backward_us'], ' us')}")
    print(f"  backward row, forward side   {_fmt(r['backward_row_in_forward_us'], ' us')}")
    print(f"  backward row                 {_fmt(r['backward_row_us'], ' us')}")
    print(f"  backward row / forward row   {_fmt(r['backward_over_forward_row'], 'x')}")
    if "coverage" in r:
        print(f"  coverage of the backward root {r['coverage']:.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--workloads", default="gpt2", help="GPU: gpt2, resnet50")
    parser.add_argument("--rounds", type=int, default=None, help="default 15 (smoke: 3)")
    parser.add_argument("--block", type=int, default=None, help="steps a block")
    parser.add_argument("--steps", type=int, default=0, help="growth check: steps (0: none)")
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny: the script runs")
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON")
    args = parser.parse_args()
    if args.smoke and args.device != "cpu":
        parser.error("--smoke runs on the CPU")
    rounds = args.rounds or (3 if args.smoke else ROUNDS)
    results: dict[str, Any] = {"torch": torch.__version__, "device": args.device}
    if args.device == "cpu":
        model, step, what = _stack_cpu(args.smoke)
        steps = args.block or (3 if args.smoke else STEPS)
        results["cpu"] = r = measure(model, step, "cpu", steps, rounds)
        r["what"] = what
        _print(f"cpu: {what}", r)
        runs = [("cpu", model, step, "cpu")]
    else:
        results["gpu"] = torch.cuda.get_device_name()
        runs = []
        for name in args.workloads.split(","):
            if name == "gpt2":
                model, step, what = _gpt2_cuda(seq=256)
                default = 8
            elif name == "resnet50":
                model, step, what = _resnet50_cuda()
                default = 4
            else:
                parser.error(f"--workloads: unknown {name!r} (gpt2, resnet50)")
            r = measure(model, step, "cuda", args.block or default, rounds)
            r["what"] = what
            _print(f"{name}: {what}", r)
            results[name] = r
            runs.append((name, model, step, "cuda"))
    if args.steps:
        name, model, step, device = runs[0]
        g = growth(model, step, device, args.steps)
        results[f"{name}_growth"] = g
        print(
            f"growth ({name}, backward rows, {g['steps']} steps): last {g['window']} steps "
            f"{g['last_ms']:.3f} ms against {g['first_ms']:.3f} ms after warm-up: "
            f"{g['last_over_first']:.3f}x (plain after / before: "
            f"{g['plain_after_over_before']:.3f}x)"
        )
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
