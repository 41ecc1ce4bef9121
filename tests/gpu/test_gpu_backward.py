"""Backward rows on a CUDA device (issue #21): a training step with
instrument(model, backward=True) adds no host-device synchronisation, its rows are timed on the
GPU with a coverage figure, and the gradients are bitwise those of the plain step."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import cudatimer
from cudatimer import Timer
from tests.gpu.test_gpu_core import SYNC_CALLS, count_runtime_calls

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
