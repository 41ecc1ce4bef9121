"""torch.compile on the CPU: decorated functions and modules compiled as a whole are timed
around the compiled call; regions inside compiled code are left out of the graph; nothing
crashes, with fullgraph=True or False. The matrix uses the "eager" backend (Dynamo without code
generation, fast); two small cases go through inductor."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

import cudatimer
from cudatimer import Timer

dynamo = pytest.importorskip("torch._dynamo")


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def calls(timer: Timer) -> dict[str, int]:
    return {r.name: r.calls for r in timer.summary().regions}


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.act = torch.nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.lin(x))


def run(compiled: Callable[[torch.Tensor], torch.Tensor], n: int = 3) -> torch.Tensor:
    x = torch.ones(2, 4)
    out = compiled(x)
    for _ in range(n - 1):
        out = compiled(x)
    return out


@pytest.mark.parametrize("fullgraph", [False, True])
def test_compiled_decorated_function_is_timed_around_the_compiled_call(fullgraph: bool) -> None:
    """torch.compile(timed_fn): the wrapper runs eagerly, the function is compiled, every call
    is counted (the region spans the compiled call, compilation included on the first)."""
    t = Timer(name="compiled-fn")

    @t.timed("fn")
    def fn(x: torch.Tensor) -> torch.Tensor:
        return (x * 2).sin()

    compiled = torch.compile(fn, backend="eager", fullgraph=fullgraph)
    assert torch.equal(run(compiled), (torch.ones(2, 4) * 2).sin())
    assert calls(t) == {"fn": 3}
    assert dynamo.utils.counters["stats"]["unique_graphs"] >= 1  # the body really compiled


@pytest.mark.parametrize("fullgraph", [False, True])
@pytest.mark.parametrize("how", ["torch.compile", "Module.compile"])
def test_compiled_decorated_module_is_timed_around_the_compiled_call(
    fullgraph: bool, how: str
) -> None:
    """A decorated module compiled with torch.compile(m) or m.compile() is timed per call."""
    t = Timer(name="compiled-module")
    net = t.timed(Net(), name="net")
    if how == "torch.compile":
        compiled: Any = torch.compile(net, backend="eager", fullgraph=fullgraph)
    else:
        net.compile(backend="eager", fullgraph=fullgraph)
        compiled = net
    run(compiled)
    assert calls(t) == {"net": 3}


@pytest.mark.parametrize("fullgraph", [False, True])
def test_decorated_function_inlined_in_compiled_code_is_left_out(fullgraph: bool) -> None:
    """Called from code Dynamo traces, a decorated function's region is left out of the graph:
    no crash, no graph break, no call counted."""
    t = Timer(name="inlined")

    @t.timed("inner")
    def inner(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    def outer(x: torch.Tensor) -> torch.Tensor:
        return inner(x) * 3

    compiled = torch.compile(outer, backend="eager", fullgraph=fullgraph)
    assert torch.equal(run(compiled), (torch.ones(2, 4) + 1) * 3)
    assert calls(t) == {}


@pytest.mark.parametrize("fullgraph", [False, True])
def test_region_inside_compiled_code_is_left_out_without_graph_break(fullgraph: bool) -> None:
    """`with cuda_region(name):` inside compiled code is a no-op in the graph, with
    fullgraph=True too, and does not break the graph."""

    def fn(x: torch.Tensor) -> torch.Tensor:
        with cudatimer.cuda_region("inside"):
            y = x.sin()
        return y + 1

    compiled = torch.compile(fn, backend="eager", fullgraph=fullgraph)
    assert torch.equal(run(compiled), torch.ones(2, 4).sin() + 1)
    assert cudatimer.summary().regions == ()
    torch._dynamo.reset()
    assert torch._dynamo.explain(fn)(torch.ones(2, 4)).graph_break_count == 0


def test_graph_break_inside_a_region_in_compiled_code() -> None:
    """A graph break inside a region's block in compiled code is handled by Dynamo."""

    def fn(x: torch.Tensor) -> torch.Tensor:
        with cudatimer.cuda_region("broken"):
            y = x * 2
            torch._dynamo.graph_break()
            y = y + 1
        return y

    compiled = torch.compile(fn, backend="eager")
    assert torch.equal(run(compiled), torch.full((2, 4), 3.0))
    assert cudatimer.summary().regions == ()


def test_region_object_made_outside_runs_eagerly_without_fullgraph() -> None:
    """A Region object made outside compiled code breaks the graph there (Dynamo cannot enter
    it) and is then timed eagerly, every call."""
    held = cudatimer.cuda_region("held")

    def fn(x: torch.Tensor) -> torch.Tensor:
        with held:
            return x + 1

    run(torch.compile(fn, backend="eager"))
    assert cudatimer.summary()["held"].calls == 3


@pytest.mark.parametrize("fullgraph", [False, True])
def test_sampled_and_instrumented_model_compiled(fullgraph: bool) -> None:
    """An instrumented model compiled as a whole: the model's region times each compiled
    call; its submodules' regions are inside the graph and left out."""
    t = Timer(name="instrumented-compiled")
    net = Net()
    with cudatimer.instrument(net, timer=t):
        run(torch.compile(net, backend="eager", fullgraph=fullgraph))
    assert calls(t) == {"Net": 3}


@pytest.mark.parametrize("fullgraph", [False, True])
def test_torch_builtin_module_timed_and_compiled_is_really_compiled(fullgraph: bool) -> None:
    """Timing an nn.Sequential or nn.Linear (torch's own forward, which Dynamo will not compile
    as a first frame) keeps it compiled: a graph is made, fullgraph=True does not fail, and
    every call is counted."""
    t = Timer(name="builtin")
    seq = nn_sequential()
    lin = t.timed(torch.nn.Linear(4, 4), name="lin")
    with cudatimer.instrument(seq, timer=t), torch.no_grad():
        run(torch.compile(seq, backend="eager", fullgraph=fullgraph))
        run(torch.compile(lin, backend="eager", fullgraph=fullgraph))
    assert calls(t) == {"Sequential": 3, "lin": 3}
    assert dynamo.utils.counters["stats"]["unique_graphs"] >= 2


def nn_sequential() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.GELU())


def test_inductor_compiled_function_fullgraph() -> None:
    """With inductor (code generation on the CPU), fullgraph=True: timed around the call."""
    t = Timer(name="inductor")

    @t.timed("fn")
    def fn(x: torch.Tensor) -> torch.Tensor:
        with cudatimer.cuda_region("inside"):
            y = x.cos()
        return y * 2

    compiled = torch.compile(fn, backend="inductor", fullgraph=True)
    assert torch.allclose(run(compiled), torch.ones(2, 4).cos() * 2)
    assert calls(t) == {"fn": 3}


def test_inductor_compiled_module_default_mode() -> None:
    """With inductor and fullgraph=False, a decorated module compiled whole is timed."""
    t = Timer(name="inductor-module")
    net = t.timed(Net(), name="net")
    compiled = torch.compile(net, backend="inductor")
    expected = net(torch.ones(2, 4))
    t.reset()
    assert torch.allclose(run(compiled), expected)
    assert calls(t) == {"net": 3}
