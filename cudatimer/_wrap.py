"""Decorating callables with a Region: functions, methods, class/static methods, modules,
coroutine functions and generator functions. Decided at decoration time, never per call."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any

from ._config import DISABLED_AT_IMPORT

if TYPE_CHECKING:
    from ._timer import Region, Timer


def wrap(fn: Any, region: Region) -> Any:
    """Return ``fn`` timed by ``region`` (same signature, ``functools.wraps`` metadata)."""
    if isinstance(fn, (classmethod, staticmethod)):
        return type(fn)(wrap(fn.__func__, region))
    if _is_module(fn):
        fn.forward = wrap(fn.forward, region)
        return fn
    if not callable(fn):
        raise TypeError(f"cannot time {fn!r}: expected a function, method or nn.Module")
    timer = region.timer
    enter, leave = timer._enter, timer._exit

    if inspect.isasyncgenfunction(fn):
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
            token = timer._begin(region)
            try:
                return await fn(*args, **kwargs)
            finally:
                timer._end(region, token)

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

    @functools.wraps(fn)
    def timed_function(*args: Any, **kwargs: Any) -> Any:
        if not timer._enabled:
            return fn(*args, **kwargs)
        enter(region)
        try:
            result = fn(*args, **kwargs)
        except BaseException:
            leave(region, False)
            raise
        leave(region, True)
        return result

    return timed_function


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
