"""Cross-rank reports on two GPUs over NCCL: runs benchmarks/dist_check.py under torchrun."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.multigpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 GPUs"
    ),
]


def test_dist_check_passes_on_two_gpus() -> None:
    """Counts, absent regions, slowest rank, merged percentiles, DDP, late rank, files: PASS."""
    env = dict(os.environ)
    for key, value in (
        ("NCCL_NVLS_ENABLE", "0"),
        ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
        ("NVSHMEM_DISABLE_NVLS", "1"),
    ):
        env.setdefault(key, value)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            str(ROOT / "benchmarks" / "dist_check.py"),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "dist_check: 2 ranks, nccl" in out
    assert "dist_check: PASS" in out and "FAIL" not in done.stdout
