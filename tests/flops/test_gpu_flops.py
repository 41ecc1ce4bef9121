"""FLOPs per region on a CUDA device: a bf16 8192^3 matmul's MFU, its TFLOP/s against the
FLOPs over an event-pair time taken here, the peak table's device, and no synchronisation
added by flops=True."""

from __future__ import annotations

import pytest
import torch

from cudatimer import Timer
from tests.hard_cases.test_gpu_core import count_runtime_calls

pytestmark = pytest.mark.gpu

N = 8192
FLOP = 2 * N**3
SYNC_CALLS = ("cudaEventSynchronize", "cudaStreamSynchronize", "cudaDeviceSynchronize")


def _operands() -> tuple[torch.Tensor, torch.Tensor]:
    a = torch.randn(N, N, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(N, N, device="cuda", dtype=torch.bfloat16)
    return a, b


def test_matmul_mfu_and_rate_match_an_event_pair() -> None:
    """A bf16 8192^3 matmul region: exact FLOPs, MFU >= 0.6 of the device's bf16 peak, and
    TFLOP/s within 1% of 2*N^3 over the mean event-pair time of the same calls."""
    t = Timer(name="mfu")

    def matmul(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x @ y

    mm = t.timed(matmul, name="mm", flops=True)
    a, b = _operands()
    for _ in range(5):  # the first call counts (untimed); the others warm cuBLAS up
        mm(a, b)
    torch.cuda.synchronize()
    t.reset()
    pairs: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
    for _ in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        mm(a, b)
        end.record()
        pairs.append((start, end))
    torch.cuda.synchronize()
    event_ms = sum(s.elapsed_time(e) for s, e in pairs) / len(pairs)
    row = t.summary()["mm"]
    assert row.flop_mean == FLOP and row.values["flop"].count == 20
    assert row.cpu.count == 20 and row.tflop_per_s is not None
    expect = FLOP / event_ms * 1e-9
    assert row.tflop_per_s == pytest.approx(expect, rel=0.01), (row.tflop_per_s, expect)
    if row.mfu is None:
        pytest.skip(f"{torch.cuda.get_device_name()} is not in the peak table")
    assert row.mfu >= 0.6, (row.mfu, row.tflop_per_s, dict(t.summary().meta).get("flop_peaks"))


def test_peak_table_names_this_device() -> None:
    """The summary's meta names the device and the peaks MFU used."""
    t = Timer(name="mfu-meta")
    with t.region("mm", flops=True):
        torch.mm(*_operands())
    meta = dict(t.summary().meta)
    name = torch.cuda.get_device_name()
    assert name in meta.get("flop_peaks", "") or name in meta.get("flop_note", "")


def test_flops_adds_no_synchronisation() -> None:
    """The same loop with flops=True regions makes no more synchronising runtime calls."""
    a = torch.randn(512, 512, device="cuda")
    t = Timer(name="mfu-sync")
    mm = t.timed(lambda x: x @ x, name="layer", flops=True)
    mm(a)  # counted once, before the profiled loops

    def plain() -> None:
        for _ in range(100):
            a @ a

    def measured() -> None:
        for _ in range(100):
            mm(a)

    base = count_runtime_calls(plain)
    counted = count_runtime_calls(measured)
    for name in SYNC_CALLS:
        assert counted.get(name, 0) == base.get(name, 0), (name, counted, base)
    assert t.summary()["layer"].values["flop"].count == 101
