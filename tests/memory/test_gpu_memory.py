"""Memory per region on a CUDA device: the truth checks (bytes kept, a temporary's peak, the
top region's peak against the allocator's own high-water mark, the storages a module keeps
for its backward), backward rows and activation checkpointing, an out-of-memory error's
note, no synchronisation added, the program's own allocator statistics untouched, and
memory_every's episodes (the history turned off between long measured ones, or left on after
short ones) reading the same bytes."""

from __future__ import annotations

import io
import sys

import pytest
import torch
from torch.utils.checkpoint import checkpoint

import cudatimer
from cudatimer import Timer
from cudatimer.records._values import Tally
from cudatimer.sources import _memory
from tests.hard_cases.test_gpu_core import count_runtime_calls

pytestmark = pytest.mark.gpu

MiB = 1 << 20
SYNC_CALLS = ("cudaEventSynchronize", "cudaStreamSynchronize", "cudaDeviceSynchronize")


def _requested() -> int:
    """The bytes tensors asked the allocator for, now (what the memory columns count)."""
    return int(torch.cuda.memory_stats()["requested_bytes.all.current"])


def _values(t: Timer, name: str) -> tuple[float, float]:
    row = t.summary()[name]
    return row.values["mem_delta"].max, row.values["mem_peak"].max


@pytest.fixture(autouse=True)
def _cuda() -> None:
    torch.cuda.init()
    torch.empty(1, device="cuda")  # the allocator is up before the first region


def test_a_region_keeping_256_mib_reads_256_mib() -> None:
    """A region that allocates and keeps a 256 MiB tensor: delta 256 MiB exactly, as
    memory_allocated() moves."""
    t = Timer(name="keep")
    before = torch.cuda.memory_allocated()
    with t.region("keep", memory=True):
        kept = torch.empty(256 * MiB, dtype=torch.uint8, device="cuda")
    moved = torch.cuda.memory_allocated() - before
    delta, peak = _values(t, "keep")
    assert delta == 256 * MiB == moved
    assert peak == 256 * MiB
    del kept


def test_a_1_gib_temporary_reads_delta_0_peak_1_gib() -> None:
    """A region that allocates a 1 GiB temporary and frees it: delta 0, peak 1 GiB."""
    t = Timer(name="temp")
    with t.region("temp", memory=True):
        tmp = torch.empty(1024 * MiB, dtype=torch.uint8, device="cuda")
        del tmp
    assert _values(t, "temp") == (0.0, 1024.0 * MiB)


def test_the_top_region_s_peak_is_the_allocator_s_high_water_mark() -> None:
    """After a reset_peak_memory_stats() the test makes: the top region's enter level plus its
    peak equals max_memory_allocated() (sizes that the allocator does not round), and the
    requested bytes' peak exactly; siblings and a child counted as their own."""
    t = Timer(name="hwm")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    enter_allocated = torch.cuda.memory_allocated()
    enter_requested = _requested()
    with t.region("top", memory=True):
        a = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
        with t.region("child", memory=True):
            b = torch.empty(128 * MiB, dtype=torch.uint8, device="cuda")
            del b
        with t.region("sibling", memory=True):
            c = torch.empty(32 * MiB, dtype=torch.uint8, device="cuda")
            del c
        del a
    _, peak = _values(t, "top")
    assert enter_allocated + peak == torch.cuda.max_memory_allocated()
    assert enter_requested + peak == torch.cuda.memory_stats()["requested_bytes.all.peak"]
    assert peak == 192 * MiB
    assert _values(t, "top/child") == (0.0, 128.0 * MiB)
    assert _values(t, "top/sibling") == (0.0, 32.0 * MiB)


class _Saves(torch.nn.Module):
    """y = relu(x @ w1) @ w2: keeps relu's output (saved by relu and the second matmul) and
    returns y; x @ w1 is a temporary."""

    def __init__(self) -> None:
        super().__init__()
        self.w1 = torch.nn.Parameter(torch.randn(1024, 4096))
        self.w2 = torch.nn.Parameter(torch.randn(4096, 1024))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = torch.relu(x @ self.w1) @ self.w2
        return out


def test_a_module_s_forward_delta_is_the_storages_it_keeps() -> None:
    """instrument(memory=True): the module's forward delta equals the bytes of the unique
    storages it allocated and kept (saved for backward, and its output)."""
    model = _Saves().cuda()
    x = torch.randn(512, 1024, device="cuda", requires_grad=True)
    model(x).sum().backward()  # warm-up: cuBLAS workspaces allocated outside the region
    before = {p.untyped_storage().data_ptr() for p in (x, *model.parameters())}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        if s.data_ptr() not in before:
            saved[s.data_ptr()] = s.nbytes()
        return t

    t = Timer(name="saves")
    hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
    with cudatimer.instrument(model, memory=True, timer=t), hooks:
        y = model(x)
    kept = dict(saved)
    kept[y.untyped_storage().data_ptr()] = y.untyped_storage().nbytes()
    delta, peak = _values(t, "_Saves")
    assert delta == sum(kept.values()) == (512 * 4096 + 512 * 1024) * 4
    assert peak == 2 * 512 * 4096 * 4  # x @ w1 and relu's output, held together
    y.sum().backward()


def test_backward_rows_free_what_forward_kept() -> None:
    """With backward=True the backward rows free the saved activations: the forward row keeps
    them, the model's backward row and the rows of the layers whose input gradient arrives
    from a later layer free more than they allocate."""
    model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(4)]).cuda()
    x = torch.randn(4096, 1024, device="cuda")
    for _ in range(2):  # warm-up: grads allocated, workspaces set
        model(x).sum().backward()
    t = Timer(name="bw")
    with cudatimer.instrument(model, backward=True, memory=True, timer=t):
        model(x).sum().backward()
    s = t.summary()
    fwd = s["Sequential"].values["mem_delta"].max
    bwd = s["Sequential.backward"].values["mem_delta"].max
    assert fwd >= 4 * 4096 * 1024 * 4  # three saved inputs and the output, 16 MiB each
    assert bwd <= -3 * 4096 * 1024 * 4  # the saved inputs go
    # Layer 3 gets the gradient of sum() (a view, nothing to free): it allocates its input's
    # gradient as it frees its saved input; the others also free the gradient they receive.
    for i in range(3):
        assert s[f"Sequential.backward/{i}"].values["mem_delta"].max < 0


def test_activation_checkpointing_keeps_less() -> None:
    """A checkpointed block keeps only its output in forward (its activations are recomputed
    in backward), so its forward delta is that output's bytes, less than the plain block's."""
    block = torch.nn.Sequential(
        torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)
    ).cuda()
    x = torch.randn(2048, 1024, device="cuda", requires_grad=True)
    block(x).sum().backward()

    class Wrapped(torch.nn.Module):
        def __init__(self, ckpt: bool) -> None:
            super().__init__()
            self.block, self.ckpt = block, ckpt

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if self.ckpt:
                out: torch.Tensor = checkpoint(self.block, x, use_reentrant=False)
                return out
            return self.block(x)  # type: ignore[no-any-return]

    deltas = {}
    for ckpt in (False, True):
        t = Timer(name=f"ckpt-{ckpt}")
        model = Wrapped(ckpt)
        with cudatimer.instrument(model, backward=True, memory=True, timer=t, depth=0):
            y = model(x)
            y.sum().backward()
        deltas[ckpt] = t.summary()["Wrapped"].values["mem_delta"].max
        assert t.summary()["Wrapped.backward"].values["mem_peak"].max > 0
        del y
    out_bytes = 2048 * 1024 * 4
    assert out_bytes <= deltas[True] < out_bytes + MiB  # the output (and no activation)
    assert deltas[False] >= out_bytes + 2 * 2048 * 4096 * 4  # plain: both 4096-wide activations


@pytest.mark.skipif(sys.version_info < (3, 11), reason="exception notes need Python 3.11")
def test_out_of_memory_names_the_open_regions() -> None:
    """An allocation too large for the device inside regions: the error's note names them,
    with what they held, and the next report does too."""
    t = Timer(name="oom")
    _, total = torch.cuda.mem_get_info()
    with pytest.raises(torch.OutOfMemoryError) as info, t.region("outer", memory=True):
        held = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
        with t.region("inner", memory=True):
            torch.empty(total * 2, dtype=torch.uint8, device="cuda")
        del held
    note = next(n for n in info.value.__notes__ if n.startswith("cudatimer:"))
    assert "outer (cuda:0) +64.0 MiB now" in note and "outer/inner (cuda:0) +0 B now" in note
    assert "out-of-memory" in t.report(file=io.StringIO())


@pytest.mark.parametrize("pause_after_s", [0.0, 1e9])
def test_memory_regions_add_no_synchronisation(
    monkeypatch: pytest.MonkeyPatch, pause_after_s: float
) -> None:
    """The same loop with memory=True regions (and a read of the history in the middle) makes
    as many synchronising runtime calls as without cudatimer: every call measured, and one
    step in memory_every with the history turned off after each measured step (0.0) or left
    on (1e9)."""
    monkeypatch.setattr(_memory, "PAUSE_AFTER_S", pause_after_s)
    t = Timer(name="nosync")
    x = torch.randn(256, 256, device="cuda")
    layers = [torch.nn.Linear(256, 256).cuda() for _ in range(8)]
    regions = [t.region(f"layer{i}", memory=True, memory_every=1) for i in range(8)]
    step = t.region("step", memory=True)

    def plain() -> None:
        for _ in range(100):
            y = x
            for layer in layers:
                y = torch.nn.functional.gelu(layer(y))

    def measured() -> None:
        for _ in range(50):
            y = x
            for layer, region in zip(layers, regions, strict=True):
                with region:
                    y = torch.nn.functional.gelu(layer(y))
        for _ in range(50):  # sampled steps around the same regions
            with step:
                y = x
                for layer, region in zip(layers, regions, strict=True):
                    with region:
                        y = torch.nn.functional.gelu(layer(y))
        t.recorder.memory.drain(0.0)  # the history read, inside the counted block

    plain(), measured()
    torch.cuda.synchronize()
    base = count_runtime_calls(plain)
    with_memory = count_runtime_calls(measured)
    for name in SYNC_CALLS:
        assert with_memory.get(name, 0) == base.get(name, 0), (name, with_memory, base)
    s = t.summary()
    assert s["layer0"].values["mem_delta"].count == 100
    assert s["step"].values["mem_delta"].count == 100 // _memory.MEMORY_EVERY
    assert s["step/layer0"].values["mem_delta"].count == 100 // _memory.MEMORY_EVERY


def test_the_program_s_peak_is_untouched() -> None:
    """cudatimer never resets the high-water mark: a peak set before memory regions stays;
    the same work with and without them reaches the same max_memory_allocated()."""

    def work() -> None:
        a = torch.empty(96 * MiB, dtype=torch.uint8, device="cuda")
        b = torch.empty(32 * MiB, dtype=torch.uint8, device="cuda")
        del a, b

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    work()
    alone = torch.cuda.max_memory_allocated()
    big = torch.empty(512 * MiB, dtype=torch.uint8, device="cuda")
    del big
    high = torch.cuda.max_memory_allocated()
    t = Timer(name="peak")
    torch.cuda.reset_peak_memory_stats()
    with t.region("work", memory=True):
        work()
    t.summary()
    assert torch.cuda.max_memory_allocated() == alone  # the same work, the same peak
    torch.cuda.reset_peak_memory_stats()
    big = torch.empty(512 * MiB, dtype=torch.uint8, device="cuda")
    del big
    with t.region("work", memory=True):
        work()
    t.summary()
    assert torch.cuda.max_memory_allocated() == high  # not reset by the regions or the read


@pytest.mark.parametrize("long_steps", [True, False])
def test_sampled_episodes_read_the_same_bytes(
    monkeypatch: pytest.MonkeyPatch, long_steps: bool
) -> None:
    """The default memory_every: steps 0 and N of 2N measured, each with exactly the bytes it
    kept, though the steps between keep memory too. After a long measured step (every step
    counts as long with PAUSE_AFTER_S = 0) the history is off until the next measured one;
    after a short one it stays on."""
    monkeypatch.setattr(_memory, "PAUSE_AFTER_S", 0.0 if long_steps else 1e9)
    every = _memory.MEMORY_EVERY
    t = Timer(name=f"sampled-{long_steps}")
    kept = []
    on_between = []
    for i in range(2 * every):
        with t.region("step", memory=True):
            kept.append(torch.empty((i + 1) * MiB, dtype=torch.uint8, device="cuda"))
            with t.region("inner", memory=True):
                tmp = torch.empty(4 * MiB, dtype=torch.uint8, device="cuda")
                del tmp
            if i % every:
                on_between.append(torch._C._cuda_isHistoryEnabled())
    s = t.summary()
    assert s["step"].values["mem_delta"] == Tally.of([MiB, (every + 1) * MiB])
    assert s["step"].values["mem_peak"] == Tally.of([5 * MiB, (every + 5) * MiB])
    assert s["step/inner"].values["mem_peak"] == Tally.of([4 * MiB, 4 * MiB])
    assert s["step"].calls == 2 * every
    assert on_between == [not long_steps] * (2 * every - 2)
    del kept
