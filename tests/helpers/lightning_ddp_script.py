"""A Lightning fit on two CPU processes over gloo, timed by CudaTimerProfiler (run by
tests/integrations/test_lightning.py: ``python lightning_ddp_script.py OUT STRATEGY``)."""

from __future__ import annotations

import sys

import lightning.pytorch as pl
import torch

import cudatimer
from cudatimer.lightning import CudaTimerCallback, CudaTimerProfiler


class Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        with cudatimer.cuda_region("loss"):
            return self.layer(batch[0]).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main(out: str, strategy: str) -> None:
    data = torch.utils.data.TensorDataset(torch.randn(16, 4))
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=strategy,
        max_steps=3,
        profiler=CudaTimerProfiler(dirpath=out, filename="prof"),
        callbacks=[CudaTimerCallback(log=False)],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Tiny(), torch.utils.data.DataLoader(data, batch_size=2))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
