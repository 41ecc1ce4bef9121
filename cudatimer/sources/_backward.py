"""Backward rows: the autograd work of a module call or a region, timed as a detached region
at a fixed place in the tree.

What "the backward of a call" means: the autograd nodes created on the calling thread while
the call ran (torch numbers nodes per thread in creation order, ``_get_sequence_nr``). Its row
opens when the engine is about to run the node that made the call's output (one pre-hook on
that node), and closes when a hooked node created *before* the call starts, or when the
backward pass (graph task) ends. The engine runs ready nodes latest-created first, so in a
chain of layers the next hooked node is the one that made the call's input: the row brackets
the call's own nodes. Work of another branch created before the call that the engine runs
while the call's nodes still run (parallel branches) closes the row early; the row is
approximate, never wrong about gradients (hooks return None: gradients are untouched).

Cost (the CPU machine, benchmarks/backward_cost.py): per call one sequence read (0.08 us), one
``grad_fn`` read (0.35 us) and, for an output node not hooked yet, one ``register_prehook``
(3.9 us, torch's Python handle); nested modules returning the same tensor share the node's
hook. No per-call closure: a hook is a small object with the calls it opens.
"""

from __future__ import annotations

import bisect
import itertools
import math
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch

from ..core import _core, _device
from ..core._locks import fork_safe_lock
from . import _compile
from ._compile import tensors_in
from ._source import TIMERS, Host

__all__ = ["BackwardRows", "Site", "hooking", "seq_now", "watch"]

# The next node number of this thread (torch 2.x). Without it every row closes at the end of
# its backward pass: 0 is before every node.
seq_now: Callable[[], int] = getattr(torch._C._autograd, "_get_sequence_nr", lambda: 0)
_task_id: Callable[[], int] = getattr(torch._C, "_current_graph_task_id", lambda: 0)
_queue_callback = torch.autograd.Variable._execution_engine.queue_callback
_grad_enabled = torch.is_grad_enabled
_is_compiling: Callable[[], bool] = getattr(
    getattr(torch, "compiler", None), "is_compiling", lambda: False
)
_dynamo_compiling: Callable[[], bool] = getattr(
    getattr(torch, "compiler", None), "is_dynamo_compiling", _is_compiling
)
_now = _core.now_ns
_NAN = math.nan
# Output tensors looked at for the node to hook (nested tuples, lists, dicts).
_MAX_OUTPUTS = 8
# Nodes a region's graph walk visits at most (each ~0.3 us on the CPU machine).
_MAX_WALK = 256


class BackwardRows:
    """This source's state for one recorder (``Recorder.backward``): the slots of its rows'
    fixed paths, and its sites as compiled code numbers them (``Source``)."""

    __slots__ = ("_lock", "host", "sites")

    def __init__(self, host: Host) -> None:
        self.host = host
        # A site's number in compiled code -> the site. Never cleared: a module hooked before
        # a reset() keeps its number, and Dynamo may trace it again after.
        self.sites: list[Site] = []
        self._lock = fork_safe_lock()

    def slot(self, path: tuple[str, ...]) -> int:
        """The slot of the fixed path ``path`` from the tree's root (made if new)."""
        tree = self.host.tree
        while True:
            try:
                slot = -1
                for name in path:
                    slot = tree.child(slot, name)
                return slot
            except KeyError:  # another thread's reset() pruned a parent just made: again
                continue

    def number(self, site: Site) -> int:
        """``site``'s number among this recorder's sites (compiled code carries it)."""
        with self._lock:
            self.sites.append(site)
            return len(self.sites) - 1

    # -- Source ---------------------------------------------------------------------------
    def drain(self, timeout_s: float) -> None:
        """Nothing to fold: a row records into the store when it closes."""

    def pending(self) -> int:
        return 0

    def notes(self) -> tuple[tuple[str, str], ...]:
        return ()

    def reset(self) -> None:
        """Nothing: each site keeps its slot with the generation it was taken under."""


class Site:
    """One backward row: the region that records it and its fixed path from the tree's root
    (``("Net.backward", "layers.0", "attn")``). ``open()`` opens a row (its token) and
    ``close(token)`` ends it; a region with probes (``memory=True``) measures them.

    ``counter``, ``every``: the row of one call in ``every`` is timed (the region's
    ``every=N``), decided when the call runs forward (``sampled()``): the other calls hook
    nothing, and are counted (``skip()``) as an ``every=N`` region counts its untimed calls."""

    __slots__ = (
        "close",
        "counter",
        "every",
        "host",
        "open",
        "path",
        "rec",
        "region",
        "rows",
        "slot",
        "store",
    )

    def __init__(
        self, region: Any, path: tuple[str, ...], counter: Any = None, every: int = 1
    ) -> None:
        self.region = region
        self.path = path
        self.rec = region.timer.recorder
        self.rows: BackwardRows = self.rec.backward
        self.store = self.rec.store
        self.every = every
        self.counter = counter if every > 1 else None
        # (generation, slot) of the fixed path: the slot as of the store's generation it was
        # taken under (a reset() prunes the tree and bumps the generation). One tuple, so a
        # thread never reads one generation's slot with another's number.
        self.slot = (-1, -1)
        # A timed row with nothing but its time: no NVTX range, no sampling in the recorder,
        # no probes (they measure around the general path's frames).
        probes = getattr(region, "probes", ())
        self.host = region.timing and not region.nvtx and region.counter is None and not probes
        self.open: Callable[[], Any] = self._open
        self.close: Callable[[Any], None] = self._close
        for probe in probes:
            self.open, self.close = probe.detached(region, self.open, self.close)

    def sampled(self) -> bool:
        """Whether this call's row is timed (always, but under ``every=N``)."""
        return self.counter is None or next(self.counter) % self.every == 0

    def skip(self) -> None:
        """Count a call whose row is not timed (``every=N``), on the clock a row would be."""
        store = self.store
        if store.enabled and not _is_compiling():
            gen = store.gen
            store.count(self._slot(gen), gen, _device.clock_now(self.region.events))

    def _slot(self, gen: int) -> int:
        cached = self.slot
        if cached[0] == gen:
            return int(cached[1])
        slot = self.rows.slot(self.path)
        self.slot = (gen, slot)
        return slot

    def _open(self) -> Any:
        """Open a row at the fixed path, whatever is open on this thread (autograd's threads
        have nothing open, the CPU's caller has the region around ``loss.backward()``); its
        token (None: nothing to close). The core's common case in one call; a row of the
        host clock as (slot, generation, start ns); else the recorder's general path."""
        store = self.store
        if not store.enabled or _is_compiling():
            return None
        gen = store.gen  # before the slot (see Recorder.reset)
        cached = self.slot
        slot = cached[1] if cached[0] == gen else self._slot(gen)
        region = self.region
        frame = region.open_at(slot, gen)
        if frame is not None:
            return frame
        if self.host and not (region.events and _device.usable()):
            # What the general path's host-clock frame holds, without the frame: on the CPU
            # machine a row's open and close took 2.4 us through the general path.
            return (slot, gen, _now())
        return self.rec.detached(region, store.stack(), slot, gen)

    def _close(self, token: Any) -> None:
        if type(token) is tuple:
            slot, gen, t0_ns = token
            t1_ns = _now()
            store = self.store
            tid = store.stack().tid
            store.record(
                slot, gen, -1, _NAN, (t1_ns - t0_ns) * 1e-6, store.step, t0_ns, tid, _NAN, 0, False
            )
        elif token is not None and not self.region.close(token):
            self.rec.end(self.region, token)


class _Hook:
    """The pre-hook on one autograd node: the calls whose output the node made, each as
    (first node number of the call, site), innermost call first. ``thread``: the forward
    thread that made the node (node numbers count per thread)."""

    __slots__ = ("calls", "seq", "thread")
    # torch.save of a hooked output tensor warns about each hook it cannot save but these.
    __torch_unserializable__ = True

    def __init__(self, seq: int, thread: int, calls: list[tuple[int, Site]]) -> None:
        self.seq = seq
        self.thread = thread
        self.calls = calls

    def __call__(self, grads: Any) -> None:
        _fire(self.seq, self.calls)


class _Pass:
    """One backward pass's open rows, oldest first, as (first node number, site, token):
    ``rows`` those of eager calls, ``marked`` those of compiled code's calls, numbered by
    trace order instead (``_Call``: the two numberings never close each other's rows)."""

    __slots__ = ("marked", "rows")

    def __init__(self) -> None:
        self.rows: list[tuple[int, Site, Any]] = []
        self.marked: list[tuple[int, Site, Any]] = []


# Graph task id -> its pass. Per task, not per thread: a pass may run nodes on several
# threads (CPU and each device) and ends, with its final callbacks, on whichever finishes it;
# a reentrant pass (checkpointing) is a task of its own, so its rows never close the outer
# pass's.
_OPEN: dict[int, _Pass] = {}
# The hook set last: nested modules return the same tensor, so their calls share its node.
# Matched on (node number, thread), without keeping the node (and its graph) alive: not on
# id(node), as torch 2.11 makes a new Python object for each ``grad_fn`` read of a C++ node.
_last: _Hook | None = None
_thread_id = threading.get_ident
# The key of a hook in an output tensor's hook dict: torch keys its own by int handle ids
# (RemovableHandle.remove() deletes only those).
_KEY = "cudatimer.backward"


def _first(row: tuple[int, Site, Any]) -> int:
    return row[0]


def _fire(seq: int, calls: list[tuple[int, Site]], marked: bool = False) -> None:
    """Close the open rows (of compiled code's calls if ``marked``) whose calls began after
    ``seq``, then open ``calls``' rows."""
    task = _task_id()
    p = _OPEN.get(task)
    if p is None:
        p = _OPEN[task] = _Pass()
        _queue_callback(_PassEnd(task))  # once per backward pass
    rows = p.marked if marked else p.rows
    # Rows whose calls began after this node was made are over.
    while rows and rows[-1][0] > seq:
        _, site, token = rows.pop()
        site.close(token)
    for i in range(len(calls) - 1, -1, -1):  # outermost call first
        first, site = calls[i]
        token = site.open()
        row = (first, site, token)
        if rows and rows[-1][0] > first:
            # An outer call's row opening after an inner one's: their calls returned the
            # same node through two hooks (another call's hook was set between them). The
            # open rows stay ordered by first node, outermost first, so the next node closes
            # exactly the rows of calls that began after it was made.
            bisect.insort_left(rows, row, key=_first)
        else:
            rows.append(row)


class _PassEnd:
    """The end of one backward pass: called by autograd once the pass is done, or, when a
    node raised and the pass was dropped without its final callbacks, when autograd lets go
    of it. Either way the pass's open rows end (a failed pass's rows time what ran until
    the error) instead of staying open forever."""

    __slots__ = ("done", "task")

    def __init__(self, task: int) -> None:
        self.task = task
        self.done = False

    def __call__(self) -> None:
        self.done = True
        _flush(self.task)

    def __del__(self) -> None:
        if not self.done:
            _flush(self.task)


def _flush(task: int) -> None:
    """End of a backward pass: close what it left open, innermost first."""
    p = _OPEN.pop(task, None)
    if p is not None:
        for rows in (p.rows, p.marked):
            while rows:
                _, site, token = rows.pop()
                site.close(token)


def _newest(t: torch.Tensor, found: list[torch.Tensor]) -> bool:
    return t.grad_fn is not None


def watch(out: Any, first: int, site: Site, bounded: bool = False) -> None:
    """Time the backward of a call that began at node number ``first`` and returned
    ``out``: hook the node that made its newest output tensor (it runs first).

    ``bounded``: also hook the nodes the call's own nodes feed that were made before it (its
    inputs' producers, leaf inputs' accumulators), found by walking the call's graph, so the
    row closes where its gradient leaves the call even when no other row's node follows
    (regions: a module's row is closed by its neighbour's node instead, which costs nothing).
    """
    global _last
    # The tensor whose hook dict takes the hook (an exact torch.Tensor: a subclass may
    # redirect attribute access through __torch_function__); None: a pre-hook on the node.
    tensor: torch.Tensor | None
    if type(out) is torch.Tensor:
        node = out.grad_fn
        if node is None:
            return
        seq = node._sequence_nr()
        tensor = out
    else:
        found: list[torch.Tensor] = []
        tensors_in(out, found, _MAX_OUTPUTS, _newest)
        if not found:
            return
        node, seq, tensor = None, -1, None
        for t in found:
            n = t.grad_fn
            s = n._sequence_nr()  # type: ignore[union-attr]
            if s > seq:
                node, seq, tensor = n, s, t
        if type(tensor) is not torch.Tensor:
            tensor = None
    if seq < first:  # the call made no node (identity, or an output made before it)
        return
    last = _last
    thread = _thread_id()
    if last is not None and last.seq == seq and last.thread == thread:
        last.calls.append((first, site))
        return
    hook = _Hook(seq, thread, [(first, site)])
    if tensor is not None and tensor._backward_hooks is None:
        # As Tensor.register_hook does it, without its RemovableHandle: the tensor's hook
        # dict, registered on its node, runs right before the node as a pre-hook would.
        # On the CPU machine 0.55 us a hook against 1.8 us for register_prehook, and 0.1 us
        # less when it runs (benchmarks/backward_cost.py). An in-place op on the tensor
        # later gives it a new node and no dict (torch drops it): the hook stays on the node
        # that made the call's output, and a hook the user registers then goes to the new
        # node, as without cudatimer.
        hooks: OrderedDict[Any, Any] = OrderedDict()  # torch's handles weakref it
        hooks[_KEY] = hook
        tensor._backward_hooks = hooks
        node._register_hook_dict(tensor)  # type: ignore[union-attr]
    else:
        node.register_prehook(hook)  # type: ignore[union-attr]
    _last = hook
    if bounded:
        # Closing rows that began after first - 1: this call's and any opened inside it.
        for edge in _edges(node, first):
            edge.register_prehook(_Hook(first - 1, thread, []))


def _edges(node: Any, first: int) -> list[Any]:
    """The nodes outside a call (made before node number ``first``, or accumulators) that
    its nodes, reachable from ``node``, send gradients to; the walk stops after _MAX_WALK
    nodes (a call that made more closes late where an edge was not found)."""
    found: list[Any] = []
    seen = {id(node)}
    todo = [node]
    while todo and len(seen) < _MAX_WALK:
        for nxt, _ in todo.pop().next_functions:
            if nxt is None or id(nxt) in seen:
                continue
            seen.add(id(nxt))
            if nxt._sequence_nr() < first or not nxt.next_functions:
                found.append(nxt)  # made before the call, or a leaf's accumulator
            else:
                todo.append(nxt)
    return found


# -- compiled code ---------------------------------------------------------------------------
#
# Inside code Dynamo traces there are no nodes to hook: the compiled backward is one autograd
# node for the whole graph. Instead a call's tensor outputs pass through ``_Boundary``, an
# identity autograd Function whose backward puts the call's mark into the backward graph that
# AOTAutograd traces, after the work that makes the outputs' gradients. AOTAutograd threads a
# backward effect token through the marks, so they run in the order the traced backward
# called them (the order autograd would run the call's nodes), and Inductor puts the kernels
# that make a mark's gradients before it. The mark does what an eager hook does: closes the
# rows of calls that began after this call ended, opens this call's row. Calls are numbered by
# a counter that runs while Dynamo traces (``_tick``), in the order they begin.
#
# No mark on a call's inputs: one closing the row where the inputs' gradients are made would
# depend on a partial gradient (a residual's other part is added later) and keep Inductor from
# folding that sum into the matmul that makes it (addmm), which changed the gradients in the
# last bits (3e-8 on an MLP, torch 2.13 CPU). A mark on the outputs depends on their whole
# gradients, which the graph computes anyway.

_ticks = itertools.count()


class _Call:
    """One call traced into compiled code, as its mark's kernel sees it: ``__enter__`` opens
    its row (after closing those of calls that began after ``last``). Numbers fixed when it
    was traced, no state of a run: the same graph may run on several threads at once, or
    inside itself, the open rows being per backward pass (``_MARKED``)."""

    __slots__ = ("calls", "compiled", "last")

    def __init__(self, site: Site, first: int, last: int) -> None:
        self.calls = [(first, site)]
        self.last = last
        self.compiled = False

    def __enter__(self) -> None:
        if _task_id() >= 0:  # else no backward pass (compiled autograd) to close the row at
            _fire(self.last, self.calls, True)

    def __exit__(self, *exc: object) -> None:
        """Never marked (a row ends at the next call's mark or the pass end)."""


@_compile.constant
def _tick() -> int:
    """The next call number (run while Dynamo traces; a constant in the graph)."""
    return next(_ticks)


@_compile.constant
def _call_key(site: str, first: int) -> int:
    """The mark key of a call of the site numbered ``site`` ("timer.site": its Timer's
    ``compile_key`` and its number there) that began at ``first`` and ends now. A str: under
    ``dynamic=True`` Dynamo makes an int read from a closure a symbol, which a constant
    function refuses (torch 2.13)."""
    timer, number = site.split(".")
    owner = TIMERS.get(int(timer))  # alive: its module is being traced
    assert owner is not None
    return _compile.key_of(_Call(owner.recorder.backward.sites[int(number)], first, next(_ticks)))


class _Boundary(torch.autograd.Function):
    """Identity on a call's output tensors whose backward marks the call (``key``), after the
    work that makes their gradients.

    Its outputs are clones, not the tensors themselves: an output that is an input returned
    as is, or a view of it, may not be modified in place (autograd forbids it: "a view created
    inside a custom Function"), and callers do that to what a module returns
    (``out += identity``, ``ReLU(inplace=True)``). Inductor drops each clone (its
    ``remove_noop_ops`` pass) unless that would make two graph outputs share memory; the
    aot_eager backend runs them."""

    @staticmethod
    def forward(ctx: Any, key: int, *tensors: torch.Tensor) -> Any:
        ctx.key = key
        return tuple(t.clone() for t in tensors)

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:
        _compile.enter_mark(ctx.key, [g for g in grads if g is not None])
        return (None, *grads)


def _needs_grad(obj: Any) -> bool:
    return isinstance(obj, torch.Tensor) and obj.requires_grad


def _through(site: str, first: int, tensors: list[Any]) -> tuple[torch.Tensor, ...]:
    key = _call_key(site, first)
    out: tuple[torch.Tensor, ...] = _Boundary.apply(key, *tensors)  # type: ignore[no-untyped-call]
    return out


def _marked(site: str, first: int, out: Any) -> Any:
    """``out`` with its tensors that need a gradient passed through one ``_Boundary``: a
    tensor, or the tensors directly in a tuple (a namedtuple too), list or dict; other
    results are returned as they are (the call has no row in compiled code)."""
    if isinstance(out, torch.Tensor):
        return _through(site, first, [out])[0] if out.requires_grad else out
    items: Any
    if type(out) is dict:
        items = dict(out)
        keys: list[Any] = [k for k, v in out.items() if _needs_grad(v)]
    elif type(out) in (tuple, list) or (isinstance(out, tuple) and hasattr(out, "_fields")):
        items = list(out)
        keys = [i for i, v in enumerate(out) if _needs_grad(v)]
    else:
        return out
    if not keys:
        return out
    for k, moved in zip(keys, _through(site, first, [items[k] for k in keys]), strict=True):
        items[k] = moved
    if type(out) in (dict, list):
        return items
    return tuple(items) if type(out) is tuple else type(out)(*items)


def _compiled_call(forward: Callable[..., Any], site: str, args: Any, kwargs: Any) -> Any:
    """A call inlined into code Dynamo traces: its outputs through its mark (under grad mode,
    on a torch whose backward graph keeps the marks' order), else a plain call."""
    if not site or not _grad_enabled() or not _compile.marks_in_backward():
        return forward(*args, **kwargs)
    first = _tick()
    return _marked(site, first, forward(*args, **kwargs))


def hooking(forward: Callable[..., Any], site: Site, bounded: bool = False) -> Callable[..., Any]:
    """``forward`` that times its backward as ``site`` (under grad mode, Timer on);
    ``bounded`` as in ``watch``."""
    store = site.store
    # The site's number in compiled code ("": no marks on this torch, or CUDATIMER_COMPILE=0).
    number = ""
    if _compile.SUPPORTED:
        number = f"{site.region.timer.compile_key}.{site.rows.number(site)}"

    def forward_timing_backward(*args: Any, **kwargs: Any) -> Any:
        if _dynamo_compiling():
            return _compiled_call(forward, number, args, kwargs)
        if not (_grad_enabled() and store.enabled) or _is_compiling():
            return forward(*args, **kwargs)
        first = seq_now()
        out = forward(*args, **kwargs)
        if site.counter is None or site.sampled():
            watch(out, first, site, bounded)
        else:
            site.skip()
        return out

    return forward_timing_backward
