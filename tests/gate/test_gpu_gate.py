"""The performance gate on GPU regions: the summary names the GPU, and per-step GPU times
gate a slowdown of extra matmuls, through the API and the command line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import cudatimer
from cudatimer import Timer
from cudatimer._cli import EXIT_SLOWER, main

pytestmark = pytest.mark.gpu


def _run(path: Path, matmuls: dict[str, int]) -> cudatimer.Summary:
    a = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(a)
    timer = Timer(name="gate-gpu")
    for _ in range(33):
        for name, n in matmuls.items():
            with timer.region(name):
                for _ in range(n):
                    torch.mm(a, a, out=out)
        timer.step()
    torch.cuda.synchronize()
    return timer.save(path, warmup=3)


def test_gpu_regions_gate_extra_matmuls(tmp_path: Path) -> None:
    """A region given 50% more matmuls is slower on GPU time; its neighbour is not."""
    base = _run(tmp_path / "base.json", {"attn": 20, "mlp": 20})
    new = _run(tmp_path / "new.json", {"attn": 30, "mlp": 20})
    assert dict(base.meta)["device"] == torch.cuda.get_device_name()
    result = cudatimer.compare(base, new, max_slowdown=0.05)
    assert [v.name for v in result.regressions] == ["attn"]
    attn = next(v for v in result.items if v.name == "attn")
    assert attn.clock.startswith("cuda:") and attn.samples == "steps" and attn.base_n == 30
    assert attn.interval is not None and attn.interval[0] > 1.3 and attn.interval[1] < 1.7
    argv = ["compare", str(tmp_path / "base.json"), str(tmp_path / "new.json")]
    assert main([*argv, "--max-slowdown", "0.05"]) == EXIT_SLOWER


def test_gpu_regions_gate_against_the_speed_factor(tmp_path: Path) -> None:
    """Five GPU regions, one given 50% more matmuls: it alone is slower against the run-wide
    speed factor (about 1: the other regions did not change)."""
    regions = {f"layer{i}": 10 for i in range(5)}
    base = _run(tmp_path / "base.json", regions)
    new = _run(tmp_path / "new.json", {**regions, "layer2": 15})
    result = cudatimer.compare(base, new, max_slowdown=0.05)
    assert [v.name for v in result.regressions] == ["layer2"]
    (speed,) = result.speed
    assert speed.used and speed.regions == 5 and 0.9 < speed.factor < 1.1
    assert speed.clock.startswith("cuda:")
    layer2 = next(v for v in result.items if v.name == "layer2")
    assert layer2.ratio is not None and 1.3 < layer2.ratio < 1.7
