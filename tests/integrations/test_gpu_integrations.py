"""The Lightning and Hugging Face integrations on a CUDA device: actions and step phases are
GPU-clock rows, finished steps reach the sinks with GPU times, and no synchronizing CUDA
runtime call is added to the training run (counted as tests/hard_cases/test_gpu_core.py counts
them, against the same run without cudatimer)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import cudatimer
from tests.hard_cases.test_gpu_core import SYNC_CALLS, count_runtime_calls
from tests.helpers.extras import needs

pytestmark = pytest.mark.gpu

STEPS = 6


def _quiet(body: Callable[[], None]) -> Callable[[], None]:
    def run() -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            warnings.simplefilter("ignore", FutureWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            body()

    return run


def _syncs(counts: dict[str, int]) -> dict[str, int]:
    return {name: counts.get(name, 0) for name in SYNC_CALLS}


def test_lightning_fit_on_gpu_has_gpu_rows_and_adds_no_sync() -> None:
    """A Lightning fit on cuda:0: actions on the GPU clock, steps fed, no sync added."""
    pl = needs("lightning.pytorch")
    from cudatimer.lightning import CudaTimerCallback, CudaTimerProfiler
    from tests.helpers.lightning_ddp_script import Tiny

    data = torch.utils.data.TensorDataset(torch.randn(2 * STEPS, 4))
    fed: list[Any] = []

    def fit(timed: bool) -> None:
        extra: dict[str, Any] = {}
        if timed:
            extra = dict(
                profiler=CudaTimerProfiler(), callbacks=[CudaTimerCallback(fed.append, log=False)]
            )
        trainer = pl.Trainer(
            accelerator="gpu",
            devices=1,
            max_steps=STEPS,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            **extra,
        )
        trainer.fit(Tiny(), torch.utils.data.DataLoader(data, batch_size=2))

    _quiet(lambda: fit(False))()  # warm-up: CUDA context, cuBLAS, kernels
    torch.cuda.synchronize()
    base = count_runtime_calls(_quiet(lambda: fit(False)))
    cudatimer.reset()
    timed = count_runtime_calls(_quiet(lambda: fit(True)))
    assert _syncs(timed) == _syncs(base), (timed, base)
    s = cudatimer.summary()
    step = "run_training_epoch/run_training_batch/[LightningModule]Tiny.optimizer_step"
    row = s[f"{step}/[Strategy]SingleDeviceStrategy.backward"]
    assert row.clock == "cuda:0" and row.calls == STEPS and row.gpu_total_ms is not None
    assert s.steps == STEPS
    assert [t.step for t in fed] == list(range(STEPS))
    clocks = {r[1] for t in fed for r in t.rows}
    assert clocks == {"cuda:0"} and all(r[3] is not None and r[3] >= 0 for t in fed for r in t.rows)


def test_hf_trainer_on_gpu_has_gpu_rows_and_adds_no_sync(tmp_path: Path) -> None:
    """A transformers Trainer run on cuda:0: step phases on the GPU clock, no sync added."""
    transformers = needs("transformers")
    import cudatimer.hf

    ids = torch.randint(0, 64, (2 * STEPS, 8), generator=torch.Generator().manual_seed(0))
    data = [{"input_ids": row, "labels": row} for row in ids]
    fed: list[Any] = []

    def train(timed: bool) -> None:
        config = transformers.GPT2Config(
            vocab_size=64, n_positions=8, n_embd=16, n_layer=1, n_head=2
        )
        args = transformers.TrainingArguments(
            output_dir=str(tmp_path / "out"),
            max_steps=STEPS,
            per_device_train_batch_size=2,
            logging_steps=2,
            save_strategy="no",
            report_to=[],
            disable_tqdm=True,
        )
        trainer = transformers.Trainer(
            model=transformers.GPT2LMHeadModel(config), args=args, train_dataset=data
        )
        if timed:
            cudatimer.hf.attach(trainer, fed.append)
        trainer.train()

    _quiet(lambda: train(False))()
    torch.cuda.synchronize()
    base = count_runtime_calls(_quiet(lambda: train(False)))
    cudatimer.reset()
    timed = count_runtime_calls(_quiet(lambda: train(True)))
    assert _syncs(timed) == _syncs(base), (timed, base)
    s = cudatimer.summary()
    for name in ("train_step", "train_step/forward_backward", "train_step/optimizer_step"):
        assert s[name].clock == "cuda:0" and s[name].calls == STEPS, name
    assert s.steps == STEPS
    assert [t.step for t in fed] == list(range(STEPS))
    assert all(r[3] is not None for t in fed for r in t.rows)
