"""Backward rows inside torch.compile'd code: instrument(model, backward=True) then
torch.compile gives eager mode's backward rows (names, nesting, counts) on the "aot_eager" and
"inductor" backends, fullgraph=True or False, static and dynamic shapes, with bitwise
unchanged gradients, no graph break and no extra recompile; where Inductor's code puts the
marks; the fallback where the mechanism is missing."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import nn

import cudatimer
from cudatimer import Timer
from cudatimer.sources import _compile
from tests.compile.test_compile import train

dynamo = pytest.importorskip("torch._dynamo")


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class Res(nn.Module):
    """Linear -> in-place ReLU -> Linear, plus the input added in place (ResNet's pattern)."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(8, 16)
        self.act = nn.ReLU(inplace=True)
        self.down = nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h: torch.Tensor = self.down(self.act(self.up(x)))
        h += x
        return h


class Pair(nn.Module):
    """Returns a tuple of tensors."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.lin(x)
        return h, h.sigmoid()


class Net(nn.Module):
    """Two residual blocks (the first called twice), a tuple-returning layer and a head."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Res(), Res()])
        self.pair = Pair()
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks[1](self.blocks[0](x))
        a, b = self.pair(self.blocks[0](x))
        out: torch.Tensor = self.head(a * b)
        return out


def rows(t: Timer) -> list[tuple[str, int]]:
    return [(r.name, r.calls) for r in t.summary().regions]


def backward_rows(t: Timer) -> list[tuple[str, int]]:
    return [(n, c) for n, c in rows(t) if ".backward" in n]


def fresh(state: dict[str, Any]) -> Net:
    net = Net()
    net.load_state_dict(state)
    return net


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("fullgraph", [False, True])
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_compiled_backward_rows_match_eager_and_change_nothing(
    backend: str, fullgraph: bool, dynamic: bool
) -> None:
    """Compiled training: eager mode's rows and counts, gradients and outputs bitwise those of
    the uninstrumented compiled model, no graph break, no more graphs than without marks."""
    sizes = [4, 6, 9] if dynamic else [4, 4, 4]
    state = Net().state_dict()
    eager_t = Timer(name="eager")
    eager = fresh(state)
    with cudatimer.instrument(eager, timer=eager_t, backward=True):
        train(eager, eager, sizes)

    stats = dynamo.utils.counters["stats"]
    plain = fresh(state)
    before = stats["unique_graphs"]
    opts: dict[str, Any] = {"backend": backend, "fullgraph": fullgraph, "dynamic": dynamic}
    want = train(plain, torch.compile(plain, **opts), sizes)
    graphs_plain = stats["unique_graphs"] - before
    torch._dynamo.reset()

    timed_t = Timer(name="compiled")
    timed = fresh(state)
    before = stats["unique_graphs"]
    with cudatimer.instrument(timed, timer=timed_t, backward=True):
        got = train(timed, torch.compile(timed, **opts), sizes)
    assert stats["unique_graphs"] - before == graphs_plain
    assert dynamo.utils.counters["graph_break"] == {}

    assert rows(timed_t) == rows(eager_t)
    assert ("Net.backward/blocks.0/act", 2 * len(sizes)) in backward_rows(timed_t)
    assert ("Net.backward/pair/lin", len(sizes)) in backward_rows(timed_t)
    assert timed_t.summary().open == 0
    for a, b in zip(got, want, strict=True):
        assert a.dtype == b.dtype and a.numpy().tobytes() == b.numpy().tobytes()


def _marks_and_kernels(code: str) -> list[str]:
    """The mark keys and kernel calls of generated code's call(), in order."""
    body = code[code.index("def call(") :]
    found = []
    for line in body.splitlines():
        line = line.strip()
        if line.startswith("torch.ops.cudatimer.run_enter"):
            found.append("mark")
        elif line.startswith(("extern_kernels.", "cpp_fused")):
            found.append(line.split("(", 1)[0].removeprefix("extern_kernels."))
    return found


def test_inductor_puts_each_mark_after_its_gradients() -> None:
    """Inductor's backward code: each call's mark runs after the kernels that make its
    outputs' gradients and before the call's own kernels; a layer's weight and bias gradient
    kernels run after its mark, so they are timed in its row (here: Inductor could have put
    them later, where they would be timed in the row open then)."""
    from torch._inductor.utils import run_and_get_code

    t = Timer(name="order")
    seq = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    compiled = torch.compile(seq, fullgraph=True)
    x = torch.randn(3, 8, requires_grad=True)

    def step() -> torch.Tensor:
        out: torch.Tensor = compiled(x)
        out.sum().backward()
        return out

    with cudatimer.instrument(seq, timer=t, backward=True):
        _, codes = run_and_get_code(step)
    assert _marks_and_kernels(codes[-1]) == [
        "mark",  # Sequential: the incoming gradient
        "mark",  # Sequential/2: the same gradient (its output is the model's)
        "mm",  # the input gradient of layer 2 (that the next mark needs),
        "mm",  # its weight gradient,
        "cpp_fused_sum_0",  # its bias gradient
        "mark",  # Sequential/1 (ReLU)
        "cpp_fused_threshold_backward_1",
        "mark",  # Sequential/0
        "mm",
        "mm",
        "cpp_fused_sum_2",
    ]
    assert backward_rows(t) == [
        ("Sequential.backward", 1),
        ("Sequential.backward/2", 1),
        ("Sequential.backward/1", 1),
        ("Sequential.backward/0", 1),
    ]


def test_forward_only_instrument_adds_nothing_to_the_backward_graph() -> None:
    """backward=False under compile: the forward rows only and no mark in Inductor's backward
    code; backward=True: the marks are there."""
    from torch._inductor.utils import run_and_get_code

    def compile_and_step(backward: bool) -> tuple[Timer, str]:
        torch._dynamo.reset()
        t = Timer(name=f"fwd-{backward}")
        net = Net()
        with cudatimer.instrument(net, timer=t, backward=backward):
            compiled = torch.compile(net, fullgraph=True)
            _, codes = run_and_get_code(lambda: compiled(torch.randn(4, 8)).sum().backward())
        return t, codes[-1]

    t, code = compile_and_step(False)
    assert backward_rows(t) == [] and "cudatimer" not in code[code.index("def call(") :]
    assert ("Net/pair/lin", 1) in rows(t)
    t, code = compile_and_step(True)
    assert code.count("torch.ops.cudatimer.run_enter") == 16  # one per call (blocks.0: twice)
    assert len(backward_rows(t)) == 12


def test_threads_running_one_compiled_graph_each_get_their_rows() -> None:
    """Two threads training through the same compiled graph at once: every step's rows, each
    closed (the open rows are per backward pass, not on the graph's marks)."""
    t = Timer(name="threads")
    net = Net()
    with cudatimer.instrument(net, timer=t, backward=True):
        compiled = torch.compile(net, backend="aot_eager", fullgraph=True)
        compiled(torch.randn(4, 8)).sum().backward()  # compile once, on this thread
        t.reset()

        def work() -> None:
            for _ in range(5):
                compiled(torch.randn(4, 8)).sum().backward()

        threads = [threading.Thread(target=work) for _ in range(2)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    got = dict(backward_rows(t))
    assert got["Net.backward"] == 10 and got["Net.backward/blocks.0"] == 20
    assert t.summary().open == 0


def test_the_timer_off_records_no_compiled_backward_rows() -> None:
    """Timer disabled while the compiled graph runs: its marks record nothing."""
    t = Timer(name="off")
    net = Net()
    with cudatimer.instrument(net, timer=t, backward=True):
        compiled = torch.compile(net, backend="aot_eager", fullgraph=True)
        compiled(torch.randn(4, 8)).sum().backward()
        assert len(backward_rows(t)) == 12
        t.reset()
        t.disable()
        compiled(torch.randn(4, 8)).sum().backward()
        t.enable()
    assert backward_rows(t) == []


def test_without_backward_marks_compiled_code_has_no_rows_as_before(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A torch whose backward graph takes no marks: the compiled backward gets no rows (the
    eager ones stay), nothing fails, gradients are those of the plain compiled model."""
    state = Net().state_dict()
    t = Timer(name="with")
    net = fresh(state)
    with cudatimer.instrument(net, timer=t, backward=True):
        want = train(net, torch.compile(net, backend="aot_eager", fullgraph=True), [4])
    assert len(backward_rows(t)) == 12
    torch._dynamo.reset()
    monkeypatch.setattr(_compile, "marks_in_backward", lambda: 0)
    t = Timer(name="without")
    net = fresh(state)
    with cudatimer.instrument(net, timer=t, backward=True):
        got = train(net, torch.compile(net, backend="aot_eager", fullgraph=True), [4])
        net(torch.randn(2, 8)).sum().backward()  # eager: its rows as before
    assert dict(backward_rows(t))["Net.backward/blocks.0"] == 2
    assert dict(backward_rows(t))["Net.backward"] == 1
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)
