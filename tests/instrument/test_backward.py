"""Backward rows: instrument(model, backward=True) mirrors the forward tree under
<Model>.backward, the report's coverage figure, backward=True for any region, activation
checkpointing, torch.autograd.grad, gradient accumulation, unchanged gradients, bad input.
GPU times come from the fake GPU (tests/helpers/fake_cuda.py); the real one is in tests/gpu/."""

from __future__ import annotations

import io
import json
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import cudatimer
from cudatimer import Timer
from cudatimer.sources import _backward
from tests.helpers.fake_cuda import FakeGPU, install
from tests.helpers.subproc import run_python


@pytest.fixture
def gpu() -> Iterator[FakeGPU]:
    with install() as fake:
        yield fake


class _Spend(torch.autograd.Function):
    """Identity whose forward and backward each queue fake GPU work."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, gpu: FakeGPU | None, ms: float) -> torch.Tensor:
        ctx.gpu, ctx.ms = gpu, ms
        return x * 1.0

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        if ctx.gpu is not None:
            ctx.gpu.run(ctx.ms)
        return grad * 1.0, None, None


class Work(nn.Module):
    """A layer whose backward takes ``ms`` of (fake) GPU time."""

    def __init__(self, gpu: FakeGPU | None = None, ms: float = 0.0) -> None:
        super().__init__()
        self.gpu, self.ms = gpu, ms
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = _Spend.apply(self.lin(x), self.gpu, self.ms)
        return out


class Model(nn.Module):
    """Two layers (2 and 3 ms of backward) and 1 ms of the model's own backward after them."""

    def __init__(self, gpu: FakeGPU | None = None) -> None:
        super().__init__()
        self.gpu = gpu
        self.a = Work(gpu, 2.0)
        self.b = Work(gpu, 3.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = _Spend.apply(self.b(self.a(x)), self.gpu, 1.0)
        return out


def calls(t: Timer) -> dict[str, int]:
    return {r.name: r.calls for r in t.summary().regions}


def backward_rows(t: Timer) -> dict[str, int]:
    return {n: c for n, c in calls(t).items() if ".backward" in n}


X = torch.ones(3, 4)
ROWS = {
    "Model.backward",
    "Model.backward/a",
    "Model.backward/a/lin",
    "Model.backward/b",
    "Model.backward/b/lin",
}


def test_rows_mirror_the_forward_tree_once_per_step() -> None:
    """Each module's backward row is its forward path under Model.backward, at the forward
    row's depth + 0 below the root, one call per training step."""
    t = Timer(name="mirror")
    model = Model()
    with cudatimer.instrument(model, backward=True, timer=t) as handle:
        for _ in range(3):
            model(X).sum().backward()
            t.step()
    assert handle.backward_regions == {
        "": "Model.backward",
        "a": "Model.backward/a",
        "a.lin": "Model.backward/a/lin",
        "b": "Model.backward/b",
        "b.lin": "Model.backward/b/lin",
    }
    assert backward_rows(t) == dict.fromkeys(ROWS, 3)
    depth = {r.name: r.depth for r in t.summary().regions}
    for forward in ("Model", "Model/a", "Model/a/lin", "Model/b/lin"):
        assert depth[forward.replace("Model", "Model.backward", 1)] == depth[forward]
    tree = cudatimer.report(summary=t.summary(), view="tree", columns=["region", "calls"])
    assert "Model.backward" in tree and "+- a" in tree and ":  +- lin" in tree


def test_rows_time_their_module_and_coverage_shows_the_rest(gpu: FakeGPU, tmp_path: Path) -> None:
    """On the GPU each row spans its module's backward (b 3 ms, a 2 ms, the root 6 ms); the
    report and the JSON give the root's coverage, 5/6, and the 1 ms in no row."""
    t = Timer(name="coverage")
    model = Model(gpu)
    with cudatimer.instrument(model, backward=True, timer=t):
        model(X).sum().backward()
    s = t.summary()
    gpu_ms = {r.name: r.gpu_total_ms for r in s.regions if ".backward" in r.name}
    assert gpu_ms == pytest.approx(
        {
            "Model.backward": 6.0,
            "Model.backward/a": 2.0,
            "Model.backward/a/lin": 0.0,
            "Model.backward/b": 3.0,
            "Model.backward/b/lin": 0.0,
        }
    )
    (cov,) = s.backward_coverage
    assert (cov.region, cov.clock, cov.children) == ("Model.backward", "cuda:0", 2)
    assert cov.fraction == pytest.approx(5 / 6) and cov.uncovered_ms == pytest.approx(1.0)
    text = cudatimer.report(summary=s)
    assert (
        "backward coverage: Model.backward (cuda:0): its 2 child row(s) cover 83.3% of its "
        "6.000 ms (1.000 ms ran in no child row: the backward of Model's own forward code "
        "after its last submodule call, such as a loss computed in forward)"
    ) in text
    path = tmp_path / "run.json"
    t.save(path)
    data = json.loads(path.read_text())
    assert data["schema"] == cudatimer.SCHEMA_VERSION == 1
    (saved,) = data["backward_coverage"]
    assert saved["region"] == "Model.backward" and saved["fraction"] == pytest.approx(5 / 6)
    assert cudatimer.load(path).backward_coverage == s.backward_coverage


class Fork(nn.Module):
    """Returns ``a``'s output after calling ``b`` on the side: the hooks of ``a`` and of
    this module land on one node as two hooks (b's hook was set between them)."""

    def __init__(self, gpu: FakeGPU) -> None:
        super().__init__()
        self.pre = Work(gpu, 3.0)
        self.a = Work(gpu, 2.0)
        self.b = Work(gpu, 5.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.a(self.pre(x))
        self.b(x)  # its node never runs: no path from the loss
        return y


def test_an_outer_row_opened_after_an_inner_one_still_nests(gpu: FakeGPU) -> None:
    """Two hooks on one node open the inner call's row first: the outer row still takes
    its place below it, so the node of ``pre`` closes ``a``'s row (2 ms, not 5)."""
    t = Timer(name="fork")
    model = Fork(gpu)
    with cudatimer.instrument(model, backward=True, timer=t):
        model(X).sum().backward()
    gpu_ms = {r.name: r.gpu_total_ms for r in t.summary().regions if ".backward" in r.name}
    assert gpu_ms == pytest.approx(
        {
            "Fork.backward": 5.0,
            "Fork.backward/a": 2.0,
            "Fork.backward/a/lin": 0.0,
            "Fork.backward/pre": 3.0,
            "Fork.backward/pre/lin": 0.0,
        }
    )


def test_nested_modules_returning_one_tensor_share_one_hook(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Three nested modules whose output is one tensor set one pre-hook, and all three get
    their row."""
    made: list[object] = []

    class Counting(_backward._Hook):
        __slots__ = ()

        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            made.append(self)

    monkeypatch.setattr(_backward, "_Hook", Counting)
    t = Timer(name="shared")
    model = nn.Sequential(nn.Sequential(nn.Linear(4, 4)))
    with cudatimer.instrument(model, backward=True, timer=t):
        model(X).sum().backward()
    assert len(made) == 1
    assert backward_rows(t) == {
        "Sequential.backward": 1,
        "Sequential.backward/0": 1,
        "Sequential.backward/0/0": 1,
    }


def _grads(model: nn.Module, step: Any) -> list[torch.Tensor]:
    model.zero_grad(set_to_none=True)
    step()
    return [p.grad.clone() for p in model.parameters() if p.grad is not None]


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


class Checkpointed(nn.Module):
    def __init__(self, reentrant: bool) -> None:
        super().__init__()
        self.reentrant = reentrant
        self.inner = Model()
        self.head = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = checkpoint(self.inner, x, use_reentrant=self.reentrant)
        out: torch.Tensor = self.head(y)
        return out


@pytest.mark.parametrize("reentrant", [True, False], ids=["reentrant", "non-reentrant"])
def test_activation_checkpointing(reentrant: bool) -> None:
    """Under torch.utils.checkpoint (both kinds) every module's backward row is recorded once
    per step (the reentrant kind's rows come from its recomputation's own backward pass), and
    the gradients are bitwise those of the uninstrumented model."""
    torch.manual_seed(0)
    model = Checkpointed(reentrant)
    x = torch.randn(3, 4, requires_grad=True)

    def step() -> None:
        model(x).sum().backward()

    expected = _grads(model, step)
    t = Timer(name=f"checkpoint-{reentrant}")
    with cudatimer.instrument(model, backward=True, timer=t):
        for _ in range(2):
            got = _grads(model, step)
            t.step()
    assert _same(got, expected)
    inner = {f"Checkpointed.backward/inner{n[len('Model.backward') :]}" for n in ROWS}
    rows = {"Checkpointed.backward", "Checkpointed.backward/head", *inner}
    assert backward_rows(t) == dict.fromkeys(rows, 2)


def test_autograd_grad_is_timed_and_unchanged() -> None:
    """torch.autograd.grad gets the same rows as .backward(), and the same gradients."""
    torch.manual_seed(0)
    model = Model()
    params = list(model.parameters())
    expected = torch.autograd.grad(model(X).sum(), params)
    t = Timer(name="autograd-grad")
    with cudatimer.instrument(model, backward=True, timer=t):
        got = torch.autograd.grad(model(X).sum(), params)
    assert _same(list(got), list(expected))
    assert backward_rows(t) == dict.fromkeys(ROWS, 1)


def test_gradient_accumulation_counts_each_forward_once(gpu: FakeGPU) -> None:
    """Two forwards, one backward of their sum: two calls per row, and each forward's root
    row stops where the other's begins (6 ms each, 12 in all: no time counted twice)."""
    torch.manual_seed(0)
    model = Model(gpu)
    x1, x2 = torch.randn(3, 4), torch.randn(3, 4)

    def step() -> None:
        (model(x1).sum() + model(x2).sum()).backward()

    expected = _grads(model, step)
    t = Timer(name="accumulate")
    with cudatimer.instrument(model, backward=True, timer=t):
        got = _grads(model, step)
    assert _same(got, expected)
    assert backward_rows(t) == dict.fromkeys(ROWS, 2)
    s = t.summary()
    assert s["Model.backward"].gpu_total_ms == pytest.approx(12.0)
    assert s["Model.backward"].gpu_max_ms == pytest.approx(6.0, rel=0.01)


def test_gradients_are_bitwise_unchanged_on_a_gpt() -> None:
    """A small GPT-2 (dropout off, tied embeddings): every parameter's gradient is bitwise
    the same with backward rows as without."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from _workloads import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab=32, seq=8, layers=2, width=16, heads=2))
    idx = torch.randint(0, 32, (2, 8))

    def step() -> None:
        model(idx).float().logsumexp(-1).mean().backward()

    expected = _grads(model, step)
    t = Timer(name="gpt-grads")
    with cudatimer.instrument(model, backward=True, timer=t):
        got = _grads(model, step)
    assert _same(got, expected)
    assert backward_rows(t)["GPT.backward/blocks.1/mlp/fc"] == 1


def test_a_decorated_function_times_its_backward(gpu: FakeGPU) -> None:
    """@cuda_timed(..., backward=True): the row <name>.backward spans the nodes the call
    made (2 ms), not the 1 ms of work made before it."""
    t = Timer(name="decorated")
    x = torch.ones(2, requires_grad=True)

    @t.timed("attention", backward=True)
    def attention(z: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = _Spend.apply(z * 2.0, gpu, 2.0)
        return out

    for _ in range(2):
        before = _Spend.apply(x * 1.0, gpu, 1.0)
        attention(before).sum().backward()
    s = t.summary()
    assert calls(t) == {"attention": 2, "attention.backward": 2}
    assert s["attention.backward"].gpu_mean_ms == pytest.approx(2.0)


def test_a_with_block_times_the_backward_of_what_it_hands_in(gpu: FakeGPU) -> None:
    """with cuda_region(name, backward=True): backward_from(y) times the autograd nodes made
    inside the block (3 ms), up to the first node made before it (1 ms, left out)."""
    t = Timer(name="block")
    x = torch.ones(2, requires_grad=True)
    region = t.region("mix", backward=True)
    before = _Spend.apply(x * 1.0, gpu, 1.0)
    with region:
        y = _Spend.apply(_Spend.apply(before * 2.0, gpu, 1.0), gpu, 2.0)
        region.backward_from(y)
    y.sum().backward()
    s = t.summary()
    assert calls(t) == {"mix": 1, "mix.backward": 1}
    assert s["mix.backward"].gpu_total_ms == pytest.approx(3.0)


def test_a_with_block_without_backward_from_warns_once_naming_it() -> None:
    """A backward=True block that ends without backward_from() warns, once, naming the
    region and the call to make; a block that calls it, a decorated call and a block under
    no_grad do not warn."""
    t = Timer(name="unhooked")
    layer = nn.Linear(4, 4)
    with pytest.warns(RuntimeWarning) as caught:
        for _ in range(3):
            with t.region("blk", backward=True):
                y = layer(X)
            y.sum().backward()
    assert len(caught) == 1
    message = str(caught[0].message)
    assert "region 'blk' has backward=True, but its `with` block ended without calling " in message
    assert "backward_from(...), so it gets no backward row (blk.backward)" in message
    assert "blk.backward_from(out)" in message
    assert caught[0].filename == __file__
    assert calls(t) == {"blk": 3}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        region = t.region("hooked", backward=True)
        with region:
            y = layer(X)
            region.backward_from(y)
        y.sum().backward()
        t.timed(lambda x: layer(x), name="decorated", backward=True)(X).sum().backward()
        with torch.no_grad(), t.region("inference", backward=True):
            layer(X)
    assert calls(t)["hooked.backward"] == 1 and calls(t)["decorated.backward"] == 1


def test_a_module_decorated_with_backward() -> None:
    """cuda_timed(module, backward=True) wraps the module's forward for both rows."""
    t = Timer(name="decorated-module")
    layer = t.timed(nn.Linear(4, 4), name="proj", backward=True)
    layer(X).sum().backward()
    assert calls(t) == {"proj": 1, "proj.backward": 1}


def test_no_rows_without_grad_or_with_the_timer_off() -> None:
    """Under no_grad, inference mode or a disabled Timer no row appears; enabled, all do."""
    t = Timer(name="off")
    model = Model()
    with cudatimer.instrument(model, backward=True, timer=t):
        with torch.no_grad():
            model(X)
        with torch.inference_mode():
            model(X)
        t.disable()
        model(X).sum().backward()
        assert backward_rows(t) == {}
        t.enable()  # the control: the same step with the Timer on has every row
        model(X).sum().backward()
    assert backward_rows(t) == dict.fromkeys(ROWS, 1)


@pytest.mark.parametrize(
    ("make", "error", "text"),
    [
        (lambda t: t.region("r", backward="yes"), TypeError, "backward must be a bool"),
        (lambda t: t.region("r", backward=True).backward_from(), TypeError, "outputs"),
        (lambda t: t.region("r", backward=True).backward_from(1), TypeError, "outputs\\[0\\]"),
        (lambda t: t.region("r", backward=True).backward_from(X), RuntimeError, "outside"),
        (
            lambda t: t.timed(name="g", backward=True)(lambda: (yield)),
            TypeError,
            "backward=True",
        ),
    ],
    ids=["not-bool", "no-outputs", "not-tensor", "outside-block", "generator"],
)
def test_bad_input_names_the_argument(make: Any, error: type[Exception], text: str) -> None:
    """Bad backward arguments fail at once with the argument's name."""
    with pytest.raises(error, match=text):
        make(Timer(name="bad"))


def test_backward_regions_do_nothing_under_cudatimer_disable() -> None:
    """With CUDATIMER_DISABLE=1 a backward=True region, decorator and backward_from run the
    code untouched and record nothing."""
    out = run_python(
        """
        import torch, cudatimer
        mix = cudatimer.cuda_region("mix", backward=True)

        @cudatimer.cuda_timed("f", backward=True)
        def f(a):
            return a * 2

        x = torch.ones(2, requires_grad=True)
        with mix:
            y = f(x)
            mix.backward_from(y)
        y.sum().backward()
        print(cudatimer.summary().names, x.grad.tolist())
        """,
        {"CUDATIMER_DISABLE": "1"},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "() [2.0, 2.0]"


class _OnBackward(torch.autograd.Function):
    """Identity whose backward calls ``action()`` first (to raise, or to reset a Timer)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, action: Callable[[], None]) -> torch.Tensor:
        ctx.action = action
        return x * 1.0

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        ctx.action()
        return grad, None


def _fail() -> None:
    raise RuntimeError("backward failed on purpose")


class Failing(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = _OnBackward.apply(x, _fail)
        return out


def test_a_backward_that_raises_ends_its_rows() -> None:
    """A node raising in backward: the rows it opened end (one call each, nothing left
    open), and the next backward pass gets its rows as usual."""
    t = Timer(name="raises")
    model = nn.Sequential(nn.Linear(4, 4), Failing(), nn.Linear(4, 4))
    with cudatimer.instrument(model, backward=True, timer=t):
        with pytest.raises(RuntimeError, match="on purpose"):
            model(X).sum().backward()
        assert backward_rows(t) == {
            "Sequential.backward": 1,
            "Sequential.backward/1": 1,
            "Sequential.backward/2": 1,
        }
        assert t.summary().open == 0
        model[1] = nn.Identity()
        model(X).sum().backward()
    assert backward_rows(t) == {
        "Sequential.backward": 2,
        "Sequential.backward/0": 1,
        "Sequential.backward/1": 1,
        "Sequential.backward/2": 2,
    }


def test_a_reset_inside_the_pass_drops_that_pass_s_rows(gpu: FakeGPU) -> None:
    """reset() while a pass runs: no row of that pass is reported (each began before
    it), and the next pass is recorded in full."""
    t = Timer(name="reset-in-pass")
    model = Model(gpu)
    with cudatimer.instrument(model, backward=True, timer=t):
        model(_OnBackward.apply(X.clone().requires_grad_(), t.reset)).sum().backward()
        assert backward_rows(t) == {}
        model(X).sum().backward()
    assert backward_rows(t) == dict.fromkeys(ROWS, 1)


def test_every_n_samples_the_backward_rows_as_the_forward_calls(gpu: FakeGPU) -> None:
    """every=4 with backward=True: 8 calls, each row counts 8 and times 2 (one in 4), and
    the calls not sampled hook nothing (their outputs carry no hook)."""
    t = Timer(name="sampled")
    x = torch.ones(2, requires_grad=True)
    outs: list[torch.Tensor] = []

    @t.timed("attention", backward=True, every=4)
    def attention(z: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = _Spend.apply(z * 2.0, gpu, 2.0)
        outs.append(out)
        return out

    for _ in range(8):
        attention(x).sum().backward()
    s = t.summary()
    assert calls(t) == {"attention": 8, "attention.backward": 8}
    assert s["attention"].gpu.count == 2
    assert s["attention.backward"].gpu.count == 2
    assert s["attention.backward"].gpu_mean_ms == pytest.approx(2.0)
    assert [out._backward_hooks is not None for out in outs] == [i % 4 == 0 for i in range(8)]


def test_every_n_samples_a_with_block_s_backward_row(gpu: FakeGPU) -> None:
    """every=2 on a `with` block with backward_from: 4 blocks, both rows count 4, time 2."""
    t = Timer(name="sampled-block")
    x = torch.ones(2, requires_grad=True)
    for _ in range(4):
        region = t.region("mix", backward=True, every=2)
        with region:
            y = _Spend.apply(x * 2.0, gpu, 1.0)
            region.backward_from(y)
        y.sum().backward()
    s = t.summary()
    assert calls(t) == {"mix": 4, "mix.backward": 4}
    assert s["mix"].gpu.count == 2 and s["mix.backward"].gpu.count == 2


def test_the_hook_rides_the_output_s_hook_dict_and_leaves_user_hooks_as_they_were() -> None:
    """A module's output carries the row's hook in its hook dict (no RemovableHandle); a
    user's hook on it sees the gradient it sees without cudatimer, before and after an
    in-place op on it; torch.save of the output warns about no hook of cudatimer's."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    x = torch.randn(3, 4)

    def run(inplace: bool) -> list[torch.Tensor]:
        model.zero_grad(set_to_none=True)
        seen: list[torch.Tensor] = []
        out = model(x)
        if inplace:
            out.mul_(3.0)
        out.register_hook(lambda g: seen.append(g.clone()))
        (out * torch.arange(4.0)).sum().backward()
        return [*seen, *(p.grad.clone() for p in model.parameters() if p.grad is not None)]

    want = {inplace: run(inplace) for inplace in (False, True)}
    t = Timer(name="hook-dict")
    with cudatimer.instrument(model, backward=True, timer=t):
        out = model(x)
        assert list(out._backward_hooks) == [_backward._KEY]
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            torch.save(out, io.BytesIO())
        got = {inplace: run(inplace) for inplace in (False, True)}
    for inplace in (False, True):
        assert len(got[inplace]) == 5 and _same(got[inplace], want[inplace])
    assert backward_rows(t)["Sequential.backward/1"] == 2
