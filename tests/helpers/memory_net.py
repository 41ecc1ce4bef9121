"""A two-layer model whose layers allocate on the fake GPU's allocator, for memory tests."""

from __future__ import annotations

import torch

from tests.helpers.fake_cuda import FakeAllocator

__all__ = ["Keep", "KeepLayer", "KeepNet", "MiB"]

MiB = 1 << 20


class Keep(torch.autograd.Function):
    """Allocates ``n`` bytes on the fake allocator in forward (freed in backward, after a
    temporary of ``tmp`` bytes), like a module saving tensors for its backward."""

    mem: FakeAllocator

    @staticmethod
    def forward(ctx: object, x: torch.Tensor, n: int, tmp: int) -> torch.Tensor:
        ctx.handle = Keep.mem.alloc(n)  # type: ignore[attr-defined]
        ctx.tmp = tmp  # type: ignore[attr-defined]
        return x * 2

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        Keep.mem.temp(ctx.tmp)  # type: ignore[attr-defined]
        Keep.mem.free(ctx.handle)  # type: ignore[attr-defined]
        return grad * 2, None, None


class KeepLayer(torch.nn.Module):
    def __init__(self, n: int, tmp: int) -> None:
        super().__init__()
        self.n, self.tmp = n, tmp
        self.w = torch.nn.Parameter(torch.ones(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = Keep.apply(x * self.w, self.n, self.tmp)  # type: ignore[no-untyped-call]
        return out


class KeepNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = KeepLayer(10 * MiB, 3 * MiB)
        self.b = KeepLayer(20 * MiB, 5 * MiB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.b(self.a(x))
        return out
