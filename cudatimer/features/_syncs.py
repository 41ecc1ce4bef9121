"""Finding host-device synchronisations: each one counted against the region open when it
happened, with the user's source line and what kind of call it was.

>>> import cudatimer
>>> with cudatimer.detect_syncs():       # doctest: +SKIP
...     with cudatimer.cuda_region("step"):
...         loss = model(x).sum()
...         print(loss.item())           # counted: kind "item", region "step", this line
>>> cudatimer.summary().sync_sites       # doctest: +SKIP

Two sources, because no single one sees everything (checked on an H200, torch 2.11):

- ``"trace"``: torch's private GPU-trace hooks (``torch._C._activate_gpu_trace()`` and the
  callback registries of ``torch.cuda._gpu_trace``, ``torch.utils._cuda_trace`` before torch 2.4).
  torch fires them from C++ before every ``cudaDeviceSynchronize`` (``torch.cuda.synchronize()``),
  ``cudaStreamSynchronize`` (``stream.synchronize()`` and every implicit sync that goes through
  ``memcpy_and_sync``: ``.item()``, ``.cpu()``, ``.tolist()``, ``print``, ``bool``, ``nonzero``,
  blocking copies) and ``cudaEventSynchronize`` (``event.synchronize()``). Activation is
  process-wide and cannot be undone in torch <= 2.13: afterwards every event record, event
  creation and allocation calls into Python (a module import and an empty callback loop, a few
  microseconds each) for the rest of the process, detection on or off. Our callbacks are removed
  when detection stops, so what stays is that cost, never a count.
- ``"debug_mode"``: the public ``torch.cuda.set_sync_debug_mode("warn")``; torch then warns
  "called a synchronizing CUDA operation" at every implicit sync and stream sync, but not at
  ``torch.cuda.synchronize()`` or ``event.synchronize()``. Nothing lasts after it stops, but it
  changes process-wide Python warning state while on: an ``"always"`` filter for that message at
  the front of ``warnings.filters`` (the default filter would show, hence count, one per line)
  and a ``warnings.showwarning`` hook that counts them and keeps them off stderr. Code that
  silences or records warnings itself (``warnings.catch_warnings``) hides its syncs from it.

``"auto"`` (the default) takes the trace where this torch has it and the debug mode otherwise.
The two are never combined: every sync that warns also fires the stream trace, so both would
count ``.item()`` twice. Everything changed is put back when detection stops.

Attribution: a sync is counted on the thread that caused it, against the innermost region open
on that thread, in every live Timer that has one open (or only the Timer given to
``detect_syncs``). The location is ``file:line`` of the first frame outside torch and
cudatimer. A sync whose innermost frame outside torch is cudatimer's own code (reports,
harvesting, the enter/exit hooks) is never counted; cudatimer's wrappers around user functions
(``_wrap.py``) are looked through, not treated as cudatimer's own work.
"""

from __future__ import annotations

import ast
import dis
import importlib
import linecache
import os
import re
import sys
import threading
import warnings
import weakref
from collections.abc import Callable
from types import CodeType, FrameType, TracebackType
from typing import Any

import torch

from ..regions._timer import Timer, live_timers

__all__ = ["SOURCES", "SyncDetection", "detect_syncs"]

#: What ``detect_syncs(source=...)`` accepts.
SOURCES = ("auto", "trace", "debug_mode")

#: The text of torch's sync-debug-mode warning (TORCH_WARN in c10/cuda/CUDAFunctions.cpp).
SYNC_WARNING = "called a synchronizing CUDA operation"

# Kinds named after the mechanism, when the call at the user's line says nothing better.
_DEVICE, _STREAM, _EVENT, _IMPLICIT = "device", "stream", "event", "implicit"
_DEFAULT_KIND = {
    _DEVICE: "synchronize",
    _STREAM: "implicit",
    _EVENT: "event.synchronize",
    _IMPLICIT: "implicit",
}
_SYNCHRONIZE_KIND = {
    _DEVICE: "synchronize",
    _STREAM: "stream.synchronize",
    _EVENT: "event.synchronize",
    _IMPLICIT: "stream.synchronize",  # of the syncs that warn, only a stream's is named so
}

# -- where a frame's code lives ---------------------------------------------------------------
_USER, _LIBRARY, _OWN = 0, 1, 2
# The package's folder (this file is in its features/ folder): every cudatimer file.
_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
#: Frames in these directories are looked through (the location is outside them). Tests add
#: a fake library here.
LIBRARY_DIRS: list[str] = [os.path.dirname(os.path.abspath(torch.__file__)) + os.sep]
# cudatimer files whose frames run user code (wrappers) or are this module: looked through.
_TRANSPARENT = {
    os.path.join(_HERE, "regions", "_wrap.py"),
    os.path.join(_HERE, "features", "_syncs.py"),
}
# Code torch generates (torch.fx GraphModule forwards) counts as torch.
_LIBRARY_PSEUDO_FILES = ("<eval_with_key>",)
_file_kind: dict[str, int] = {}


def _warnings_files() -> set[str]:
    files = {os.path.abspath(warnings.__file__)}
    py_warnings = sys.modules.get("_py_warnings")  # Python 3.14 moved the code there
    py_file = getattr(py_warnings, "__file__", None)
    if isinstance(py_file, str):
        files.add(os.path.abspath(py_file))
    return files


_WARNINGS_FILES = _warnings_files()


def _classify(filename: str) -> int:
    kind = _file_kind.get(filename)
    if kind is not None:
        return kind
    path = os.path.abspath(filename) if not filename.startswith("<") else filename
    if path in _TRANSPARENT or path in _WARNINGS_FILES:
        kind = _LIBRARY
    elif path.startswith(_HERE):
        kind = _OWN
    elif path.startswith(_LIBRARY_PSEUDO_FILES) or any(path.startswith(d) for d in LIBRARY_DIRS):
        kind = _LIBRARY
    else:
        kind = _USER
    _file_kind[filename] = kind
    return kind


def _user_frame(frame: FrameType | None) -> FrameType | None:
    """The first frame outside torch and cudatimer, walking outwards from ``frame``; None when
    the innermost such frame is cudatimer's own code (its own waits are never counted)."""
    while frame is not None:
        kind = _classify(frame.f_code.co_filename)
        if kind == _USER:
            return frame
        if kind == _OWN:
            return None
        frame = frame.f_back
    return None


# -- what the user's line was doing ---------------------------------------------------------
_TRUTH_OPS = frozenset(
    {
        "TO_BOOL",
        "UNARY_NOT",
        "POP_JUMP_IF_FALSE",
        "POP_JUMP_IF_TRUE",
        "POP_JUMP_FORWARD_IF_FALSE",
        "POP_JUMP_FORWARD_IF_TRUE",
        "POP_JUMP_BACKWARD_IF_FALSE",
        "POP_JUMP_BACKWARD_IF_TRUE",
        "JUMP_IF_FALSE_OR_POP",
        "JUMP_IF_TRUE_OR_POP",
    }
)
_INDEX_OPS = frozenset({"BINARY_SUBSCR", "STORE_SUBSCR", "DELETE_SUBSCR"})
_LOAD_NAME_OPS = frozenset(
    {"LOAD_METHOD", "LOAD_ATTR", "LOAD_GLOBAL", "LOAD_NAME", "LOAD_FAST", "LOAD_DEREF"}
)
_SKIPPED_OPS = frozenset({"CACHE", "PRECALL", "PUSH_NULL", "KW_NAMES", "EXTENDED_ARG"})
# Sites seen so far: (code, instruction offset) -> call name. Analysed once per site, so a sync
# in a loop pays a dict lookup; capped so generated code cannot grow it without bound.
_op_names: dict[tuple[CodeType, int], str | None] = {}
_OP_NAMES_MAX = 4096


def _op_name(frame: FrameType) -> str | None:
    """What the frame's current instruction does: the called function's name (``item`` for
    ``loss.item()``, ``print`` for ``print(t)``), ``bool`` for a truth test, ``index`` for a
    subscript, or None when it cannot tell."""
    key = (frame.f_code, frame.f_lasti)
    try:
        return _op_names[key]
    except KeyError:
        pass
    try:
        name = _analyse(frame.f_code, frame.f_lasti, frame.f_globals)
    except Exception:  # source missing or unparsable, unknown bytecode: no name, no failure
        name = None
    if len(_op_names) >= _OP_NAMES_MAX:
        _op_names.clear()
    _op_names[key] = name
    return name


def _analyse(code: CodeType, lasti: int, module_globals: dict[str, Any]) -> str | None:
    before: list[dis.Instruction] = []
    current = None
    for ins in dis.get_instructions(code):
        if ins.offset > lasti:  # lasti may point into the inline caches after a CALL (3.11+)
            break
        if current is not None and current.opname not in _SKIPPED_OPS:
            before.append(current)
        current = ins
    if current is None:
        return None
    op = current.opname
    if op in _TRUTH_OPS:
        return "bool"
    if op in _INDEX_OPS:
        return "index"
    if not op.startswith("CALL"):
        return None
    positions = getattr(current, "positions", None)  # Python 3.11+
    if positions is not None and positions.lineno is not None:
        name = _called_name(code.co_filename, positions, module_globals)
        if name is not None:
            return name
    # Python 3.10, or no source: a call without arguments loads its callee just before it.
    if current.arg == 0:
        for prev in reversed(before):
            if prev.opname in _LOAD_NAME_OPS and isinstance(prev.argval, str):
                return prev.argval
            break
    return None


def _called_name(filename: str, pos: Any, module_globals: dict[str, Any]) -> str | None:
    """The function named by the call expression at ``pos`` in the source, e.g. ``item``."""
    if pos.end_lineno is None or pos.col_offset is None or pos.end_col_offset is None:
        return None
    lines = [
        linecache.getline(filename, n, module_globals).encode()
        for n in range(pos.lineno, pos.end_lineno + 1)
    ]
    if not lines or not lines[-1]:
        return None
    # Column offsets count UTF-8 bytes.
    if len(lines) == 1:
        text = lines[0][pos.col_offset : pos.end_col_offset]
    else:
        lines[0] = lines[0][pos.col_offset :]
        lines[-1] = lines[-1][: pos.end_col_offset]
        text = b"".join(lines)
    node = ast.parse(b"(" + text + b")", mode="eval").body
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return None


def _kind(mechanism: str, frame: FrameType) -> str:
    name = _op_name(frame)
    if name is None:
        return _DEFAULT_KIND[mechanism]
    if name == "synchronize":
        return _SYNCHRONIZE_KIND[mechanism]
    return name


# -- counting ---------------------------------------------------------------------------------
class _State:
    """What is on now (changed under ``lock`` only; read without it by the callbacks)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.on = False
        self.timer: weakref.ref[Timer] | None = None  # None: every live Timer
        self.requested = "auto"  # the source asked for (restored by SyncDetection.__exit__)
        self.source: _Source | None = None  # the source running


_STATE = _State()
_busy = threading.local()


def _on_sync(mechanism: str) -> int:
    """One synchronisation reported by a source on the calling thread: count it against the
    innermost open region of each target Timer on this thread. Returns how many Timers counted
    it. Its caller's frame is looked through, so a source calls it directly from its hook."""
    if not _STATE.on or getattr(_busy, "on", False):
        return 0
    ref = _STATE.timer
    if ref is not None:
        one = ref()
        timers = [one] if one is not None else []
    else:
        timers = live_timers()
    # Cheap before the stack walk: most syncs of a program happen outside any region.
    timers = [t for t in timers if t.recorder.store.enabled and t.recorder.syncs.open_here()]
    if not timers:
        return 0
    _busy.on = True
    try:
        frame = _user_frame(sys._getframe(1))
        if frame is None:
            return 0
        location = f"{frame.f_code.co_filename}:{frame.f_lineno}"
        kind = _kind(mechanism, frame)
        del frame
        return sum(1 for t in timers if t.recorder.syncs.note(kind, location))
    finally:
        _busy.on = False


def _device_synced(*_: object) -> None:
    _on_sync(_DEVICE)


def _stream_synced(*_: object) -> None:
    _on_sync(_STREAM)


def _event_synced(*_: object) -> None:
    _on_sync(_EVENT)


# -- sources -----------------------------------------------------------------------------------
class _Source:
    name = ""

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError


_TRACE_CALLBACKS: dict[str, Callable[..., None]] = {
    _DEVICE: _device_synced,
    _STREAM: _stream_synced,
    _EVENT: _event_synced,
}


class TraceHooks(_Source):
    """torch's GPU-trace callback registries (private; found by ``find_trace``)."""

    name = "trace"

    def __init__(
        self,
        activate: Callable[[], None],
        registries: dict[str, Any],
        every_registry: list[Any],
        deactivate: Callable[[], None] | None = None,
    ) -> None:
        self.activate = activate
        self.registries = registries  # mechanism -> CallbackRegistry
        self.every_registry = every_registry  # all of the module's, to tell if anyone listens
        self.deactivate = deactivate

    def start(self) -> None:
        for mechanism, registry in self.registries.items():
            cb = _TRACE_CALLBACKS[mechanism]
            if cb not in registry.callback_list:
                registry.add_callback(cb)
        self.activate()  # process-wide; a no-op when already active

    def stop(self) -> None:
        for mechanism, registry in self.registries.items():
            cb = _TRACE_CALLBACKS[mechanism]
            while cb in registry.callback_list:
                registry.callback_list.remove(cb)
        # A torch that can switch the trace off again (newer than 2.13): do so when nobody else
        # listens, so the per-event cost ends with detection.
        if self.deactivate is not None and not any(r.callback_list for r in self.every_registry):
            self.deactivate()


def _is_registry(obj: object) -> bool:
    return isinstance(getattr(obj, "callback_list", None), list)


def find_trace() -> TraceHooks | None:
    """torch's GPU-trace hooks, or None when this torch lacks them (feature-detected)."""
    activate = getattr(torch._C, "_activate_gpu_trace", None)
    if activate is None:
        return None
    layouts = (
        ("torch.cuda._gpu_trace", "{}SynchronizationCallbacks"),  # torch >= 2.4
        ("torch.utils._cuda_trace", "CUDA{}SynchronizationCallbacks"),  # torch 2.0 - 2.3
    )
    for module_name, pattern in layouts:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        registries = {
            mechanism: getattr(module, pattern.format(mechanism.capitalize()), None)
            for mechanism in (_DEVICE, _STREAM, _EVENT)
        }
        if all(_is_registry(r) for r in registries.values()):
            every = [r for r in vars(module).values() if _is_registry(r)]
            return TraceHooks(
                activate, registries, every, getattr(torch._C, "_deactivate_gpu_trace", None)
            )
    return None


class DebugModeHooks(_Source):
    """``torch.cuda.set_sync_debug_mode("warn")`` and a hook on the warning it emits."""

    name = "debug_mode"

    def __init__(self) -> None:
        self.mode_before = 0
        self.mode_set: int | None = None
        self.filters_before: list[Any] = []
        self.filters_after: list[Any] = []
        self.show_before: Any = None

    def start(self) -> None:
        cuda: Any = torch.cuda
        self.mode_before = int(cuda.get_sync_debug_mode())
        self.mode_set = None
        if self.mode_before == 0:  # "warn" or "error" set by the user stays as it is
            cuda.set_sync_debug_mode(1)
            self.mode_set = 1
        self.filters_before = list(warnings.filters)
        # filterwarnings (unlike editing warnings.filters) also invalidates the per-module
        # registries, so a line that already warned once warns again.
        warnings.filterwarnings("always", message=re.escape(SYNC_WARNING), category=UserWarning)
        self.filters_after = list(warnings.filters)
        self.show_before = warnings.showwarning
        warnings.showwarning = self._show

    def stop(self) -> None:
        if warnings.showwarning == self._show:
            warnings.showwarning = self.show_before
        filters: list[Any] = warnings.filters  # type: ignore[assignment]
        if filters == self.filters_after:
            filters[:] = self.filters_before
        else:  # someone changed the filters meanwhile: take out only ours
            ours = self.filters_after[0]
            if ours in filters:
                filters.remove(ours)
        cuda: Any = torch.cuda
        if self.mode_set is not None and int(cuda.get_sync_debug_mode()) == self.mode_set:
            cuda.set_sync_debug_mode(self.mode_before)
        self.mode_set = None

    def _show(
        self,
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: Any = None,
        line: str | None = None,
    ) -> None:
        if issubclass(category, UserWarning) and str(message).startswith(SYNC_WARNING):
            _on_sync(_IMPLICIT)
            if self.mode_before == 0:
                return  # asked for by us, not by the user: counted, not shown
        self._forward(message, category, filename, lineno, file, line)

    def _forward(self, *args: Any) -> None:
        show = self.show_before
        # Inside warnings.catch_warnings(record=True) (pytest runs every test so) the original
        # showwarning is in place and recording happens one level below it: go there.
        if show is getattr(warnings, "_showwarning_orig", None):
            impl = getattr(warnings, "_showwarnmsg_impl", None)
            if impl is not None:
                impl(warnings.WarningMessage(*args))
                return
        if show is not None:
            show(*args)


# -- switching --------------------------------------------------------------------------------
_no_cuda_told = False


def _cuda_usable() -> bool:
    cuda: Any = torch.cuda
    if getattr(cuda, "_is_in_bad_fork", lambda: False)():
        return False
    return bool(cuda.is_available())


def _tell_no_cuda() -> None:
    global _no_cuda_told
    if _no_cuda_told:
        return
    _no_cuda_told = True
    warnings.warn(
        "cudatimer.detect_syncs: CUDA is not available in this process, so there are no "
        "host-device synchronisations to find; sync detection does nothing here.",
        RuntimeWarning,
        stacklevel=4,
    )


def _pick(source: str) -> _Source:
    if source == "debug_mode":
        return DebugModeHooks()
    trace = find_trace()
    if trace is None and source == "trace":
        raise RuntimeError(
            f"cudatimer.detect_syncs(source='trace'): torch {torch.__version__} has no GPU-trace "
            "hooks (torch._C._activate_gpu_trace and torch.cuda._gpu_trace); use "
            "source='debug_mode' (implicit syncs only) or source='auto'"
        )
    return trace if trace is not None else DebugModeHooks()


def _apply(enabled: bool, timer: weakref.ref[Timer] | None, source: str) -> _Source | None:
    """Make (enabled, timer, source) the setting in force; returns the running source."""
    state = _STATE
    with state.lock:
        if enabled and not _cuda_usable():
            _tell_no_cuda()
            enabled = False
        running = state.source
        if not enabled:
            state.on = False
            if running is not None:
                state.source = None
                running.stop()
        else:
            wanted = _pick(source)
            if running is None or running.name != wanted.name:
                if running is not None:
                    state.on = False
                    state.source = None
                    running.stop()
                wanted.start()
                state.source = wanted
            state.on = True
        state.timer = timer
        state.requested = source
        return state.source


class SyncDetection:
    """What :func:`detect_syncs` returns: the setting it put in force, and a context manager
    that puts the previous setting back on exit.

    ``source`` is the source counting now: ``"trace"``, ``"debug_mode"``, or None when nothing
    is counted (detection off, or no CUDA).
    """

    __slots__ = ("_previous", "enabled", "source", "timer")

    def __init__(
        self,
        previous: tuple[bool, weakref.ref[Timer] | None, str],
        enabled: bool,
        timer: Timer | None,
        source: str | None,
    ) -> None:
        self._previous = previous
        self.enabled = enabled
        self.timer = timer
        self.source = source

    @property
    def active(self) -> bool:
        """True while this setting counts syncs (False without CUDA)."""
        return self.source is not None

    def __enter__(self) -> SyncDetection:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        _apply(*self._previous)

    def __repr__(self) -> str:
        timer = "every Timer" if self.timer is None else repr(self.timer.name)
        return f"SyncDetection(enabled={self.enabled}, source={self.source!r}, timer={timer})"


def detect_syncs(
    enabled: bool = True, *, timer: Timer | None = None, source: str = "auto"
) -> SyncDetection:
    """Count host-device synchronisations per region, with the source line that caused each.

    A switch and a context manager: ``cudatimer.detect_syncs()`` turns detection on until
    ``cudatimer.detect_syncs(False)``; ``with cudatimer.detect_syncs(): ...`` turns it on for
    the block and puts the previous setting back after it. Each sync is counted against the
    innermost region open on the thread that caused it, in every live Timer (or only ``timer``).
    Results: ``RegionStats.syncs`` and ``Summary.sync_sites`` (location, kind, region, count).

    ``source``: ``"auto"`` (torch's GPU-trace hooks where this torch has them: every device,
    stream and event sync; else the sync debug mode), ``"trace"`` (those hooks or a
    RuntimeError), ``"debug_mode"`` (``torch.cuda.set_sync_debug_mode("warn")``: implicit syncs
    such as ``.item()`` and ``.cpu()`` and ``stream.synchronize()``, not
    ``torch.cuda.synchronize()`` nor ``event.synchronize()``; nothing lasts after it stops).
    Once the trace hooks have been on, torch keeps calling into Python at every event record
    and allocation for the rest of the process (a few microseconds each): detect in a
    diagnostic run, time in another. Without CUDA this does nothing and says so once.

    >>> import cudatimer
    >>> with cudatimer.detect_syncs():  # doctest: +SKIP
    ...     train_step()
    >>> cudatimer.report()  # doctest: +SKIP
    """
    if not isinstance(enabled, bool):
        raise TypeError(f"enabled must be a bool, got {type(enabled).__name__} ({enabled!r})")
    if timer is not None and not isinstance(timer, Timer):
        raise TypeError(f"timer must be a cudatimer.Timer or None, got {type(timer).__name__}")
    if source not in SOURCES:
        raise ValueError(f"source must be one of {', '.join(SOURCES)}; got {source!r}")
    with _STATE.lock:
        previous = (_STATE.on, _STATE.timer, _STATE.requested)
        running = _apply(enabled, weakref.ref(timer) if timer is not None else None, source)
    return SyncDetection(previous, enabled, timer, running.name if running is not None else None)
