"""cudatimer.instrument: a region around every submodule's forward, named by module path,
optional approximate backward regions, and one handle that removes everything."""

from __future__ import annotations

import copy
import threading
import warnings
from typing import Any

import pytest
import torch
from torch import nn

import cudatimer
from cudatimer import Timer


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.Linear(4, 4)
        self.mlp = nn.Sequential(nn.Linear(4, 4), nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.attn(x))


class Net(nn.Module):
    def __init__(self, blocks: int = 2) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Block() for _ in range(blocks)])
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def names(timer: Timer) -> dict[str, int]:
    return {r.name: r.calls for r in timer.summary().regions}


X = torch.ones(3, 4)


def test_regions_are_named_and_nested_by_module_path() -> None:
    """Each module's region path is its module path (containers joined with '.')."""
    t = Timer(name="paths")
    net = Net()
    handle = cudatimer.instrument(net, timer=t)
    net(X)
    net(X)
    handle.remove()
    assert names(t) == {
        "Net": 2,
        "Net/layers.0": 2,
        "Net/layers.0/attn": 2,
        "Net/layers.0/mlp": 2,
        "Net/layers.0/mlp/0": 2,
        "Net/layers.0/mlp/1": 2,
        "Net/layers.1": 2,
        "Net/layers.1/attn": 2,
        "Net/layers.1/mlp": 2,
        "Net/layers.1/mlp/0": 2,
        "Net/layers.1/mlp/1": 2,
        "Net/head": 2,
    }
    assert handle.regions["layers.1.mlp.0"] == "0"


def test_forward_is_wrapped_without_hooks() -> None:
    """No forward hook is registered, so nn.Module keeps its fast call path."""
    net = Net()
    with cudatimer.instrument(net):
        assert all(not m._forward_hooks and not m._forward_pre_hooks for m in net.modules())
        assert "forward" in net.layers[0].__dict__


@pytest.mark.parametrize(
    ("depth", "expected"),
    [
        (0, {"Net"}),
        (1, {"Net", "Net/layers.0", "Net/layers.1", "Net/head"}),
    ],
)
def test_depth_counts_called_modules_not_containers(depth: int, expected: set[str]) -> None:
    """depth=1 reaches the blocks inside the ModuleList (containers are not levels)."""
    t = Timer(name="depth")
    net = Net()
    with cudatimer.instrument(net, depth=depth, timer=t):
        net(X)
    assert set(names(t)) == expected


def test_include_by_type_and_glob_exclude() -> None:
    """include=nn.Linear keeps Linear layers (full paths, nothing above them); a glob exclude
    leaves a module out but not its children."""
    t = Timer(name="include")
    net = Net(blocks=1)
    with cudatimer.instrument(net, include=nn.Linear, timer=t) as handle:
        net(X)
    assert set(handle.regions) == {"layers.0.attn", "layers.0.mlp.0", "head"}
    assert set(names(t)) == {"layers.0.attn", "layers.0.mlp.0", "head"}
    t.reset()
    with cudatimer.instrument(net, exclude="layers.0.mlp", timer=t):
        net(X)
    assert "Net/layers.0/mlp.0" in names(t)
    assert not any(n.endswith("/mlp") for n in names(t))


def test_include_matching_nothing_is_an_error() -> None:
    """An include that matches no module is a ValueError, not a silent no-op."""
    with pytest.raises(ValueError, match="no module"):
        cudatimer.instrument(Net(), include="nothing.here")


def test_remove_restores_everything_and_is_idempotent() -> None:
    """remove() takes every wrapper away: calls after it are not recorded."""
    t = Timer(name="remove")
    net = Net()
    handle = cudatimer.instrument(net, backward=True, timer=t)
    handle.remove()
    handle.remove()
    assert handle.removed
    assert all("forward" not in m.__dict__ for m in net.modules())
    net(X).sum().backward()
    assert names(t) == {}
    again = cudatimer.instrument(net, timer=t)  # allowed once removed
    again.remove()


def test_instrumenting_twice_is_an_error() -> None:
    """A second instrument() on a live model would nest every region in itself."""
    net = Net()
    with cudatimer.instrument(net), pytest.raises(ValueError, match="already instrumented"):
        cudatimer.instrument(net)


def test_exceptions_close_every_region() -> None:
    """An exception (KeyboardInterrupt too) inside a submodule closes all regions it crossed."""
    t = Timer(name="raise")
    net = Net(blocks=1)

    class Boom(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise KeyboardInterrupt

    net.layers[0].mlp[1] = Boom()
    with cudatimer.instrument(net, timer=t):
        with pytest.raises(KeyboardInterrupt):
            net(X)
        assert len(t.recorder.store.stack()) == 0
    assert names(t)["Net/layers.0/mlp/1"] == 1


def test_deepcopy_of_an_instrumented_model_runs_the_copy() -> None:
    """copy.deepcopy rebinds the wrapped forward to the copy (its own weights)."""
    t = Timer(name="copy")
    net = Net(blocks=1)
    with cudatimer.instrument(net, timer=t):
        twin = copy.deepcopy(net)
        with torch.no_grad():
            twin.head.weight.zero_()
            twin.head.bias.fill_(5.0)
        assert torch.equal(twin(X), torch.full((3, 2), 5.0))
        assert not torch.equal(net(X), twin(X))
    assert names(t)["Net/head"] == 3


def test_existing_forward_wrapper_is_kept_and_restored() -> None:
    """A forward already wrapped on the instance (a decorated module) is wrapped as it is and
    put back by remove()."""
    t = Timer(name="stacked")
    net = t.timed(Net(blocks=1), name="outer")
    before = net.__dict__["forward"]
    with cudatimer.instrument(net, depth=0, timer=t):
        net(X)
    assert net.__dict__["forward"] is before
    assert names(t) == {"Net": 1, "Net/outer": 1}  # the new wrapper goes around the old


def test_forward_replaced_after_instrument_warns_on_remove() -> None:
    """remove() never undoes a forward set by another tool after instrument()."""
    net = Net(blocks=1)
    handle = cudatimer.instrument(net, depth=0)
    theirs = net.forward
    net.forward = lambda x: theirs(x)  # type: ignore[method-assign]
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        handle.remove()
    assert len(got) == 1 and "replaced" in str(got[0].message)
    assert "forward" in net.__dict__


def test_shared_module_is_instrumented_once() -> None:
    """A module reachable by two paths gets one wrapper (its first path)."""
    net = Net(blocks=1)
    net.alias = net.head  # type: ignore[assignment]
    with cudatimer.instrument(net) as handle:
        assert "head" in handle.regions and "alias" not in handle.regions


def test_backward_regions_per_module_with_in_place_ops() -> None:
    """backward=True: one backward row per module under <Model>.backward, mirroring the forward
    tree, with an in-place ReLU after a Linear (which full backward hooks would reject); rows
    stay top-level under a region around loss.backward(); gradients are unchanged."""
    t = Timer(name="backward")
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 4), nn.ReLU(inplace=True), nn.Linear(4, 2))
    x = torch.ones(3, 4, requires_grad=True)
    net(x).sum().backward()
    expected = x.grad.clone()  # type: ignore[union-attr]
    x.grad = None
    with cudatimer.instrument(net, backward=True, timer=t) as handle:
        loss = net(x).sum()
        with t.region("backward"):
            loss.backward()
    rows = {"Sequential.backward", *(f"Sequential.backward/{i}" for i in range(3))}
    assert set(handle.backward_regions.values()) == rows
    got = names(t)
    assert {n: got[n] for n in rows} == dict.fromkeys(rows, 1)
    assert not any(n.startswith("backward/") for n in got)
    assert torch.equal(x.grad, expected)  # type: ignore[arg-type]


def test_backward_rows_of_modules_whose_inputs_need_no_gradient() -> None:
    """A module whose inputs need no gradient still has a backward row (its own autograd
    nodes); a module that makes no node (Identity) has none."""
    t = Timer(name="no-input-grad")
    net = nn.Sequential(nn.Linear(4, 4), nn.Identity(), nn.Linear(4, 2))
    with cudatimer.instrument(net, backward=True, timer=t):
        net(X).sum().backward()
    assert {n for n in names(t) if ".backward" in n} == {
        "Sequential.backward",
        "Sequential.backward/0",
        "Sequential.backward/2",
    }


def test_backward_regions_off_under_no_grad() -> None:
    """Under torch.no_grad no hook is set: no backward regions, forward still timed."""
    t = Timer(name="no-grad")
    net = nn.Sequential(nn.Linear(4, 4))
    with cudatimer.instrument(net, backward=True, timer=t), torch.no_grad():
        net(torch.ones(1, 4, requires_grad=True))
    assert set(names(t)) == {"Sequential", "Sequential/0"}


def test_regions_from_threads_are_exact() -> None:
    """One instrumented model called from 4 threads: exact counts, per-thread nesting."""
    t = Timer(name="threads")
    net = Net(blocks=1)
    barrier = threading.Barrier(4)

    def work() -> None:
        barrier.wait()
        for _ in range(50):
            net(X)

    with cudatimer.instrument(net, timer=t):
        threads = [threading.Thread(target=work) for _ in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    got = names(t)
    assert got["Net"] == 200 and got["Net/layers.0/mlp/1"] == 200 and len(got) == 7


def test_user_regions_inside_forward_nest_under_the_module() -> None:
    """A region opened inside an instrumented forward nests under the module's region."""
    t = Timer(name="inner")

    class Inner(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            with t.region("custom"):
                return x + 1

    net = nn.Sequential(Inner())
    with cudatimer.instrument(net, timer=t):
        net(X)
    assert names(t) == {"Sequential": 1, "Sequential/0": 1, "Sequential/0/custom": 1}


def test_default_timer_and_repr() -> None:
    """Without timer=, regions go to the default Timer; the handle says what it holds."""
    net = nn.Sequential(nn.Linear(4, 4))
    handle = cudatimer.instrument(net)
    net(X)
    assert "2 modules" in repr(handle) and len(handle) == 2
    handle.remove()
    assert "removed" in repr(handle)
    assert cudatimer.summary().names == ("Sequential", "Sequential/0")


def test_scripted_submodules_are_left_alone() -> None:
    """A TorchScript submodule is not wrapped (its forward cannot be replaced)."""
    scripted: Any = torch.jit.script(nn.Linear(4, 4))
    net = nn.Sequential(nn.Linear(4, 4), scripted)
    with cudatimer.instrument(net) as handle:
        net(X)
    assert set(handle.regions) == {"", "0"}


def test_env_disable_leaves_instrumented_modules_as_they_are() -> None:
    """Under CUDATIMER_DISABLE=1, instrument() (backward too) wraps nothing and records nothing."""
    from tests.helpers.subproc import run_python

    code = (
        "import torch, cudatimer\n"
        "m = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())\n"
        "with cudatimer.instrument(m, backward=True):\n"
        "    assert 'forward' not in vars(m) and 'forward' not in vars(m[0])\n"
        "    m(torch.ones(1, 2, requires_grad=True)).sum().backward()\n"
        "assert cudatimer.summary().regions == ()\n"
        "print('ok')\n"
    )
    out = run_python(code, {"CUDATIMER_DISABLE": "1"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
