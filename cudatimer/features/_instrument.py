"""Whole-model instrumentation: a region around every submodule's forward (and optionally an
approximate one around its backward), named by module path, removed by one handle.

Forward: each chosen module's ``forward`` is wrapped on the instance (the class's forward bound
with ``types.MethodType``, so ``copy.deepcopy`` rebinds it), not hooked: a module with any hook
leaves ``nn.Module.__call__``'s fast path (about +2.5 us per call measured on the CPU machine,
against +0.3 us for the wrapper), and a forward hook is skipped when forward raises a
``BaseException`` such as KeyboardInterrupt, which would leave the region open on the thread's
stack for good. The wrapper closes its region on every exception.

Backward (``backward=True``): each forward call of a chosen module also times its backward
(``_backward``: one pre-hook on the node that made the call's output, closed when a node made
before the call runs or the backward pass ends), as a detached row at a fixed place that
mirrors the forward tree under one root per model: ``Net.backward/layers.0/attn`` for the
forward row ``Net/layers.0/attn``. The root row ``Net.backward`` is the model's whole
backward (when the model itself is instrumented), so its children's share of it is the
backward's coverage (``Summary.backward_coverage``). Fixed paths, not the thread's stack: the
backward runs on autograd's threads on the GPU and under the caller's regions on the CPU, and
the tree must read the same on both. Inside ``torch.compile``d code each call puts one mark
into the compiled backward graph instead of a hook (``_backward``, "compiled code").
"""

from __future__ import annotations

import fnmatch
import functools
import sys
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch

from .._config import DISABLED_AT_IMPORT
from ..regions._timer import Timer
from ..regions._wrap import bind_forward, skip_dynamo_frames
from ..sources import _backward, _memory

__all__ = ["Instrumented", "instrument"]

# Module -> its live handle: instrumenting a module twice would nest every region in itself.
_LIVE: weakref.WeakKeyDictionary[torch.nn.Module, Instrumented] = weakref.WeakKeyDictionary()
Pattern = str | type

# "/" separates nesting levels in region paths, and torch allows it in a child's name
# (add_module("a/b", m)): such a part is named with U+2215 DIVISION SLASH instead, which looks
# the same and cannot collide with a "." path of containers.
_SLASH = "\u2215"


def _part(name: str) -> str:
    """A module name (a path part) as a region name may hold it: "/" as U+2215, NUL and
    characters without a UTF-8 form (lone surrogates) as backslash escapes."""
    text = name.replace("/", _SLASH).replace("\x00", "\\x00")
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


class Instrumented:
    """What :func:`instrument` returns: ``remove()`` takes every wrapper away (backward hooks
    already set on tensors of earlier forward calls still close their regions); also a context
    manager (``with cudatimer.instrument(model): ...`` removes at the end).

    ``regions`` maps each instrumented module path ("" for the model itself) to its region
    name; ``backward_regions`` maps each to its backward row's path
    (``Net.backward/layers.0``; the model itself: ``Net.backward``).
    """

    def __init__(self, model: torch.nn.Module, timer: Timer) -> None:
        self.model = model
        self.timer = timer
        self.regions: dict[str, str] = {}
        self.backward_regions: dict[str, str] = {}
        self._undo: list[Callable[[], None]] = []
        self._removed = False

    def remove(self) -> None:
        """Put every module's forward back (safe to call twice)."""
        if self._removed:
            return
        self._removed = True
        for undo in reversed(self._undo):
            undo()
        self._undo.clear()
        if _LIVE.get(self.model) is self:
            del _LIVE[self.model]

    @property
    def removed(self) -> bool:
        return self._removed

    def __enter__(self) -> Instrumented:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def __len__(self) -> int:
        return len(self.regions)

    def __repr__(self) -> str:
        state = "removed" if self._removed else f"{len(self.regions)} modules"
        return f"Instrumented({type(self.model).__name__}, {state}, timer={self.timer.name!r})"


def _patterns(value: object, what: str) -> tuple[Pattern, ...] | None:
    """None, a glob on module paths, an nn.Module subclass, or an iterable of those."""
    if value is None:
        return None
    items: list[object]
    if isinstance(value, (str, type)):
        items = [value]
    elif isinstance(value, Iterable):
        items = list(value)
    else:
        raise TypeError(
            f"{what} must be a glob on module paths (str), an nn.Module subclass, or a list of "
            f"those; got {type(value).__name__} ({value!r})"
        )
    for item in items:
        if isinstance(item, type):
            if not issubclass(item, torch.nn.Module):
                raise TypeError(f"{what} types must be nn.Module subclasses, got {item!r}")
        elif not isinstance(item, str):
            raise TypeError(
                f"{what} items must be globs (str) or nn.Module subclasses, got "
                f"{type(item).__name__} ({item!r})"
            )
    return tuple(items)  # type: ignore[arg-type]


def _matches(patterns: tuple[Pattern, ...], path: str, module: torch.nn.Module) -> bool:
    for p in patterns:
        if isinstance(p, str):
            if fnmatch.fnmatchcase(path, p):
                return True
        elif isinstance(module, p):
            return True
    return False


def _has_forward(module: torch.nn.Module) -> bool:
    """Containers without a forward of their own (ModuleList, ModuleDict) are never called."""
    forward = getattr(type(module), "forward", None)
    return forward is not None and forward is not getattr(torch.nn.Module, "forward", None)


def instrument(
    model: torch.nn.Module,
    depth: int | None = None,
    include: Pattern | Iterable[Pattern] | None = None,
    exclude: Pattern | Iterable[Pattern] | None = None,
    *,
    backward: bool = False,
    memory: bool = False,
    memory_every: int | None = None,
    flops: bool = False,
    timer: Timer | None = None,
) -> Instrumented:
    """Put a region around the forward of ``model`` and of every submodule.

    Regions nest as the modules call each other, and each is named by its module path relative
    to the nearest instrumented module above it, so a region's path in the report is its module
    path: ``GPT/transformer/h.0/attn`` (``.`` joins the parts inside containers such as
    ModuleList, which have no forward; the model itself is named by its class). A "/" in a
    module's name (``add_module("a/b", m)``) becomes "\u2215" (DIVISION SLASH, as "/" separates
    nesting levels), a lone surrogate a backslash escape, and a name of only spaces is shown
    quoted (``' '``); ``include``/``exclude`` and ``Instrumented.regions``' keys use torch's
    own paths.

    ``depth``: how many levels below the model (None: all; 0: the model only; containers do not
    count as levels). ``include`` / ``exclude``: globs on dotted module paths (``"h.*.attn"``;
    ``fnmatch``, where ``*`` also matches dots; the model's own path is ``""``), nn.Module
    subclasses, or lists of those; ``exclude`` skips a module, not its children (``"h.0*"``
    skips a subtree). ``backward=True`` also times each module call's backward, as rows that
    mirror the forward tree under ``<Model>.backward`` (``GPT.backward/h.0/attn``; see
    docs/instrument.md for what a module's backward is). ``memory=True`` also measures each
    call's GPU memory (forward rows, and backward rows with ``backward=True``): the columns
    ``mem_delta`` and ``mem_peak`` (docs/memory.md), on one call of the model in
    ``memory_every`` (default 10; 1: every call) with every call inside it, forward and
    backward alike. ``flops=True`` also counts each forward call's FLOPs once per input
    signature, for the columns ``TFLOP/s`` and ``MFU`` (docs/flops.md). ``timer``: default
    Timer if None.

    >>> import torch, cudatimer
    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    >>> t = cudatimer.Timer(name="instrument-doc")
    >>> with cudatimer.instrument(model, timer=t) as handle:
    ...     _ = model(torch.zeros(2, 4))
    >>> t.summary().names
    ('Sequential', 'Sequential/0', 'Sequential/1')
    >>> handle.removed, "forward" in model.__dict__
    (True, False)
    """
    from ..regions._timer import default_timer

    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int)):
        raise TypeError(f"depth must be an int or None, got {type(depth).__name__} ({depth!r})")
    if depth is not None and depth < 0:
        raise ValueError(f"depth must be >= 0 (0: the model only) or None, got {depth}")
    includes = _patterns(include, "include")
    excludes = _patterns(exclude, "exclude")
    if not isinstance(backward, bool):
        raise TypeError(f"backward must be a bool, got {type(backward).__name__}")
    if not isinstance(memory, bool):
        raise TypeError(f"memory must be a bool, got {type(memory).__name__}")
    if not isinstance(flops, bool):
        raise TypeError(f"flops must be a bool, got {type(flops).__name__}")
    options: dict[str, Any] = {"memory": True} if memory else {}  # every row's region options
    if memory_every is not None:
        options["memory_every"] = _memory.check_every(memory_every, memory)
    if flops:
        options["flops"] = True
    if timer is None:
        timer = default_timer()
    elif not isinstance(timer, Timer):
        raise TypeError(f"timer must be a cudatimer.Timer or None, got {type(timer).__name__}")
    live = _LIVE.get(model)
    if live is not None:
        raise ValueError(
            f"this {type(model).__name__} is already instrumented ({live!r}); call remove() on "
            "that handle first"
        )

    root_name = _part(type(model).__name__)
    # (torch's module path, region name, the forward row's parts below the model, module)
    chosen: list[tuple[str, str, tuple[str, ...], torch.nn.Module]] = []
    seen: set[int] = set()

    def walk(
        module: torch.nn.Module,
        path: str,
        label: str,
        level: int,
        anchor: str | None,
        parts: tuple[str, ...],
    ) -> None:
        # path: torch's dotted path (for globs); label: the same with region-safe parts;
        # anchor: the label of the nearest instrumented module above (None: none yet);
        # parts: the region names of the instrumented modules above, below the model.
        if id(module) in seen or isinstance(module, torch.jit.ScriptModule):
            return
        seen.add(id(module))
        callable_ = _has_forward(module)
        if callable_ and (depth is None or level <= depth):
            picked = (includes is None or _matches(includes, path, module)) and not (
                excludes is not None and _matches(excludes, path, module)
            )
            if picked:
                if anchor is None:
                    name = label or root_name
                elif anchor == "":
                    name = label
                else:
                    name = label[len(anchor) + 1 :]
                if not name.strip():  # a child named " ": shown quoted, as a name must show
                    name = repr(name)
                if path:
                    parts = (*parts, name)
                chosen.append((path, name, parts, module))
                anchor = label
        next_level = level + 1 if callable_ else level
        if depth is not None and next_level > depth:
            return
        for child_name, child in module.named_children():
            part = _part(child_name)
            walk(
                child,
                f"{path}.{child_name}" if path else child_name,
                f"{label}.{part}" if label else part,
                next_level,
                anchor,
                parts,
            )

    walk(model, "", "", 0, None, ())
    if not chosen:
        raise ValueError(
            f"instrument() found no module to time in {type(model).__name__} "
            f"(depth={depth!r}, include={include!r}, exclude={exclude!r})"
        )

    handle = Instrumented(model, timer)
    # One root per model: every backward row lies under it, the model's own row or not.
    root = f"{root_name}.backward"
    try:
        for path, name, parts, module in chosen:
            region = timer.region(name, **options)  # type: ignore[arg-type]
            inner = None
            if backward and not DISABLED_AT_IMPORT:
                row = f"{parts[-1]}.backward" if parts else root
                site = _backward.Site(timer.region(row, **options), (root, *parts))  # type: ignore[arg-type]
                inner = functools.partial(_backward.hooking, site=site)
                handle.backward_regions[path] = "/".join(site.path)
            # Only the model itself may be compiled as a whole (torch.compile(model)); its
            # submodules' forwards run inside the frames Dynamo traces, or eagerly.
            refusal = (
                f"cudatimer: torch.jit.script cannot compile a {type(module).__name__} that "
                f"instrument() times (region {name!r}): TorchScript cannot compile the timing "
                "wrappers around its modules' forwards. Call remove() on the "
                "handle instrument() returned, script the model, then time the scripted "
                "model as a whole: cudatimer.cuda_timed(torch.jit.script(model), name=...); "
                "or leave it unscripted (torch.compile keeps every module's region)"
            )
            handle._undo.append(
                bind_forward(module, region, inner, entry=path == "", refusal=refusal)
            )
            handle.regions[path] = name
    except BaseException:
        handle.remove()
        raise
    _LIVE[model] = handle
    return handle


skip_dynamo_frames(sys.modules[__name__])
