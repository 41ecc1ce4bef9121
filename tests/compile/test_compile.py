"""torch.compile on the CPU: decorated functions and modules compiled as a whole are timed
around the compiled call; regions inside compiled code are timed per call through the
``cudatimer::enter``/``exit`` marks, with no graph break, fullgraph=True or False, on the
"eager", "aot_eager" and "inductor" backends, forward and backward."""

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


BACKENDS = ["eager", "aot_eager", "inductor"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fullgraph", [False, True])
def test_decorated_function_inlined_in_compiled_code_is_timed(
    fullgraph: bool, backend: str
) -> None:
    """Called from code Dynamo traces, a decorated function is timed on every call."""
    t = Timer(name="inlined")

    @t.timed("inner")
    def inner(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    def outer(x: torch.Tensor) -> torch.Tensor:
        return inner(x) * 3

    compiled = torch.compile(outer, backend=backend, fullgraph=fullgraph)
    assert torch.equal(run(compiled), (torch.ones(2, 4) + 1) * 3)
    assert calls(t) == {"inner": 3}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fullgraph", [False, True])
def test_region_inside_compiled_code_is_timed_without_graph_break(
    fullgraph: bool, backend: str
) -> None:
    """`with cuda_region(name):` inside compiled code: timed per call, no graph break."""

    def fn(x: torch.Tensor) -> torch.Tensor:
        with cudatimer.cuda_region("inside"):
            y = x.sin()
        return y + 1

    compiled = torch.compile(fn, backend=backend, fullgraph=fullgraph)
    assert torch.equal(run(compiled), torch.ones(2, 4).sin() + 1)
    assert calls(cudatimer.default_timer()) == {"inside": 3}
    torch._dynamo.reset()
    assert torch._dynamo.explain(fn)(torch.ones(2, 4)).graph_break_count == 0


def test_graph_break_inside_a_region_in_compiled_code() -> None:
    """A graph break inside a region's block in compiled code: still one call per call."""

    def fn(x: torch.Tensor) -> torch.Tensor:
        with cudatimer.cuda_region("broken"):
            y = x * 2
            torch._dynamo.graph_break()
            y = y + 1
        return y

    compiled = torch.compile(fn, backend="aot_eager")
    assert torch.equal(run(compiled), torch.full((2, 4), 3.0))
    assert calls(cudatimer.default_timer()) == {"broken": 3}


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
def test_instrumented_model_compiled_times_every_module(fullgraph: bool) -> None:
    """An instrumented model compiled as a whole: the model's region times each compiled call,
    and each submodule's region, inside the graph, each of its calls."""
    t = Timer(name="instrumented-compiled")
    net = Net()
    with cudatimer.instrument(net, timer=t):
        run(torch.compile(net, backend="eager", fullgraph=fullgraph))
    assert calls(t) == {"Net": 3, "Net/lin": 3, "Net/act": 3}


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
    assert calls(t) == {"Sequential": 3, "Sequential/0": 3, "Sequential/1": 3, "lin": 3}
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
    assert calls(cudatimer.default_timer()) == {"inside": 3}  # the default timer's region


def test_inductor_compiled_module_default_mode() -> None:
    """With inductor and fullgraph=False, a decorated module compiled whole is timed."""
    t = Timer(name="inductor-module")
    net = t.timed(Net(), name="net")
    compiled = torch.compile(net, backend="inductor")
    expected = net(torch.ones(2, 4))
    t.reset()
    assert torch.allclose(run(compiled), expected)
    assert calls(t) == {"net": 3}


class Block(torch.nn.Module):
    """Linear -> GELU -> Linear with a `with` region around the first two."""

    def __init__(self, timer: Timer) -> None:
        super().__init__()
        self.timer = timer
        self.up = torch.nn.Linear(8, 16)
        self.act = torch.nn.GELU()
        self.down = torch.nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with self.timer.region("mlp_in"):
            h = self.act(self.up(x))
        return self.down(h) + x


class Tower(torch.nn.Module):
    def __init__(self, timer: Timer, n: int = 3) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block(timer) for _ in range(n))
        self.head = torch.nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def train(model: torch.nn.Module, fn: Callable[..., Any], sizes: list[int]) -> list[Any]:
    """Forward and backward at each batch size; the outputs and the gradients, in order."""
    got: list[Any] = []
    torch.manual_seed(0)
    for n in sizes:
        x = torch.randn(n, 8)
        out = fn(x)
        out.square().mean().backward()
        got.append(out.detach())
        got.extend(p.grad.detach().clone() for p in model.parameters() if p.grad is not None)
        model.zero_grad()
    return got


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("fullgraph", [False, True])
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_compiled_training_counts_like_eager_and_changes_nothing(
    backend: str, fullgraph: bool, dynamic: bool
) -> None:
    """Forward and backward through a compiled instrumented model: the regions of eager mode
    with the same call counts, outputs and gradients as the uninstrumented compiled model,
    no graph break, and no more recompiles than without regions."""
    sizes = [4, 4, 6, 6, 9] if dynamic else [4, 4, 4]
    eager_t = Timer(name="eager")
    eager = Tower(eager_t)
    with cudatimer.instrument(eager, timer=eager_t):
        train(eager, eager, sizes)

    plain_t = Timer(name="plain", enabled=False)  # its `with` regions record nothing
    plain = Tower(plain_t)
    timed_t = Timer(name="compiled")
    timed = Tower(timed_t)
    timed.load_state_dict(plain.state_dict())

    stats = dynamo.utils.counters["stats"]
    torch._dynamo.reset()
    before = stats["unique_graphs"]
    compiled = torch.compile(plain, backend=backend, fullgraph=fullgraph, dynamic=dynamic)
    want = train(plain, compiled, sizes)
    graphs_plain = stats["unique_graphs"] - before
    torch._dynamo.reset()
    before = stats["unique_graphs"]
    with cudatimer.instrument(timed, timer=timed_t):
        compiled = torch.compile(timed, backend=backend, fullgraph=fullgraph, dynamic=dynamic)
        got = train(timed, compiled, sizes)
    graphs_timed = stats["unique_graphs"] - before
    assert dynamo.utils.counters["graph_break"] == {}

    assert [(r.name, r.calls) for r in timed_t.summary().regions] == [
        (r.name, r.calls) for r in eager_t.summary().regions
    ]
    assert timed_t.summary()["Tower/blocks.2/mlp_in/act"].calls == len(sizes)
    assert graphs_timed == graphs_plain
    for a, b in zip(got, want, strict=True):
        if backend == "aot_eager":
            assert torch.equal(a, b)  # no fusion to split: bitwise
        else:
            torch.testing.assert_close(a, b)


def _order_in(code: str, words: list[str]) -> list[str]:
    """The lines of generated code's call() that mention any of ``words``, in order."""
    body = code[code.index("def call(") :]
    return [w for line in body.splitlines() for w in words if w in line]


def test_inductor_keeps_a_decorated_call_between_its_marks() -> None:
    """Inductor's code runs work before a decorated call before its enter mark, then the call's
    kernel, then its exit mark; a pointwise op of the next call fused into that kernel is timed
    in the first call."""
    from torch._inductor.utils import run_and_get_code

    t = Timer(name="order")

    @t.timed("first")
    def first(x: torch.Tensor) -> torch.Tensor:
        return x.sin()

    @t.timed("second")
    def second(y: torch.Tensor) -> torch.Tensor:
        return y.cos()

    @t.timed("third")
    def third(z: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return z @ w

    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return third(second(first(x @ w)), w)  # the first matmul is in no region

    x, w = torch.randn(32, 32), torch.randn(32, 32)
    out, codes = run_and_get_code(torch.compile(fn, fullgraph=True), x, w)
    torch.testing.assert_close(out, (x @ w).sin().cos() @ w)
    order = _order_in(codes[0], ["cudatimer.run_enter", "cudatimer.run_exit", "cpp_fused", "mm("])
    # The matmul before "first" runs before its enter mark; sin and cos fused into one kernel,
    # which runs inside "first" (the exit mark of "first" needs its output); the last matmul
    # runs between the marks of "third".
    assert order == [
        "mm(",
        "cudatimer.run_enter",
        "cpp_fused",
        "cudatimer.run_exit",
        "cudatimer.run_enter",
        "cudatimer.run_exit",
        "cudatimer.run_enter",
        "mm(",
        "cudatimer.run_exit",
    ]
    assert calls(t) == {"first": 1, "second": 1, "third": 1}


def _overload_of(call: str) -> str:
    """``enter(3, buf1)`` -> ``enter.one``: the overload a mark's arguments after its key
    choose (none, one or two tensors, or the list)."""
    name, args = call.split("(", 1)
    rest = args.rstrip().removesuffix(")").split(",", 1)[1:]
    if not rest:
        return f"{name}.none"
    if rest[0].strip().startswith("["):
        return f"{name}.default"
    return f"{name}.{('one', 'two')[rest[0].count(',')]}"


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_marks_take_the_overload_for_their_count_of_tensors(backend: str) -> None:
    """A decorated call's marks take the overload for the number of tensors they depend on
    (none, one, two, or the list for more: cheaper to call than a list), and each is counted
    once a call; Inductor's code calls them by name."""
    from torch._inductor.utils import run_and_get_code

    t = Timer(name="overloads")

    @t.timed("zero")
    def zero(k: int) -> int:
        return k + 1

    @t.timed("one")
    def one(x: torch.Tensor) -> torch.Tensor:
        return x.sin()

    @t.timed("two")
    def two(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x * y

    @t.timed("three")
    def three(x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return x + y, y + z, z + x

    def fn(x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        a, b, c = three(one(x), two(y, z), z)
        return a * b * c * zero(2)

    args = [torch.randn(8) for _ in range(3)]
    compiled = torch.compile(fn, backend=backend, fullgraph=True)
    if backend == "inductor":
        out, codes = run_and_get_code(compiled, *args)
        body = codes[0][codes[0].index("def call(") :]
        # Inductor's lines call the kernels straight (run_enter/run_exit, no dispatcher):
        # the overload shows in the arguments after the key.
        used = sorted(
            {
                _overload_of(line.split("torch.ops.cudatimer.run_")[1])
                for line in body.splitlines()
                if "torch.ops.cudatimer." in line
            }
        )
        assert used == [
            "enter.default",
            "enter.none",
            "enter.one",
            "enter.two",
            "exit.default",
            "exit.none",
            "exit.one",
        ]
    else:
        out = compiled(*args)
    x, y, z = args
    a, b, c = x.sin() + y * z, y * z + z, z + x.sin()
    torch.testing.assert_close(out, a * b * c * 3)
    assert calls(t) == {"one": 1, "two": 1, "three": 1, "zero": 1}


def test_marks_of_with_blocks_keep_their_order() -> None:
    """`with` blocks in Inductor's code: each enter mark before its exit mark, blocks in
    program order (their kernels may move: a block declares no outputs)."""
    from torch._inductor.utils import run_and_get_code

    t = Timer(name="blocks")

    def fn(x: torch.Tensor) -> torch.Tensor:
        with t.region("a"):
            x = x.sin()
        with t.region("b"):
            x = x.cos()
        return x

    _, codes = run_and_get_code(torch.compile(fn, fullgraph=True), torch.randn(8))
    body = codes[0][codes[0].index("def call(") :]
    marks = [
        line.split("(", 1)[1].split(",")[0].rstrip(")")
        for line in body.splitlines()
        if "cudatimer." in line
    ]
    keys = [int(k) for k in marks]
    assert len(keys) == 4 and keys[0] == keys[1] and keys[2] == keys[3] and keys[0] != keys[2]
    assert ["enter" in line for line in body.splitlines() if "cudatimer." in line] == [
        True,
        False,
        True,
        False,
    ]
    assert calls(t) == {"a": 1, "b": 1}


def test_an_error_inside_compiled_code_leaves_no_region_open() -> None:
    """A kernel error between a compiled region's marks: the region closes as the exception
    passes the eager region around it; later regions nest at the right place."""
    t = Timer(name="error")

    @t.timed("inner")
    def inner(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        return x.index_select(0, idx) * 2

    compiled = torch.compile(lambda x, i: inner(x, i) + 1, backend="aot_eager", fullgraph=True)
    with t.region("outer"):
        compiled(torch.ones(3), torch.tensor([0, 1]))
    with pytest.raises(IndexError), t.region("outer"):
        compiled(torch.ones(3), torch.tensor([0, 7]))
    with t.region("after"):
        pass
    s = t.summary()
    assert [(r.name, r.calls) for r in s.regions] == [
        ("outer", 2),
        ("outer/inner", 2),
        ("after", 1),
    ]
    assert s.open == 0


def test_without_the_marks_regions_are_left_out_and_the_report_says_so() -> None:
    """CUDATIMER_COMPILE=0 (or a torch without the mechanism): regions inside compiled code
    do nothing, and the report says once how many were traced untimed, and why."""
    from tests.helpers.subproc import run_python

    code = """
        import io, torch, cudatimer
        @cudatimer.cuda_timed(name="inner")
        def inner(x):
            return x + 1
        def fn(x):
            with cudatimer.cuda_region("block"):
                x = x * 2
            return inner(x)
        compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
        for _ in range(3):
            compiled(torch.ones(2))
        inner(torch.ones(2))
        print([(r.name, r.calls) for r in cudatimer.summary().regions])
        print(cudatimer.report(file=io.StringIO()).splitlines()[-1])
    """
    done = run_python(code, {"CUDATIMER_COMPILE": "0"})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "[('inner', 1)]"
    assert lines[1] == (
        "note: 2 region(s) traced into torch.compile'd code are not timed there "
        "(CUDATIMER_COMPILE=0 is set); they time the calls that run eagerly"
    )


def test_importing_cudatimer_leaves_dynamo_unimported() -> None:
    """`import cudatimer` does not import torch._dynamo (1.7 s): the marks need it only later."""
    from tests.helpers.subproc import run_python

    done = run_python("import sys, cudatimer\nprint('torch._dynamo' in sys.modules)", {})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False"]


def test_torch_marks_constant_functions_as_cudatimer_does() -> None:
    """torch.compiler.assume_constant_result still marks a function by the attribute that
    cudatimer sets itself before Dynamo is imported."""

    def probe() -> int:
        return 0

    marked = torch.compiler.assume_constant_result(probe)
    assert marked is probe and getattr(probe, "_dynamo_marked_constant", None) is True


def test_inductor_calls_the_marks_kernels_without_the_dispatcher() -> None:
    """Inductor's Python code calls the marks' kernels straight (torch.profiler sees no
    cudatimer op dispatched) and every region is still timed per call, in order."""
    from torch.profiler import ProfilerActivity, profile

    t = Timer(name="no-dispatch")

    @t.timed("inner")
    def inner(x: torch.Tensor) -> torch.Tensor:
        return x.sin() @ x

    def fn(x: torch.Tensor) -> torch.Tensor:
        with t.region("block"):
            y = inner(x)
        return inner(y)

    compiled = torch.compile(fn, backend="inductor", fullgraph=True)
    x = torch.randn(8, 8)
    compiled(x)  # compiles
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        out = compiled(x)
    torch.testing.assert_close(out, fn(x))
    dispatched = [e.name for e in prof.events() if "cudatimer" in e.name]
    assert dispatched == []
    assert any("mm" in e.name for e in prof.events())  # the profiler saw the compiled work
    assert calls(t) == {"block": 3, "block/inner": 3, "inner": 3}  # fn(x) above ran eagerly
    assert t.summary().open == 0


def test_inductor_cpp_wrapper_keeps_calling_the_marks_through_the_dispatcher() -> None:
    """With Inductor's C++ wrapper the marks stay dispatcher calls (it has no Python names to
    call), and the region is timed per call as with the Python wrapper."""
    import torch._inductor.config as inductor_config
    from torch._inductor.utils import run_and_get_code

    t = Timer(name="cpp-wrapper")

    @t.timed("inner")
    def inner(x: torch.Tensor) -> torch.Tensor:
        return x.sin() @ x

    x = torch.randn(8, 8)
    with inductor_config.patch(cpp_wrapper=True):
        compiled = torch.compile(lambda x: inner(x) + 1, fullgraph=True)
        out, codes = run_and_get_code(compiled, x)
        compiled(x)
    torch.testing.assert_close(out, x.sin() @ x + 1)
    code = "\n".join(codes)
    assert '"cudatimer::enter"' in code and '"cudatimer::exit"' in code
    assert "run_enter" not in code
    assert calls(t) == {"inner": 2}


def test_compile_direct_off_keeps_the_marks_dispatcher_calls() -> None:
    """CUDATIMER_COMPILE_DIRECT=0: Inductor's code calls the marks as ops again (the way
    around the lowering), and the regions are timed all the same."""
    from tests.helpers.subproc import run_python

    code = """
        import torch, cudatimer
        from torch._inductor.utils import run_and_get_code
        @cudatimer.cuda_timed(name="inner")
        def inner(x):
            return x.sin() @ x
        compiled = torch.compile(lambda x: inner(x) + 1, fullgraph=True)
        _, codes = run_and_get_code(compiled, torch.randn(8, 8))
        compiled(torch.randn(8, 8))
        print(sorted({w for w in ("cudatimer.enter.one", "cudatimer.run_enter") if w in codes[0]}))
        print([(r.name, r.calls) for r in cudatimer.summary().regions])
    """
    # The on-disk cache keys on the graph, not on the lowering: off here, it is compiled anew.
    done = run_python(
        code, {"CUDATIMER_COMPILE_DIRECT": "0", "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1"}
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["['cudatimer.enter.one']", "[('inner', 2)]"]
