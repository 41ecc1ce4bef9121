"""Quickstart: decorate a model's forward, wrap the training step, print where time went.

Runs anywhere torch runs: on a GPU regions are timed with CUDA events on the current stream;
without one, on the host clock (the report's clock column says which).

    python examples/quickstart.py
"""

import torch

import cudatimer

device = "cuda" if torch.cuda.is_available() else "cpu"


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)
        )

    @cudatimer.cuda_timed  # region "MLP.forward"
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


model = MLP().to(device)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(256, 1024, device=device)

for _ in range(20):
    with cudatimer.cuda_region("train_step"):
        with cudatimer.cuda_region("forward"):
            loss = model(x).square().mean()
        with cudatimer.cuda_region("backward"):
            loss.backward()
        with cudatimer.cuda_region("optimizer"):
            opt.step()
            opt.zero_grad(set_to_none=True)

cudatimer.report()  # waits once for the GPU, resolves every event, prints the table
