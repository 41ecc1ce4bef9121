"""Backward rows on a CUDA device: a training step with
instrument(model, backward=True) adds no host-device synchronisation, its rows are timed on the
GPU with a coverage figure, and the gradients are bitwise those of the plain step."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import cudatimer
from cudatimer import Timer
from tests.hard_cases.test_gpu_core import SYNC_CALLS, count_runtime_calls

pytestmark = pytest.mark.gpu


def _model() -> nn.Module:
    torch.manual_seed(0)
    blocks = [
        nn.Sequential(nn.LayerNorm(256), nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256))
        for _ in range(4)
    ]
    return nn.Sequential(*blocks, nn.Linear(256, 16)).cuda()


def test_training_step_with_backward_rows_never_synchronizes() -> None:
    """Forward, backward and optimizer step with backward rows: the same synchronising CUDA
    calls as the plain step (none added), every backward row timed on cuda:0 once per step,
    a coverage figure for the root, and bitwise the plain step's gradients."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: the weights stay comparable
    x = torch.randn(64, 256, device="cuda")
    steps = 10

    def train() -> None:
        for _ in range(steps):
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=False)

    def grads() -> list[torch.Tensor]:
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        return [p.grad.clone() for p in model.parameters() if p.grad is not None]

    train()  # warm-up: cuBLAS handles, the allocator
    torch.cuda.synchronize()
    expected = grads()
    base = count_runtime_calls(train)
    t = Timer(name="gpu-backward")
    with cudatimer.instrument(model, backward=True, timer=t) as handle:
        train()  # warm-up of the event pool
        torch.cuda.synchronize()
        with_rows = count_runtime_calls(train)
        got = grads()
    for name in SYNC_CALLS:
        assert with_rows.get(name, 0) == base.get(name, 0), (name, with_rows, base)
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
    s = t.summary()
    for path in handle.backward_regions.values():  # every module here makes a node
        row = s.get(path, clock="cuda:0")
        assert row is not None and row.calls == 2 * steps + 1, path
    (cov,) = s.backward_coverage
    assert cov.region == "Sequential.backward" and cov.clock == "cuda:0"
    assert 0.5 < cov.fraction <= 1.0 + 1e-6, cov


def test_compute_bound_backward_rows_match_cupti_kernel_spans() -> None:
    """Two modules of 8 bf16 4096^2 matmuls each: each backward row's GPU time is within 2%
    of the CUPTI span of the kernels its backward launched, and the two rows lie inside the
    root."""
    import os
    import tempfile

    from torch.profiler import ProfilerActivity, profile

    from tests.hard_cases.test_gpu_core import kernel_spans, sleep_ms

    torch.manual_seed(0)
    n, width = 8, 4096

    def stack() -> nn.Module:
        return nn.Sequential(*(nn.Linear(width, width, bias=False) for _ in range(n)))

    model = nn.Sequential(stack(), stack()).to(device="cuda", dtype=torch.bfloat16)
    for p in model.parameters():
        nn.init.eye_(p)  # identity layers: values stay bounded through 16 matmuls
    x = torch.randn(width, width, device="cuda", dtype=torch.bfloat16)
    grad = torch.randn(width, width, device="cuda", dtype=torch.bfloat16)
    t = Timer(name="gpu-backward-accuracy")

    def run() -> None:
        model(x).backward(grad)  # a given gradient: no reduction kernel before the rows
        for p in model.parameters():
            p.grad = None  # the next backward steals its gradient: no accumulation kernel

    with cudatimer.instrument(model, backward=True, depth=1, timer=t):
        for _ in range(3):
            run()  # cuBLAS handles and heuristics, the event pool
        sleep_ms(1)  # calibrates the sleep kernel outside the profile
        torch.cuda.synchronize()
        t.reset()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            out = model(x)
            sleep_ms(5)  # a busy GPU when the first row's start event is recorded
            out.backward(grad)
            torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        spans = [
            s
            for s in kernel_spans(path)
            if "sleep" not in s[2].lower() and "spin" not in s[2].lower()
        ]
    # Forward: n + n matmuls. Backward of module 1: grad input and grad weight per layer (2n);
    # of module 0: its first layer's input needs no gradient (2n - 1).
    assert len(spans) == 2 * n + 2 * n + 2 * n - 1, [s[2] for s in spans]
    backward = spans[2 * n :]
    s = t.summary()
    for name, mine in (
        ("Sequential.backward/1", backward[: 2 * n]),
        ("Sequential.backward/0", backward[2 * n :]),
    ):
        cupti_ms = (mine[-1][1] - mine[0][0]) / 1000.0
        assert cupti_ms > 1.0, (name, cupti_ms)
        row = s.get(name, clock="cuda:0")
        assert row is not None and row.calls == 1, name
        assert row.gpu_total_ms == pytest.approx(cupti_ms, rel=0.02), (name, row, cupti_ms)
    root = s.get("Sequential.backward", clock="cuda:0")
    assert root is not None and root.gpu_total_ms is not None
    rows = 0.0
    for i in (0, 1):
        row = s.get(f"Sequential.backward/{i}", clock="cuda:0")
        assert row is not None and row.gpu_total_ms is not None
        rows += row.gpu_total_ms
    assert rows <= root.gpu_total_ms + 0.001, (rows, root)


def test_compiled_training_step_backward_rows_never_synchronize() -> None:
    """A compiled (inductor) MLP training step with instrument(backward=True): eager mode's
    backward rows and counts, timed on cuda:0, no synchronising CUDA call added against the
    plain compiled step, and bitwise the plain compiled step's gradients."""
    torch._dynamo.reset()
    steps = 10
    x = torch.randn(64, 256, device="cuda")
    plain, timed, eager = _model(), _model(), _model()
    eager_t, t = Timer(name="eager-rows"), Timer(name="compiled-rows")
    with cudatimer.instrument(eager, timer=eager_t, backward=True):
        for _ in range(steps):
            eager(x).square().mean().backward()
    torch.cuda.synchronize()
    want_rows = [(r.name, r.calls) for r in eager_t.summary().regions if ".backward" in r.name]

    handle = cudatimer.instrument(timed, timer=t, backward=True)
    runs = {"plain": (plain, torch.compile(plain)), "timed": (timed, torch.compile(timed))}

    def loop(name: str) -> None:
        model, compiled = runs[name]
        for _ in range(steps):
            compiled(x).square().mean().backward()
            model.zero_grad(set_to_none=False)

    for name in runs:
        loop(name)  # compile and warm up
    torch.cuda.synchronize()
    t.reset()
    base = count_runtime_calls(lambda: loop("plain"))
    with_rows = count_runtime_calls(lambda: loop("timed"))
    for name in SYNC_CALLS:
        assert with_rows.get(name, 0) == base.get(name, 0), (name, with_rows, base)
    torch.cuda.synchronize()
    s = t.summary()
    got = [(r.name, r.calls) for r in s.regions if ".backward" in r.name]
    assert got == want_rows and got
    for name, _ in got:
        row = s.get(name, clock="cuda:0")
        assert row is not None and row.gpu_total_ms is not None, name

    grads = []
    for name in runs:
        model, compiled = runs[name]
        model.zero_grad(set_to_none=True)
        compiled(x).square().mean().backward()
        grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
    handle.remove()
    for a, b in zip(*grads, strict=True):
        assert torch.equal(a, b)


def test_sampled_backward_rows_never_synchronize() -> None:
    """every=2 with backward=True on a CUDA step: no synchronising CUDA call added against
    the plain step, the row counts every call and times every other one on cuda:0, and the
    gradients are bitwise the plain step's."""
    model = _model()
    x = torch.randn(64, 256, device="cuda")
    steps = 10
    t = Timer(name="gpu-backward-sampled")
    timed = t.timed("mlp", backward=True, every=2)(model.forward)

    def train(forward: object) -> None:
        for _ in range(steps):
            forward(x).square().mean().backward()  # type: ignore[operator]
            model.zero_grad(set_to_none=False)

    def grads(forward: object) -> list[torch.Tensor]:
        model.zero_grad(set_to_none=True)
        forward(x).square().mean().backward()  # type: ignore[operator]
        return [p.grad.clone() for p in model.parameters() if p.grad is not None]

    train(model.forward)  # warm-up: cuBLAS handles, the allocator
    train(timed)  # warm-up of the event pool
    torch.cuda.synchronize()
    expected = grads(model.forward)
    base = count_runtime_calls(lambda: train(model.forward))
    t.reset()
    with_rows = count_runtime_calls(lambda: train(timed))
    for name in SYNC_CALLS:
        assert with_rows.get(name, 0) == base.get(name, 0), (name, with_rows, base)
    row = t.summary().get("mlp.backward", clock="cuda:0")
    assert row is not None and row.calls == steps and row.gpu is not None
    assert row.gpu.count == steps // 2
    assert all(torch.equal(a, b) for a, b in zip(grads(timed), expected, strict=True))
