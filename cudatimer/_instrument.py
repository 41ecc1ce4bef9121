"""Whole-model instrumentation: a region around every submodule's forward (and optionally an
approximate one around its backward), named by module path, removed by one handle.

Forward: each chosen module's ``forward`` is wrapped on the instance (the class's forward bound
with ``types.MethodType``, so ``copy.deepcopy`` rebinds it), not hooked: a module with any hook
leaves ``nn.Module.__call__``'s fast path (about +2.5 us per call measured on the CPU machine,
against +0.3 us for the wrapper), and a forward hook is skipped when forward raises a
``BaseException`` such as KeyboardInterrupt, which would leave the region open on the thread's
stack for good. The wrapper closes its region on every exception.

Backward (``backward=True``): full backward pre-hook and hook, as detached regions (the
backward runs on autograd's threads, where no region of the forward is open), named
``<module path>.backward``. Approximate: a module's backward hooks fire when the gradients of its
outputs and then of its inputs are ready, which brackets its backward kernels only when its
backward runs as one block; the GPU time is that of the stream autograd runs it on.
"""

from __future__ import annotations

import fnmatch
import sys
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch

from ._timer import _SKIP, Region, Timer
from ._wrap import bind_forward, skip_dynamo_frames

__all__ = ["Instrumented", "instrument"]

# Module -> its live handle: instrumenting a module twice would nest every region in itself.
_LIVE: weakref.WeakKeyDictionary[torch.nn.Module, Instrumented] = weakref.WeakKeyDictionary()
# Open backward tokens kept per module; more than this means hooks that never closed (a
# backward that stopped half-way): the oldest are dropped.
_MAX_OPEN_BACKWARD = 1024

Pattern = str | type


class Instrumented:
    """What :func:`instrument` returns: ``remove()`` takes every wrapper and hook away; also a
    context manager (``with cudatimer.instrument(model): ...`` removes at the end).

    ``regions`` maps each instrumented module path ("" for the model itself) to its region
    name; ``backward_regions`` likewise for backward regions.
    """

    def __init__(self, model: torch.nn.Module, timer: Timer) -> None:
        self.model = model
        self.timer = timer
        self.regions: dict[str, str] = {}
        self.backward_regions: dict[str, str] = {}
        self._undo: list[Callable[[], None]] = []
        self._removed = False

    def remove(self) -> None:
        """Remove every forward wrapper and backward hook (safe to call twice)."""
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
    timer: Timer | None = None,
) -> Instrumented:
    """Put a region around the forward of ``model`` and of every submodule.

    Regions nest as the modules call each other, and each is named by its module path relative
    to the nearest instrumented module above it, so a region's path in the report is its module
    path: ``GPT/transformer/h.0/attn`` (``.`` joins the parts inside containers such as
    ModuleList, which have no forward; the model itself is named by its class).

    ``depth``: how many levels below the model (None: all; 0: the model only; containers do not
    count as levels). ``include`` / ``exclude``: globs on dotted module paths (``"h.*.attn"``;
    ``fnmatch``, where ``*`` also matches dots; the model's own path is ``""``), nn.Module
    subclasses, or lists of those; ``exclude`` skips a module, not its children (``"h.0*"``
    skips a subtree). ``backward=True`` adds approximate regions around each module's backward
    (hooks, on autograd's thread), named ``<path>.backward``; modules with ``inplace=True`` are
    left out of them (full backward hooks reject in-place outputs). ``timer``: default Timer if
    None.

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
    from . import default_timer

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

    root_name = type(model).__name__.replace("/", ".")
    chosen: list[tuple[str, str, torch.nn.Module]] = []  # (path, region name, module)
    seen: set[int] = set()

    def walk(module: torch.nn.Module, path: str, level: int, anchor: str | None) -> None:
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
                    name = path or root_name
                elif anchor == "":
                    name = path
                else:
                    name = path[len(anchor) + 1 :]
                chosen.append((path, name, module))
                anchor = path
        next_level = level + 1 if callable_ else level
        if depth is not None and next_level > depth:
            return
        for child_name, child in module.named_children():
            walk(child, f"{path}.{child_name}" if path else child_name, next_level, anchor)

    walk(model, "", 0, None)
    if not chosen:
        raise ValueError(
            f"instrument() found no module to time in {type(model).__name__} "
            f"(depth={depth!r}, include={include!r}, exclude={exclude!r})"
        )

    handle = Instrumented(model, timer)
    try:
        for path, name, module in chosen:
            region = timer.region(name)
            handle._undo.append(bind_forward(module, region))
            handle.regions[path] = name
            if backward and not getattr(module, "inplace", False):
                label = f"{path or root_name}.backward"
                _hook_backward(handle, module, timer.region(label))
                handle.backward_regions[path] = label
    except BaseException:
        handle.remove()
        raise
    _LIVE[model] = handle
    return handle


def _hook_backward(handle: Instrumented, module: torch.nn.Module, region: Region) -> None:
    timer = region.timer
    tokens: list[Any] = []  # open backward regions of this module, innermost last

    def before(mod: torch.nn.Module, grad_output: Any) -> None:
        if len(tokens) >= _MAX_OPEN_BACKWARD:
            _drop(tokens.pop(0))
        tokens.append(timer._begin(region))

    def after(mod: torch.nn.Module, grad_input: Any, grad_output: Any) -> None:
        if tokens:
            timer._end(region, tokens.pop())

    pre = module.register_full_backward_pre_hook(before)
    post = module.register_full_backward_hook(after)

    def undo() -> None:
        pre.remove()
        post.remove()
        while tokens:
            _drop(tokens.pop())

    handle._undo.append(undo)


def _drop(token: Any) -> None:
    """Forget a backward region that never closed: its start event back to the pool, its NVTX
    range ended."""
    if token is None:
        return
    r, _node, entry, start, _t0, range_id = token
    if entry is not None and start is not None and start is not _SKIP:
        entry.pool.append(start)
    if range_id is not None:
        r.domain.end(range_id)


skip_dynamo_frames(sys.modules[__name__])
