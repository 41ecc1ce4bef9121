"""Publishing a run for ``cudatimer watch`` on a real GPU: finished steps reach the file with
GPU times while the publishing thread never synchronizes, and a publisher polling fast never
spoils a CUDA graph captured meanwhile (torch's default "global" capture mode refuses other
threads' event queries)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

import cudatimer
from cudatimer.render._livefile import read_live
from tests.hard_cases.test_gpu_core import SYNC_CALLS, count_runtime_calls

pytestmark = pytest.mark.gpu


def _work(x: torch.Tensor, w: torch.Tensor, n: int) -> torch.Tensor:
    for _ in range(n):
        x = torch.tanh(x @ w)
    return x


def test_gpu_steps_are_published_with_gpu_times_and_no_sync(tmp_path: Path) -> None:
    """Every finished step reaches the file on the GPU clock; publishing adds no sync."""
    timer = cudatimer.Timer(name="live-gpu")
    x = torch.randn(2048, 2048, device="cuda")
    w = torch.randn(2048, 2048, device="cuda") / 45
    path = tmp_path / "live.json"

    def steps() -> None:
        for _ in range(40):
            with timer.region("train_step"):
                with timer.region("forward"):
                    y = _work(x, w, 8)
                with timer.region("backward"):
                    _work(y, w, 16)
            timer.step()
            time.sleep(0.01)  # the publisher (every 0.05 s) runs during the loop

    steps()  # warm-up: cuBLAS, pools
    torch.cuda.synchronize()
    base = count_runtime_calls(steps)  # the same loop, nothing published
    torch.cuda.synchronize()
    pub = cudatimer.live(path, timer=timer, every_s=0.05)
    try:
        counts = count_runtime_calls(steps)
    finally:
        torch.cuda.synchronize()
        pub.close()
    for name in SYNC_CALLS:
        assert counts.get(name, 0) == base.get(name, 0), (name, counts, base)
    assert counts.get("cudaEventQuery", 0) > base.get("cudaEventQuery", 0)  # it did poll
    data = read_live(path)
    assert data.finished == 120 and data.state == "finished"
    assert ("train_step/backward", "cuda:0") in data.regions
    idx = data.regions.index(("train_step/backward", "cuda:0"))
    gpu_ms = [row[2] for s in data.steps for row in s.rows if row[0] == idx]
    fwd = data.regions.index(("train_step/forward", "cuda:0"))
    fwd_ms = [row[2] for s in data.steps for row in s.rows if row[0] == fwd]
    assert all(g is not None and g > 0 for g in gpu_ms + fwd_ms)
    assert sum(gpu_ms) > 1.5 * sum(fwd_ms)  # 16 matmuls against 8


def test_a_fast_publisher_never_spoils_a_graph_capture(tmp_path: Path) -> None:
    """Graphs captured (global mode) while a publisher polls every 10 ms all capture and
    replay; the publisher goes on publishing between captures."""
    timer = cudatimer.Timer(name="live-graphs")
    x = torch.randn(1024, 1024, device="cuda")
    w = torch.randn(1024, 1024, device="cuda") / 32
    path = tmp_path / "graphs.json"
    pub = cudatimer.live(path, timer=timer, every_s=0.01)
    try:
        for i in range(30):
            with timer.region("train_step"):
                _work(x, w, 4)
            timer.step()
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                _work(x, w, 2)
            torch.cuda.current_stream().wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):  # capture_error_mode="global", torch's default
                out = _work(x, w, 20 + i % 3)
            g.replay()
            assert torch.isfinite(out).all()
        torch.cuda.synchronize()
    finally:
        pub.close()
    data = read_live(path)
    assert data.finished == 30 and data.regions == (("train_step", "cuda:0"),)
