"""Regions inside ``torch.compile``d code: the compiled-graph boundary source.

While Dynamo traces, a region becomes two custom ops, ``cudatimer::enter(key, deps)`` and
``cudatimer::exit(key, deps)`` (an overload per count of tensor dependencies: ``.none``,
``.one``, ``.two``, and the list), registered as ordered side effects: Dynamo keeps them with
``fullgraph=True`` and adds no graph break, AOTAutograd threads an effect token through them so
they stay in program order, and Inductor calls them from its generated code. Their bodies run
the region's own ``__enter__``/``__exit__`` when the compiled code runs, so a compiled region
records what an eager one does (events on the current stream, the NVTX range, the thread's
stack) and nests under whatever region is open when the compiled call runs.

Order against the compiled work comes from data: Inductor schedules by dependencies, and with
none it ran every mark before the first kernel (measured, torch 2.13 CPU). A decorated
function's or module's marks therefore take the call's tensor arguments (``enter``: the work
that produces them runs before it) and the tensors it returns (``exit``: nothing the call
computes runs after it); Inductor kept the call's kernels between them, in program order. Work
it fuses across a boundary (a pointwise op of the next region folded into this region's kernel)
is timed in the region whose kernel runs it. A ``with`` block has no declared inputs or
outputs: its marks keep their order among the other marks, and Inductor may move the block's
kernels across them (decorate a function for exact boundaries).

Inside a CUDA graph capture (``mode="reduce-overhead"``) the bodies run during warm-up and
capture, never on replay: a region entered while its stream captures puts device timestamps
into the graph (``_capture``), and each replay is timed by them, as in eager code.

Where the mechanism is missing (a torch without ``torch.library.custom_op`` or ordered effects)
or switched off (``CUDATIMER_COMPILE=0``), regions inside compiled code do nothing, as before,
and each Timer's report says once how many regions were traced into compiled code untimed.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable
from typing import Any, TypeVar, cast

import torch

from .._config import env_flag
from ._source import TIMERS

__all__ = [
    "REASON",
    "SUPPORTED",
    "CompileNotes",
    "block",
    "call",
    "constant",
    "enter_mark",
    "key_of",
    "marks_in_backward",
    "tensors_in",
]

# key -> Region; a region traced into compiled code stays alive as long as the code may run.
_REGIONS: list[Any] = []
# key -> the region's bound __enter__ and __exit__: the ops' kernels call them straight (one
# list index and a call, no attribute lookup on the region).
_ENTERS: list[Callable[[], Any]] = []
_EXITS: list[Callable[[Any, Any, Any], Any]] = []
_KEYS: dict[int, int] = {}  # id(region) -> key
_lock = threading.Lock()
_MAX_DEPS = 16  # tensors a mark depends on (a few levels into tuples, lists and dicts)


def key_of(region: Any) -> int:
    """The key the marks of ``region`` carry (assigned once: when a callable is decorated
    with it, or when Dynamo first traces it in a ``with`` block)."""
    key = _KEYS.get(id(region))
    if key is None:
        with _lock:
            key = _KEYS.get(id(region))
            if key is None:
                key = len(_REGIONS)
                region.compiled = True  # its frames may be left open by compiled code
                _ENTERS.append(region.__enter__)
                _EXITS.append(region.__exit__)
                _REGIONS.append(region)
                _KEYS[id(region)] = key
    return key


class CompileNotes:
    """This source's state for one recorder: the regions traced into compiled code while the
    marks are missing or switched off, which compiled code leaves untimed."""

    __slots__ = ("left_out",)

    def __init__(self) -> None:
        self.left_out = 0

    def drain(self, timeout_s: float) -> None:
        """Nothing to fold: a compiled region's marks record through its own enter and exit."""

    def pending(self) -> int:
        return 0

    def notes(self) -> tuple[tuple[str, str], ...]:
        if not self.left_out:
            return ()
        return (
            (
                "compile_note",
                f"{self.left_out} region(s) traced into torch.compile'd code are not timed "
                f"there ({REASON}); they time the calls that run eagerly",
            ),
        )

    def reset(self) -> None:
        self.left_out = 0


def _enter_body(key: int, *deps: Any) -> None:
    """Every enter overload's kernel (``deps``: none, one or two tensors, or one list)."""
    _ENTERS[key]()


def _exit_body(key: int, *deps: Any) -> None:
    _EXITS[key](None, None, None)


def _no_op(key: int, *deps: Any) -> None:
    """The ops' fake kernel: tracing with fake tensors records nothing."""


def _order(op: Any) -> bool:
    """Register ``op`` as an ordered side effect, by whichever API this torch has (it moved
    between versions); False when none is there."""
    try:
        from torch._higher_order_ops import effects
    except ImportError:
        return False
    kind = getattr(getattr(effects, "EffectType", None), "ORDERED", None)
    if kind is None:
        return False
    for register in (
        getattr(effects, "_register_effectful_op", None),
        getattr(torch.library, "_register_effectful_op", None),
    ):
        if register is not None:
            try:
                register(op, kind)
                return True
            except Exception:  # another signature on this torch: try the next API
                continue
    table = getattr(effects, "SIDE_EFFECTS", None)
    if isinstance(table, dict):
        table[op] = kind
        return True
    return False


# The ops are defined with torch.library.Library and a plain Python kernel, not with
# torch.library.custom_op: its Python layers (autograd wrapper, dispatch helpers) cost ~25 us a
# call against ~4.5 us for the bare dispatcher hop into a Python kernel (CPU machine, one mark
# with a tensor in ``deps``; the region's own enter and exit take ~3.6 us beside it).
# The schema's tensor arguments cost as well, and a list most: a bare hop into a Python kernel
# took 1.7 us with only the int, 2.0 us with one Tensor, 2.3 us with two, 2.4 us with an empty
# Tensor[] and 2.75 us with a list of one or two (CPU machine, min of 80 rounds). So each op has
# an overload per common count of dependencies (a ``with`` block: none; a module's forward:
# mostly one input and one output) and the list for the rest. The enter mark needs its
# dependencies: without them Inductor ran a matmul that precedes a region after the region's
# enter mark (tests/test_compile.py pins the order down).
_OVERLOADS = (
    ("none", "(int key) -> ()"),
    ("one", "(int key, Tensor a) -> ()"),
    ("two", "(int key, Tensor a, Tensor b) -> ()"),
    ("default", "(int key, Tensor[] deps) -> ()"),
)
_library: Any = None  # the Library must live as long as its ops


def _define() -> tuple[Any, Any, str]:
    """The enter and exit ops (each a tuple of the overloads, in ``_OVERLOADS``' order), or
    (None, None, why not)."""
    global _library
    if not env_flag("CUDATIMER_COMPILE", default=True):
        return None, None, "CUDATIMER_COMPILE=0 is set"
    register_fake = getattr(torch.library, "register_fake", None) or getattr(
        torch.library, "impl_abstract", None
    )
    if register_fake is None:
        return None, None, f"torch {torch.__version__} has no torch.library.register_fake"
    try:
        library: Any = torch.library.Library  # untyped in torch's stubs
        lib = library("cudatimer", "DEF")
        for name, body in (("enter", _enter_body), ("exit", _exit_body)):
            for overload, schema in _OVERLOADS:
                full = name if overload == "default" else f"{name}.{overload}"
                lib.define(full + schema)
                # Every backend, one kernel; no autograd formula is needed: the ops return
                # nothing.
                lib.impl(full, body, "CompositeExplicitAutograd")
                register_fake("cudatimer::" + full, _no_op, lib=lib)
    except Exception as e:  # an older torch.library: the fallback, with the reason
        return None, None, f"torch {torch.__version__} could not define the marks ({e})"
    _library = lib
    ops = tuple(
        tuple(getattr(getattr(torch.ops.cudatimer, name), overload) for overload, _ in _OVERLOADS)
        for name in ("enter", "exit")
    )
    if not all(_order(op) for op in ops[0] + ops[1]):
        return None, None, f"torch {torch.__version__} has no ordered custom-op effects"
    return ops[0], ops[1], ""


_ENTER, _EXIT, REASON = _define()
#: True when regions inside compiled code are timed (else ``REASON`` says why not).
SUPPORTED: bool = _ENTER is not None

# Inductor's generated Python calls a fallback op as ``torch.ops.cudatimer.enter.one(key, t)``:
# an OpOverload call, the dispatcher (schema checks, dispatch keys, IValues there and back) and
# then the Python kernel. Only the kernel's work is needed when the compiled code runs, so a
# lowering of each mark keeps Inductor's node (its order, its dependencies, its effect token)
# and makes the line it writes call the kernel straight, under these two names. The hop cost
# 3.6 us a mark on the H200 host, 1.6 us on the CPU machine (docs/benchmarks.md, torch.compile).
# The C++ wrapper (``cpp_wrapper``), AOTInductor and the FX wrapper keep calling the op.
_KERNEL_NAMES = {"enter": "run_enter", "exit": "run_exit"}
if SUPPORTED:
    for _name, _body in (("enter", _enter_body), ("exit", _exit_body)):
        # Set even where no lowering is registered: code Inductor cached on disk by a process
        # that had the lowering calls these names.
        setattr(torch.ops.cudatimer, _KERNEL_NAMES[_name], _body)
_lowered = False
# CUDATIMER_COMPILE_DIRECT=0 keeps the marks dispatcher calls (the lowering uses Inductor's
# internals; this is the way around it, should a torch change them).
_DIRECT = env_flag("CUDATIMER_COMPILE_DIRECT", default=True)


def _python_call(graph: Any) -> bool:
    """Whether the graph being lowered writes its calls in Python (the default wrapper)."""
    return not getattr(graph, "cpp_wrapper", True) and not getattr(graph, "fx_wrapper", False)


def _install_lowering() -> bool:
    """Register the marks' lowering with Inductor, once, if Inductor is loaded (it is by the
    time Dynamo traces for it: ``torch.compile`` imports the package); False where this
    torch's Inductor lacks what the lowering uses (the marks then stay dispatcher calls)."""
    global _lowered
    if _lowered or not SUPPORTED or not _DIRECT:
        return _lowered
    if "torch._inductor" not in sys.modules:  # no Inductor in this process yet
        return False
    try:
        # Not loaded yet at trace time, in some processes: Inductor loads it when it lowers.
        from torch._inductor import ir, lowering
        from torch._inductor.virtualized import V

        register = lowering.register_lowering
        fallback = ir.FallbackKernel
        for name, ops in (("enter", _ENTER), ("exit", _EXIT)):
            assert ops is not None
            target = f"torch.ops.cudatimer.{_KERNEL_NAMES[name]}"
            for op in ops:
                if op in lowering.lowerings:
                    continue

                def lower(*args: Any, _op: Any = op, _target: str = target, **kw: Any) -> Any:
                    graph = V.graph
                    first = len(graph.operations)
                    out = fallback.create(_op, *args, **kw)
                    if _python_call(graph):
                        for node in graph.operations[first:]:
                            if isinstance(node, fallback) and node.op_overload is _op:
                                node.python_kernel_name = _target
                    return out

                register(op, type_promotion_kind=None)(lower)
    except Exception:  # another Inductor: the marks stay dispatcher calls
        return False
    _lowered = True
    return True


def tensors_in(
    obj: Any,
    found: list[torch.Tensor],
    most: int,
    keep: Callable[[torch.Tensor, list[torch.Tensor]], bool],
    depth: int = 0,
) -> None:
    """Append to ``found`` the tensors of ``obj`` (a few levels into tuples, lists and dict
    values) that ``keep(tensor, found)`` accepts, up to ``most`` of them. Plain recursion:
    Dynamo inlines it where a decorated call is traced (torch 2.11 and 2.13 alike)."""
    if len(found) >= most:
        return
    if isinstance(obj, torch.Tensor):
        if keep(obj, found):
            found.append(obj)
    elif depth < 3:
        if isinstance(obj, (tuple, list)):
            for item in obj:
                tensors_in(item, found, most, keep, depth + 1)
        elif isinstance(obj, dict):
            for item in obj.values():
                tensors_in(item, found, most, keep, depth + 1)


def _any(t: torch.Tensor, found: list[torch.Tensor]) -> bool:
    return True


def _mark(ops: Any, key: int, deps: list[torch.Tensor]) -> None:
    """Put the mark ``ops`` (``_ENTER`` or ``_EXIT``) for ``key`` into the traced graph, by the
    overload for the number of ``deps`` (a constant while Dynamo traces: one branch is kept)."""
    _lowering()
    n = len(deps)
    if n == 0:
        ops[0](key)
    elif n == 1:
        ops[1](key, deps[0])
    elif n == 2:
        ops[2](key, deps[0], deps[1])
    else:
        ops[3](key, deps)


def enter_mark(key: int, deps: list[torch.Tensor]) -> None:
    """The enter mark of ``key`` (any object with ``__enter__``/``__exit__`` that ``key_of``
    numbered) into the graph being traced, after the work that makes ``deps``."""
    _mark(_ENTER, key, deps)


_F = TypeVar("_F", bound=Callable[..., int])


def _constant(fn: _F) -> _F:
    """``torch.compiler.assume_constant_result``: Dynamo runs ``fn`` for real while it traces
    and puts the result in the graph as a constant (no guard on what it read), so a key lookup
    costs nothing at run time and adds no recompile. That function imports torch._dynamo
    (1.7 s on the CPU machine) to set one attribute; before Dynamo is imported it is set here,
    so that importing cudatimer stays cheap (tests/test_compile.py checks torch still marks
    functions so)."""
    if "torch._dynamo" in sys.modules:
        mark: Any = torch.compiler.assume_constant_result  # untyped in torch's stubs
        return cast(_F, mark(fn))
    fn._dynamo_marked_constant = True  # type: ignore[attr-defined]
    return fn


@_constant
def _lowering() -> int:
    """Run for real while Dynamo traces a mark (folded to a constant): the lowering is in
    place before Inductor lowers the graph."""
    return int(_install_lowering())


class _Marks:
    """A region as Dynamo sees it inside a ``with`` block: the two marks, nothing else."""

    def __init__(self, key: int) -> None:
        self.key = key

    def __enter__(self) -> _Marks:
        _mark(_ENTER, self.key, [])
        return self

    def __exit__(self, *exc: object) -> None:
        _mark(_EXIT, self.key, [])


@_constant
def _block_key(timer: int, name: str, options: tuple[tuple[str, Any], ...]) -> int:
    owner = TIMERS.get(timer)  # alive: its region() is being traced
    assert owner is not None
    return key_of(owner.region(name, **dict(options)))


#: ``_constant`` for the rest of the package.
constant = _constant


@_constant
def marks_in_backward() -> int:
    """1 where AOTAutograd threads effect tokens through the backward graph too (its
    ``num_backward_tokens``; torch 2.13 has it), so marks called from an autograd Function's
    backward stay in order there; else 0. Run once per trace, folded to a constant."""
    if not SUPPORTED:
        return 0
    try:
        from torch._functorch._aot_autograd.schemas import ViewAndMutationMeta
    except ImportError:
        return 0
    return int("num_backward_tokens" in getattr(ViewAndMutationMeta, "__dataclass_fields__", {}))


@_constant
def _note_left_out(timer: int) -> int:
    owner = TIMERS.get(timer)
    if owner is not None:
        owner.recorder.compiled.left_out += 1
    return 0


def block(timer: int, name: str, options: dict[str, Any]) -> Any:
    """What ``timer.region(name, **options)`` returns while Dynamo traces (``timer``: its
    number in ``TIMERS``, ``Timer.compile_key``)."""
    if not SUPPORTED:
        _note_left_out(timer)
        return contextlib.nullcontext()
    return _Marks(_block_key(timer, name, tuple(options.items())))


def call(key: int, timer: int, fn: Callable[..., Any], args: Any, kwargs: Any) -> Any:
    """A decorated callable inlined into traced code: its marks around the call, depending on
    its tensor arguments and results (``key``: the region's ``key_of``, taken when it was
    decorated; ``timer``: its Timer's ``compile_key``)."""
    if not SUPPORTED:
        _note_left_out(timer)
        return fn(*args, **kwargs)
    deps: list[torch.Tensor] = []
    tensors_in((args, kwargs), deps, _MAX_DEPS, _any)
    _mark(_ENTER, key, deps)
    out = fn(*args, **kwargs)
    deps = []
    tensors_in(out, deps, _MAX_DEPS, _any)
    _mark(_EXIT, key, deps)
    return out
