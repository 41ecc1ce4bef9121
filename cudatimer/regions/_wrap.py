"""Decorating callables with a Region: functions, methods, class/static methods, modules and
module classes, coroutine functions, generator functions, ``@contextmanager`` functions and
context manager classes. Decided at decoration time, never per call.

torch.compile: Dynamo never compiles a frame of this package (``skip_dynamo_frames``), so a
decorated function compiled as a whole (``torch.compile(timed_fn)``) runs its wrapper eagerly
and Dynamo compiles the function it wraps as its own frame: the region times the compiled call,
with ``fullgraph=True`` too. Inlined into code Dynamo traces, the wrapper's region does nothing
(the recorder's hooks test ``torch.compiler.is_compiling()``, which Dynamo folds to True).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import types
import warnings
from collections.abc import Callable, Generator, Iterator
from typing import Any, NoReturn, Protocol

import torch

from .._config import DISABLED_AT_IMPORT
from ..core import _core
from ..sources import _backward, _compile, _flops
from ..sources._source import Probe

# Folded to True by Dynamo while it traces (a decorated function inlined into compiled code);
# one Python frame that returns False otherwise.
_is_dynamo_compiling: Callable[[], bool] = getattr(
    torch.compiler, "is_dynamo_compiling", torch.compiler.is_compiling
)


class Region(Protocol):
    """What a wrapper uses of a region (``_timer.Region``): its hooks and its Timer's."""

    @property
    def name(self) -> str: ...
    @property
    def counter(self) -> Any: ...
    @property
    def timer(self) -> Timer: ...
    @property
    def probes(self) -> tuple[Probe, ...]: ...

    def __enter__(self) -> Any: ...
    def __exit__(self, *exc: Any) -> None: ...


class Timer(Protocol):
    """What a wrapper uses of a Timer (``_timer.Timer``)."""

    @property
    def recorder(self) -> Any: ...
    @property
    def region(self) -> Callable[..., Any]: ...
    @property
    def compile_key(self) -> int: ...


def _cm_helper_code(factory: Any) -> Any:
    def gen() -> Iterator[None]:
        yield

    return getattr(factory(gen), "__code__", None)


# Every function made by @contextlib.contextmanager shares one code object ("helper").
_CONTEXTMANAGER_CODE = _cm_helper_code(contextlib.contextmanager)
_ASYNC_CONTEXTMANAGER_CODE = _cm_helper_code(contextlib.asynccontextmanager)


def wrap(fn: Any, region: Region, entry: bool = True) -> Any:
    """Return ``fn`` timed by ``region`` (same signature, ``functools.wraps`` metadata).

    ``entry=False``: ``fn`` is only ever called from code Dynamo traces or from eager code,
    never compiled as a whole (a submodule's forward under ``instrument``), so the extra
    frame that lets Dynamo compile a timed torch function as a first frame is left out
    (about 0.3 us per call in a launch-bound decode: two fewer argument packings)."""
    if isinstance(fn, (classmethod, staticmethod)):
        return type(fn)(wrap(fn.__func__, region))
    site = getattr(region, "backward_site", None)  # backward=True (decided here, once)
    if site is not None:
        fn = _timing_backward(fn, site)
    if _is_module(fn):
        # its forward is wrapped below, backward_site and all
        bind_forward(fn, region, refusal=script_refusal(type(fn).__name__, region.name))
        return fn
    if isinstance(fn, type):
        return _wrap_class(fn, region)
    if not callable(fn):
        raise TypeError(f"cannot time {fn!r}: expected a function, method or nn.Module")
    rec = region.timer.recorder
    store = rec.store
    # every=N regions have their own enter hook (decided here, so plain regions pay nothing).
    enter = rec.enter_sampled if region.counter is not None else rec.enter
    leave = rec.exit
    begin, end = rec.begin, rec.end
    if region.probes:  # memory=True: measured around the hooks below (decided here, once)
        enter, leave, begin, end = _probed(region, enter, leave, begin, end)

    if inspect.isasyncgenfunction(fn) or (
        getattr(fn, "__code__", None) is _ASYNC_CONTEXTMANAGER_CODE
    ):
        raise TypeError(
            f"cannot time async generator {fn.__qualname__!r}: its steps interleave with other "
            "tasks; wrap the work inside it in `with cuda_region(...)` instead"
        )

    if inspect.iscoroutinefunction(fn):
        # A coroutine yields to the event loop, where other tasks open their own regions on the
        # same thread, so it cannot sit on the thread's stack: it is a detached region (NVTX
        # start/end range, events at the first and last step), timed until it finishes.
        @functools.wraps(fn)
        async def timed_coroutine(*args: Any, **kwargs: Any) -> Any:
            token = begin(region)
            try:
                return await fn(*args, **kwargs)
            finally:
                end(region, token)

        return timed_coroutine

    if inspect.isgeneratorfunction(fn):
        # Each resume (next/send/throw) is one call of the region, so the stack stays nested
        # while the consumer runs between steps.
        @functools.wraps(fn)
        def timed_generator(*args: Any, **kwargs: Any) -> Generator[Any, Any, Any]:
            gen = fn(*args, **kwargs)
            sent: Any = None
            thrown: BaseException | None = None
            while True:
                enter(region)
                try:
                    if thrown is not None:
                        exc, thrown = thrown, None
                        item = gen.throw(exc)
                    else:
                        item = gen.send(sent)
                except StopIteration as stop:
                    leave(region, True)
                    return stop.value
                except BaseException:
                    leave(region, False)
                    raise
                leave(region, True)
                try:
                    sent = yield item
                except GeneratorExit:
                    gen.close()
                    raise
                except BaseException as exc:  # thrown in by the consumer: pass it on
                    thrown = exc

        return timed_generator

    if getattr(fn, "__code__", None) is _CONTEXTMANAGER_CODE:
        # A @contextmanager function: the region spans the whole `with` block (setup, body and
        # teardown), not the call that builds the context manager.
        @functools.wraps(fn)
        def timed_context(*args: Any, **kwargs: Any) -> _TimedContext:
            return _TimedContext(fn(*args, **kwargs), region, enter, leave)

        return timed_context

    # torch's own functions (nn.Linear.forward...) are in Dynamo's skip list as first frames:
    # called straight from the wrapper (a frame Dynamo does not compile) they would run
    # uncompiled. A frame of ours in between, which Dynamo compiles, inlines them.
    call = functools.partial(_compiled_entry, fn) if entry and _is_torch_function(fn) else fn

    # The region's own __enter__/__exit__ are the core's common case (and fall back to the
    # recorder's general hooks themselves), so the wrapper calls them directly. A backward
    # region's own pair keeps the bookkeeping of `with` blocks for backward_from (and warns
    # when a block never calls it); a decorated call hooks its outputs itself, so it takes the
    # core's pair.
    plain = site is None
    r_enter: Callable[[], Any]
    if site is not None and region.counter is not None:  # every=N: the sampled enter hook
        r_enter = functools.partial(rec.enter_sampled, region)
    else:
        r_enter = _core.RegionBase.__enter__.__get__(region)
    r_exit = _core.RegionBase.__exit__.__get__(region)
    # flops=True: the call counted inside the region, once per input signature; the
    # region's own flops probe (for `with` blocks and compiled calls) left out of the eager
    # path. Traced code takes the plain call: Dynamo must not inline the counting.
    eager = call
    if getattr(region, "flop_state", None) is not None:
        eager = _flops.counted(call, region)
        if plain:
            plain = False
            r_enter, r_exit = region.hooks_without("flops")  # type: ignore[attr-defined]
    # Ints, so that Dynamo folds them into the graph where it inlines this wrapper.
    key, timer_key = _compile.key_of(region), region.timer.compile_key

    @functools.wraps(fn)
    def timed_function(*args: Any, **kwargs: Any) -> Any:
        if _is_dynamo_compiling():  # inlined into traced code: the region's marks go in
            return _compile.call(key, timer_key, call, args, kwargs)
        if not store.enabled:
            return call(*args, **kwargs)
        if plain:
            # A `with` statement: no exception (a KeyboardInterrupt from a signal handler,
            # raised as a call returns) can come between the enter and the block that exits.
            with region:
                return call(*args, **kwargs)
        # The core's own pair, called by hand: an exception raised as the enter returns lands
        # in the `try`, and the stack's depth tells whether the enter had opened the call.
        stack = store.stack()
        depth = len(stack)
        try:
            r_enter()
            result = eager(*args, **kwargs)
        except BaseException as exc:
            if len(stack) > depth:
                r_exit(type(exc), exc, exc.__traceback__)
            raise
        r_exit(None, None, None)
        return result

    # torch.jit.script follows __wrapped__ to the source of the undecorated function and
    # would compile it without its region: 0 calls recorded, silently. TorchScript refuses
    # functions that carry this attribute, with its text as the error.
    setattr(  # the name TorchScript looks for is not an identifier of ours
        timed_function,
        "__script_unsupported",
        f"{getattr(fn, '__qualname__', fn)!r} is timed by cudatimer; scripting it would compile "
        "the undecorated function and time nothing. Script first and time the result: "
        "cuda_timed(torch.jit.script(fn)), or leave it unscripted.",
    )
    return timed_function


def _probed(
    region: Region,
    enter: Callable[[Any], None],
    leave: Callable[[Any, bool], None],
    begin: Callable[[Any], Any],
    end: Callable[[Any, Any], None],
) -> tuple[
    Callable[[Any], None],
    Callable[[Any, bool], None],
    Callable[[Any], Any],
    Callable[[Any, Any], None],
]:
    """The recorder's hooks of a region with probes (``memory=True``) with the probes run
    around them: for the wrappers that call the hooks, not the region's own enter and exit
    (generators, context managers, coroutines)."""
    probes = region.probes

    def probed_enter(r: Any) -> None:
        enter(r)
        for probe in probes:
            probe.enter(r)

    def probed_leave(r: Any, clean: bool) -> None:
        try:
            for probe in reversed(probes):
                probe.exit(r, None)
        finally:
            leave(r, clean)

    open_: Callable[[], Any] = functools.partial(begin, region)
    close: Callable[[Any], None] = functools.partial(end, region)
    for probe in probes:
        open_, close = probe.detached(region, open_, close)
    opened, closed = open_, close

    def probed_begin(r: Any) -> Any:
        return opened()

    def probed_end(r: Any, token: Any) -> None:
        closed(token)

    return probed_enter, probed_leave, probed_begin, probed_end


def _timing_backward(fn: Any, site: Any) -> Any:
    """``fn`` (a function or method) that also times the backward of its tensor outputs; a
    module or an nn.Module subclass as it is (its forward is wrapped); anything else a
    TypeError, as its calls have no tensor result to follow."""
    if _is_module(fn):
        return fn
    import torch.nn

    if isinstance(fn, type) and issubclass(fn, torch.nn.Module):
        return fn
    kind = None
    if isinstance(fn, type):
        kind = "a class that is not an nn.Module"
    elif inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
        kind = "an async function"
    elif inspect.isgeneratorfunction(fn):
        kind = "a generator function"
    elif getattr(fn, "__code__", None) is _CONTEXTMANAGER_CODE:
        kind = "a @contextmanager function"
    elif not callable(fn):
        return fn  # wrap() names it
    if kind is not None:
        raise TypeError(
            f"backward=True times the backward of the tensors a function or module returns; "
            f"{getattr(fn, '__qualname__', fn)!r} is {kind}. Use `with region:` and "
            "region.backward_from(tensors) inside it instead"
        )
    return functools.wraps(fn)(_backward.hooking(fn, site, bounded=True))


def _compiled_entry(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """The frame Dynamo compiles when a timed torch function is compiled as a whole (never
    marked to be skipped, unlike the rest of this package)."""
    return fn(*args, **kwargs)


def _is_torch_function(fn: Any) -> bool:
    module = getattr(fn, "__module__", None)
    return isinstance(module, str) and (module == "torch" or module.startswith("torch."))


class _TimedContext:
    """A context manager timed from ``__enter__`` to ``__exit__`` by a region."""

    __slots__ = ("_cm", "_enter", "_leave", "_region")

    def __init__(
        self,
        cm: Any,
        region: Region,
        enter: Callable[[Region], None],
        leave: Callable[[Region, bool], None],
    ) -> None:
        self._cm = cm
        self._region = region
        self._enter = enter
        self._leave = leave

    def __enter__(self) -> Any:
        self._enter(self._region)
        try:
            return self._cm.__enter__()
        except BaseException:
            self._leave(self._region, False)
            raise

    def __exit__(self, *exc: Any) -> Any:
        try:
            return self._cm.__exit__(*exc)
        finally:
            self._leave(self._region, exc[0] is None)


def _wrap_class(cls: type, region: Region) -> type:
    """An nn.Module subclass: time ``forward`` of every instance. A context manager class:
    time each ``with`` block from ``__enter__`` to ``__exit__``. Anything else is an error
    (replacing a class by a function would break ``isinstance`` and subclassing)."""
    try:
        import torch.nn
    except ImportError:  # pragma: no cover
        module_type: Any = ()
    else:
        module_type = torch.nn.Module
    if module_type and issubclass(cls, module_type):
        forward = cls.__dict__.get("forward") or cls.forward  # type: ignore[attr-defined]
        cls.forward = wrap(forward, region)  # type: ignore[attr-defined]
        cls.__prepare_scriptable__ = _refuse_script(  # type: ignore[attr-defined]
            script_refusal(cls.__name__, region.name, cls=True)
        )
        return cls
    if callable(getattr(cls, "__enter__", None)) and callable(getattr(cls, "__exit__", None)):
        rec = region.timer.recorder
        enter = rec.enter_sampled if region.counter is not None else rec.enter
        leave = rec.exit
        if region.probes:
            enter, leave, _, _ = _probed(region, enter, leave, rec.begin, rec.end)
        enter_cm, exit_cm = cls.__enter__, cls.__exit__  # type: ignore[attr-defined]

        @functools.wraps(enter_cm)
        def __enter__(self: Any) -> Any:
            enter(region)
            try:
                return enter_cm(self)
            except BaseException:
                leave(region, False)
                raise

        @functools.wraps(exit_cm)
        def __exit__(self: Any, *exc: Any) -> Any:
            try:
                return exit_cm(self, *exc)
            finally:
                leave(region, exc[0] is None)

        cls.__enter__ = __enter__  # type: ignore[attr-defined]
        cls.__exit__ = __exit__  # type: ignore[attr-defined]
        return cls
    raise TypeError(
        f"cannot time class {cls.__qualname__!r}: decorate its methods instead (classes that "
        "can be timed: nn.Module subclasses, whose forward is timed, and context managers, "
        "timed from __enter__ to __exit__)"
    )


def script_refusal(module: str, region: str, *, cls: bool = False) -> str:
    """What ``torch.jit.script`` of a module timed by ``cuda_timed`` says: TorchScript cannot
    compile the timing wrapper around its forward (it failed with "undefined value F" or
    "Can't get source", pointing into cudatimer)."""
    what = f"class {module}" if cls else f"this {module}"
    return (
        f"cudatimer: torch.jit.script cannot compile {what}: its forward is timed as region "
        f"{region!r}, and TorchScript cannot compile the timing wrapper. Script an untimed "
        "module first and time the scripted one as a whole: "
        "cudatimer.cuda_timed(torch.jit.script(model), name=...), or leave it unscripted "
        "(torch.compile keeps the regions inside it)"
    )


def _refuse_script(message: str) -> Callable[[], NoReturn]:
    """A ``__prepare_scriptable__`` hook: ``torch.jit.script`` calls it on a module (and on
    each submodule) before it compiles anything, so raising there names the cause."""

    def refuse(*_: object) -> NoReturn:
        raise RuntimeError(message)

    return refuse


def bind_forward(
    module: Any,
    region: Region,
    inner: Callable[[Callable[..., Any]], Callable[..., Any]] | None = None,
    entry: bool = True,
    *,
    refusal: str,
) -> Callable[[], None]:
    """Time ``module.forward`` of this instance with ``region``; returns an undo function.

    The class's forward is bound to the module as a method (``types.MethodType``), so
    ``copy.deepcopy(module)`` rebinds it to the copy instead of calling the original's forward.
    A forward already set on the instance (another tool's wrapper) is wrapped as it is.
    ``inner`` (optional) wraps the forward function before the region does. ``refusal``: the
    RuntimeError ``torch.jit.script`` of the module raises until the undo (what to do).
    """
    if isinstance(region, _core.NullRegion):  # CUDATIMER_DISABLE: the forward stays as it is
        return lambda: None
    own = module.__dict__.get("forward")
    fn = own if own is not None else type(module).forward
    if inner is not None:
        fn = functools.wraps(fn)(inner(fn))
    timed = wrap(fn, region, entry)
    if own is None:
        timed = types.MethodType(timed, module)
    module.forward = timed
    own_hook = module.__dict__.get("__prepare_scriptable__")
    hook = _refuse_script(refusal)
    module.__prepare_scriptable__ = hook

    def undo() -> None:
        if module.__dict__.get("__prepare_scriptable__") is hook:
            if own_hook is None:
                del module.__prepare_scriptable__
            else:
                module.__prepare_scriptable__ = own_hook
        if module.__dict__.get("forward") is timed:
            if own is None:
                del module.forward
            else:
                module.forward = own
        else:
            warnings.warn(
                f"cudatimer: the forward of this {type(module).__name__} was replaced after it "
                f"was timed as {region.name!r}; the timing wrapper stays inside the new forward "
                "(removing it would undo the newer one)",
                RuntimeWarning,
                stacklevel=4,
            )

    return undo


def _is_module(obj: object) -> bool:
    try:
        import torch.nn
    except ImportError:  # pragma: no cover
        return False
    return isinstance(obj, torch.nn.Module)


def default_name(fn: Any) -> str:
    """``__qualname__`` of a function (``Model.forward``) or the class name of a module."""
    if isinstance(fn, (classmethod, staticmethod)):
        fn = fn.__func__
    if _is_module(fn):
        return type(fn).__name__
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    if not isinstance(name, str):
        raise TypeError(f"cannot time {fn!r}: expected a function, method or nn.Module")
    return name.replace("/", ".")


def timed(timer: Timer, fn: Any, name: str | None, options: dict[str, Any]) -> Any:
    """The three decorator forms: ``@t``, ``@t("name")``, ``@t(name=..., **options)``."""
    if isinstance(fn, str):  # @cuda_timed("name", ...)
        if name is not None:
            raise TypeError("name given twice: positionally and as name=")
        name, fn = fn, None
    if name is not None and not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__} ({name!r})")
    if fn is None:

        def decorate(f: Callable[..., Any]) -> Any:
            return _apply(timer, f, name, options)

        # Validate options now, at the decorator's creation, not at the first call.
        if name is not None:
            timer.region(name, **options)
        elif options:
            timer.region("_", **options)
        return decorate
    return _apply(timer, fn, name, options)


def _apply(timer: Timer, fn: Any, name: str | None, options: dict[str, Any]) -> Any:
    if not (callable(fn) or isinstance(fn, (classmethod, staticmethod))):
        raise TypeError(
            f"cuda_timed expects a function, method or nn.Module (or a name), got "
            f"{type(fn).__name__} ({fn!r})"
        )
    region = timer.region(name if name is not None else default_name(fn), **options)
    if DISABLED_AT_IMPORT:
        return fn
    return wrap(fn, region)


# -- torch.compile ------------------------------------------------------------------------------


def _skip_codes(codes: list[Any]) -> bool:
    """Mark code objects so that Dynamo never compiles their frames (it still compiles frames
    they call, and still inlines them into frames it traces). False where this torch has no
    such switch: regions then behave as inside traced code (no-ops), which never crashes."""
    try:
        from torch._C._dynamo import eval_frame as ef
    except ImportError:  # pragma: no cover - torch without Dynamo
        return False
    skip = getattr(ef, "skip_code", None)  # older torch
    if skip is None:
        setter = getattr(ef, "set_code_exec_strategy", None)
        action = getattr(ef, "_FrameAction", None)
        strategy = getattr(ef, "_FrameExecStrategy", None)
        if setter is None or action is None or strategy is None:  # pragma: no cover
            return False

        def skip(code: Any) -> None:
            setter(code, strategy(action.SKIP, action.DEFAULT))

    for code in codes:
        skip(code)
    return True


def _codes_of(module: types.ModuleType) -> list[Any]:
    """Every code object defined in ``module``: functions, methods, nested functions."""
    found: list[Any] = []
    seen: set[int] = set()

    def add(code: Any) -> None:
        if id(code) in seen or code is _compiled_entry.__code__:
            return
        seen.add(id(code))
        found.append(code)
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                add(const)

    def visit(obj: Any) -> None:
        if isinstance(obj, (staticmethod, classmethod)):
            obj = obj.__func__
        if isinstance(obj, property):
            for f in (obj.fget, obj.fset, obj.fdel):
                if f is not None:
                    visit(f)
            return
        code = getattr(obj, "__code__", None)
        if isinstance(code, types.CodeType) and getattr(obj, "__module__", None) == name:
            add(code)

    name = module.__name__
    for value in list(vars(module).values()):
        if isinstance(value, type) and value.__module__ == name:
            for attr in vars(value).values():
                visit(attr)
        else:
            visit(value)
    return found


def skip_dynamo_frames(*modules: types.ModuleType) -> bool:
    """Keep Dynamo from compiling any frame of ``modules`` (the recorder's own code).

    When a frame Dynamo does not compile (a decorated function's wrapper compiled as a whole)
    calls into the recorder, the recorder must run as plain Python: compiled, its
    ``is_compiling()`` tests would fold to True and the region would vanish, and under
    ``fullgraph=True`` an unsupported call in it would be an error. A few hundred C calls, once.
    """
    codes: list[Any] = []
    for module in modules:
        codes.extend(_codes_of(module))
    return _skip_codes(codes)
