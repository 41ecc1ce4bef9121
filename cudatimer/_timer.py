"""The recorder: Timer, Region and the one pair of enter/exit hooks everything shares.

Per-call state lives on a per-thread stack of tuples, never on a shared object, so one Region
(cached per name) can be entered recursively and from many threads at once. The hot path does,
per region: a thread-local read, a dict lookup for the path, an NVTX push/pop with cached
attributes, one stream lookup (a tuple from C, a dict hit), two pooled event records on that
stream, two host clock reads and a deque append. No synchronisation, no allocation of events,
no Python Stream objects. With the compiled module (``_speedups``) the same steps run in C:
Region's base type supplies ``__enter__``/``__exit__`` (see ``use_compiled``). Everything else
(resolving events, statistics, reports) happens when a sample is harvested (every
HARVEST_BATCH exits, without blocking) or when a report is asked.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import sys
import threading
import time
import warnings
import weakref
from array import array
from collections import deque
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any, Literal, TypedDict, TypeVar

import torch
from typing_extensions import Unpack  # a dependency of torch; imported for get_type_hints

from . import _cuda, _steps
from ._config import DISABLED_AT_IMPORT, PURE_PYTHON
from ._hist import HistBuilder
from ._nvtx import Domain, resolve_color
from ._records import RegionStats, StepStats, Summary, SyncSite

F = TypeVar("F", bound=Callable[..., Any])
Mode = Literal["full", "nvtx", "events"]
Clock = Literal["auto", "host"]
_MODES = ("full", "nvtx", "events")
_CLOCKS = ("auto", "host")


class RegionOptions(TypedDict, total=False):
    """The options of ``Timer.region`` (see there)."""

    mode: Mode | None
    color: int | str | None
    category: int | str | None
    payload: float | None
    clock: Clock | None
    streams: Iterable[Any] | None
    every: int | None


_REGION_OPTIONS = frozenset(RegionOptions.__annotations__)

_perf_ns = time.perf_counter_ns
_FOLD = HistBuilder.FOLD
_NAN = float("nan")
_get_ident = threading.get_ident
# Dynamo folds both to True while it traces. is_dynamo_compiling is one Python frame that
# returns False (0.017 us); is_compiling is two (0.047 us), and in a launch-bound loop every
# frame counts several times over (cold caches): the inlined hot path uses the cheaper one.
_is_compiling: Callable[[], bool] = getattr(
    getattr(torch, "compiler", None), "is_compiling", lambda: False
)
_is_dynamo_compiling: Callable[[], bool] = getattr(
    getattr(torch, "compiler", None), "is_dynamo_compiling", _is_compiling
)
_BACKEND = _cuda.BACKEND
_LOCK = _cuda.LOCK
_get_stream: Any = _cuda._get_stream
_CURRENT_DEVICE = _cuda.CURRENT_DEVICE
_USABLE = _cuda.USABLE
_ENTRIES = _BACKEND.entries  # the same dict for the life of the process (see Backend)
_StreamEntry = _cuda.StreamEntry
# Pops a pooled event and records it on the entry's stream: compiled (one C call, ~0.3 us
# less per record than torch's binding) or Python; use_compiled rebinds it.
_take_recorded: Any = _cuda.take_recorded
_speedups: Any = _cuda._speedups
_Ends = _cuda.Ends

# Frame kinds, stored in the t0 slot when no host time is taken.
_OFF = -1  # timer disabled at enter: exit pops the frame and nothing else
_NVTX_ONLY = -2  # mode="nvtx": exit pops the NVTX range only
_UNTIMED = -3  # every=N, a call not sampled: exit counts it (clock in the entry slot), pops NVTX
_SKIP = object()  # start-event slot of a frame entered while its stream was capturing

# Region.warned bits: each kind of warning once per region.
_W_STREAM = 1
_W_DEVICE = 2
_W_SIDE_DEVICE = 4


class _Acc:
    """Running statistics of one region path on one clock."""

    __slots__ = ("calls", "cpu", "gpu", "skipped")

    def __init__(self) -> None:
        self.calls = 0
        self.skipped = 0
        self.gpu = HistBuilder()
        self.cpu = HistBuilder()


class _Node:
    """One region path of one Timer (``outer/inner``); children by name."""

    __slots__ = ("children", "depth", "gen", "last", "name", "owner", "path", "stats", "syncs")

    def __init__(self, owner: Timer, name: str, parent: _Node | None) -> None:
        self.owner = owner
        self.gen = owner._gen  # reset() bumps the Timer's generation: older nodes are dead
        # (step, clock, per-step series, the step's sample count): see Timer._keep_sample
        self.last: tuple[int, str, Any, list[int]] | None = None
        self.syncs = 0
        self.name = name
        self.path: str = name if parent is None or parent.path == "" else f"{parent.path}/{name}"
        self.depth: int = 0 if parent is None or parent.path == "" else parent.depth + 1
        self.children: dict[str, _Node] = {}
        self.stats: dict[str, _Acc] = {}

    def child(self, name: str) -> _Node:
        node = self.children.get(name)
        if node is None:
            node = self.children.setdefault(name, _Node(self.owner, name, self))
        return node

    def add(self, clock: str, gpu_ms: float | None, cpu_ms: float, skipped: bool) -> None:
        """Fold one finished sample into the running statistics; callers hold ``_cuda.LOCK``."""
        acc = self.stats.get(clock)
        if acc is None:
            acc = self.stats[clock] = _Acc()
        acc.calls += 1
        # HistBuilder.add written out (two Python calls fewer per sample at harvest time).
        if gpu_ms is not None:
            raw = acc.gpu.raw
            raw.append(gpu_ms)
            if len(raw) >= _FOLD:
                acc.gpu.fold()
        if skipped:
            acc.skipped += 1
        raw = acc.cpu.raw
        raw.append(cpu_ms)
        if len(raw) >= _FOLD:
            acc.cpu.fold()

    def count(self, clock: str) -> None:
        """Count a call that was not timed (``every=N``); callers hold ``_cuda.LOCK``."""
        acc = self.stats.get(clock)
        if acc is None:
            acc = self.stats[clock] = _Acc()
        acc.calls += 1


class _Stack(list):  # type: ignore[type-arg]
    """A thread's open regions; carries the thread's id, read once, for every sample's trace."""

    __slots__ = ("tid",)

    def __init__(self) -> None:
        super().__init__()
        self.tid = _get_ident()


class _Local(threading.local):
    def __init__(self) -> None:
        # The compiled path keeps its frames in a C Stack (a list of tuples to Python code).
        self.stack: Any = _speedups.Stack() if compiled() else _Stack()


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def _user_stacklevel() -> int:
    """The ``stacklevel`` of warnings.warn that points at the first frame outside cudatimer
    (the compiled and Python hooks put a different number of frames in between)."""
    frame = sys._getframe(1)
    level = 1
    while frame is not None and os.path.dirname(frame.f_code.co_filename) == _PACKAGE_DIR:
        frame = frame.f_back  # type: ignore[assignment]
        level += 1
    return level


def _check_name(name: object, what: str = "name") -> str:
    if not isinstance(name, str):
        raise TypeError(f"{what} must be a str, got {type(name).__name__} ({name!r})")
    if not name or not name.strip():
        raise ValueError(f"{what} must be a non-empty string")
    if "/" in name:
        raise ValueError(
            f"{what} {name!r} contains '/', which separates nesting levels in region paths; "
            "nest regions instead, or use another separator such as '.'"
        )
    return name


def _check_streams(streams: object) -> tuple[tuple[tuple[int, int, int], Any], ...]:
    """Validate ``streams=`` (done once, at region creation) into ((stream key, Stream), ...)."""
    if streams is None:
        return ()
    stream_type = tuple(t for t in (getattr(torch, "Stream", None), torch.cuda.Stream) if t)
    if isinstance(streams, stream_type):
        raise TypeError("streams must be a list or tuple of streams; wrap one in a list: [s]")
    if isinstance(streams, (str, bytes)):
        raise TypeError(
            f"streams must be a list or tuple of torch.cuda.Stream, got {type(streams).__name__}"
        )
    try:
        items = list(streams)  # type: ignore[call-overload]
    except TypeError:
        raise TypeError(
            f"streams must be a list or tuple of torch.cuda.Stream, got {type(streams).__name__}"
        ) from None
    keys = []
    for item in items:
        if not isinstance(item, stream_type):
            raise TypeError(
                f"streams must hold torch.cuda.Stream objects, got {type(item).__name__} "
                f"({item!r})"
            )
        if item.device_type != 1:  # c10::DeviceType::CUDA
            raise ValueError(f"streams must be CUDA streams, got {item!r}")
        key = (int(item.stream_id), int(item.device_index), int(item.device_type))
        keys.append((key, item))
    return tuple(keys)


# With the compiled module, Region's __enter__/__exit__ come from its C base (one C call each,
# no Python frame); use_compiled() switches between those and the Python ones below.
_RegionBase: Any = _speedups.RegionBase if _speedups is not None else object


class Region(_RegionBase):  # type: ignore[misc]
    """A named region of a Timer: a context manager and a decorator.

    One Region object serves every call (state of each call lives on the calling thread's
    stack), so ``cuda_region("x")`` returns a cached object and costs a dict lookup.

    >>> import cudatimer
    >>> with cudatimer.cuda_region("load"):
    ...     pass
    >>> @cudatimer.cuda_region("step")
    ... def step():
    ...     pass
    """

    __slots__ = (
        "attrs",
        "counter",
        "domain",
        "events",
        "every",
        "fast",
        "name",
        "nvtx",
        "streams",
        "timer",
        "timing",
        "warned",
    )

    def __init__(
        self,
        timer: Timer,
        name: str,
        mode: Mode,
        color: int,
        category: int | str | None,
        payload: float | None,
        clock: Clock,
        streams: tuple[tuple[tuple[int, int, int], Any], ...] = (),
        every: int = 1,
    ) -> None:
        self.timer = timer
        self.name = name
        self.domain = timer.domain
        # Decided here, once, so the hot path tests plain attributes: attrs is None when NVTX is
        # off, no tool is attached, or mode="events".
        self.attrs = (
            self.domain.attributes(name, color, category, payload) if mode != "events" else None
        )
        self.nvtx = self.attrs is not None
        self.timing = mode != "nvtx"  # mode="nvtx": a range in Nsight, nothing recorded
        self.events = self.timing and clock != "host"
        self.warned = 0  # _W_* bits: warnings already given for this region
        # Side streams whose work the GPU time must cover: ((stream key, Stream), ...). Empty
        # for almost every region; the exit tests it before taking the slower branch.
        self.streams = streams
        # every=N: time one call in N (all counted). The call counter is shared by every Region
        # of this name and rate in the Timer, so `with cuda_region("x", every=8):` in a loop
        # samples too; next() on itertools.count is atomic under the GIL, so exact in threads.
        self.every = every
        self.counter: Any = timer._sampler(name, every) if every != 1 else None
        # Decided once: may this region take the inlined hot path of __enter__/__exit__?
        self.fast = self.events and not streams and every == 1
        if _speedups is not None:
            self._bind(
                timer._core,
                self.fast,
                name,
                self.domain.push if self.nvtx else None,
                self.attrs,
                self.domain.pop if self.nvtx else None,
            )

    # The hot path. Enter and exit are written out here, for the common case (a timing region
    # with no side streams, its Timer on, CUDA in use, the default stream or a known one),
    # with no further Python calls: at ~0.1 us per call, the general path's helper calls cost
    # more than everything else around the two event records. Anything else goes through
    # Timer._enter/_exit, which handle every case.
    #
    # No Dynamo check here: Dynamo never inlines these two. A Region made outside compiled
    # code is an unsupported context manager to it (a graph break: it runs eagerly), regions
    # made inside it are nullcontext (Timer.region checks), and the decorator's wrapper checks
    # before calling them. That saves two Python frames per region (~0.5 us in a busy loop).
    def __enter__(self) -> Region:
        timer = self.timer
        if not (self.fast and timer._enabled and _BACKEND.state == _USABLE):
            timer._enter(self)
            return self
        stack = timer._local.stack
        parent = stack[-1][1] if stack else timer._root
        node = parent.children.get(self.name)
        if node is None:
            node = parent.child(self.name)
        key = _get_stream(_CURRENT_DEVICE)
        entry = _ENTRIES.get(key)
        if entry is None or key[0] != 0:
            # A new stream, or a side stream that may be capturing a CUDA graph.
            timer._enter(self)
            return self
        if self.nvtx:
            self.domain.push(self.attrs)
        try:
            pool = entry.pool
            start = pool.pop() if pool else entry.make_event()
            start.record(entry.stream)
        except BaseException:
            if self.nvtx:
                self.domain.pop()
            raise
        stack.append((self, node, entry, start, _perf_ns()))
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        t1 = _perf_ns()
        timer = self.timer
        stack = timer._local.stack
        if stack:
            frame = stack[-1]
            entry = frame[2]
            # Fast only for frames the fast enter made, still on the stream they started on.
            if (
                frame[0] is self
                and type(entry) is _StreamEntry
                and not self.streams
                and _get_stream(_CURRENT_DEVICE) == entry.key
            ):
                del stack[-1]
                try:
                    pool = entry.pool
                    end = pool.pop() if pool else entry.make_event()
                    end.record(entry.stream)
                    pend = entry.pending
                    # Raw clock reads: the harvest turns them into milliseconds, off this path.
                    pend.append((frame[1], frame[3], end, frame[4], t1, timer._step, stack.tid))
                    if len(pend) >= entry.check_at:
                        _BACKEND.try_harvest(entry)
                finally:
                    if self.nvtx:
                        self.domain.pop()
                return
        timer._exit(self, exc_type is None)

    def __call__(self, fn: F) -> F:
        from ._wrap import wrap

        wrapped: F = wrap(fn, self)
        return wrapped

    def __repr__(self) -> str:
        return f"Region({self.name!r}, timer={self.timer.name!r})"


class _SampledRegion(Region):
    """A region with ``every=N``: its own enter hook decides, so plain regions pay nothing."""

    __slots__ = ()

    def __enter__(self) -> Region:
        self.timer._enter_sampled(self)
        return self


class _NullRegion:
    """What regions become when ``CUDATIMER_DISABLE`` is set: nothing on enter, exit or call."""

    __slots__ = ()
    name = ""

    def __enter__(self) -> _NullRegion:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def __call__(self, fn: F) -> F:
        return fn


# The compiled twin (C enter/exit/call) when the module is built: what `with cuda_region()`
# costs under CUDATIMER_DISABLE is then the with statement around a C object.
NULL_REGION: _NullRegion = (
    _speedups.NullRegion() if _speedups is not None and not PURE_PYTHON else _NullRegion()
)

# The compiled hot path: RegionBase.__enter__/__exit__ (C) do the common case of the Python
# hooks above in one C call each, with the stack, statistics and harvest of that case in C
# (see _speedups.c), and call Timer._enter/_exit for everything else.
_PY_ENTER = Region.__enter__
_PY_EXIT = Region.__exit__


def use_compiled(on: bool) -> bool:
    """Use the compiled hot path (``on``, where it was built) or the Python one; returns
    whether the compiled one is now in use. Applies to regions entered from now on, on threads
    (and Timers) whose stack is made from now on; switch only while no region is open. Meant for
    tests and benchmarks."""
    global _take_recorded
    active = bool(on) and _speedups is not None
    _cuda.set_compiled(active)
    _take_recorded = _cuda.take_recorded
    if active:
        for hook in ("__enter__", "__exit__"):
            if hook in Region.__dict__:
                delattr(Region, hook)
    else:
        setattr(Region, "__enter__", _PY_ENTER)  # noqa: B010
        setattr(Region, "__exit__", _PY_EXIT)  # noqa: B010
    return active


def compiled() -> bool:
    """True when regions run the compiled hot path."""
    return _speedups is not None and "__enter__" not in Region.__dict__


use_compiled(not PURE_PYTHON)


class Timer:
    """An independent registry of regions with its own NVTX domain and results.

    >>> import cudatimer
    >>> timer = cudatimer.Timer(name="data")
    >>> with timer.region("decode"):
    ...     pass
    >>> timer.summary()["decode"].calls
    1
    """

    def __init__(
        self,
        name: str = "default",
        *,
        domain: str = "cudatimer",
        mode: Mode = "full",
        clock: Clock = "auto",
        enabled: bool = True,
        keep_steps: int = 1000,
        trace_samples: int = 4096,
    ) -> None:
        _check_name(name, "name")
        for arg, value in (("keep_steps", keep_steps), ("trace_samples", trace_samples)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{arg} must be an int, got {type(value).__name__}")
            if value < 0:
                raise ValueError(f"{arg} must be >= 0, got {value}")
        _check_name(domain, "domain")
        if mode not in _MODES:
            raise ValueError(f"mode must be one of {', '.join(_MODES)}; got {mode!r}")
        if clock not in _CLOCKS:
            raise ValueError(f"clock must be one of {', '.join(_CLOCKS)}; got {clock!r}")
        if not isinstance(enabled, bool):
            raise TypeError(f"enabled must be a bool, got {type(enabled).__name__}")
        self.name = name
        # With CUDATIMER_DISABLE no NVTX call is made at all (not even creating the domain).
        self.domain = Domain(domain, enabled=not DISABLED_AT_IMPORT)
        self.mode: Mode = mode
        self.clock: Clock = clock
        self._enabled = enabled
        self._local = _Local()
        # The compiled path's side of this Timer: switches, statistics and samples it records.
        self._core: Any = None
        if _speedups is not None:
            self._core = _speedups.Core(
                self._local, keep_steps, trace_samples, _steps.STEP_SAMPLE_CAP
            )
        if self._core is not None:
            self._core.enabled = enabled
        self._gen = 0
        self._root = _Node(self, "", None)
        self._regions: dict[str, Region] = {}  # NULL_REGION under CUDATIMER_DISABLE
        self._samplers: dict[tuple[str, int], itertools.count[int]] = {}  # every=N call counters
        self._step = 0
        # Per-step raw samples of the last ``keep_steps`` steps: {step: {(path, clock): (gpu
        # ms, cpu ms)}}. Raw values (8 bytes each) make window reports exact; whole-run
        # statistics live in the nodes and never depend on this window.
        self.keep_steps = keep_steps
        self._steps: dict[int, dict[tuple[str, str], tuple[array[float], array[float]]]] = {}
        # Raw samples taken per kept step so far, one shared cell per step (see _keep_sample).
        # Past STEP_SAMPLE_CAP the step's raw samples are dropped (a run that never calls
        # step() is all step 0), so memory stays bounded: see _dropped_steps.
        self._step_counts: dict[int, list[int]] = {}
        # The last ``trace_samples`` samples, for trace export: (path, clock, entry, GPU start
        # on the host clock in ns or None, gpu ms, host start ns, cpu ms, step, thread id).
        self.trace_samples = trace_samples
        self._trace: deque[tuple[Any, ...]] = deque()
        # Synchronisations seen by detect_syncs(): {(location, kind, region path): count}.
        self._sync_sites: dict[tuple[str, str, str], int] = {}
        _TIMERS.add(self)

    # -- building regions -------------------------------------------------------------------
    def region(self, name: str, **options: Unpack[RegionOptions]) -> Region:
        """A region named ``name``: ``with timer.region("fwd"):`` or ``@timer.region("fwd")``.

        Options: ``mode`` ("full": events and NVTX; "nvtx": NVTX range only, no events;
        "events": no NVTX), ``color`` (a name or 0xRRGGBB; default: stable per name),
        ``category`` (int or str, NVTX category), ``payload`` (int or float shown on the NVTX
        range, e.g. a step number), ``clock`` ("auto": CUDA events when CUDA is in use, else
        the host clock; "host": always the host clock, for CPU-only code), ``streams`` (CUDA
        streams the region's work also runs on: an end event is recorded on each at exit and
        the GPU time runs to the latest; no stream is made to wait), ``every`` (time one call
        in ``every``, count them all: for hot code; ``calls`` counts every call, the times
        cover the timed ones).

        >>> import cudatimer
        >>> t = cudatimer.Timer(name="sampled")
        >>> hot = t.region("hot", every=4)
        >>> for _ in range(8):
        ...     with hot:
        ...         pass
        >>> r = t.summary()["hot"]
        >>> r.calls, r.cpu.count
        (8, 2)
        """
        plain = True  # no options (or all None): the region is cached by name
        if options:
            unknown = options.keys() - _REGION_OPTIONS
            if unknown:
                raise TypeError(
                    f"region() got unknown option(s) {', '.join(sorted(unknown))}; "
                    f"the options are {', '.join(RegionOptions.__annotations__)}"
                )
            plain = all(v is None for v in options.values())
        if plain:
            # `with timer.region("x"):` in a loop: a cache hit. Options go in **options so this
            # case tests one dict instead of seven defaults: 0.07 us instead of 0.14 (measured).
            try:
                cached = self._regions.get(name)
            except TypeError:
                cached = None
            if cached is not None and not _is_dynamo_compiling():
                return cached
        return self._region(name, plain, **options)

    def _region(
        self,
        name: str,
        plain: bool,
        *,
        mode: Mode | None = None,
        color: int | str | None = None,
        category: int | str | None = None,
        payload: float | None = None,
        clock: Clock | None = None,
        streams: Iterable[Any] | None = None,
        every: int | None = None,
    ) -> Region:
        """``region`` past its cache: checks the options and makes the region (cached by name
        when ``plain``: no options, or all None)."""
        if _is_compiling():
            # Dynamo traces this call (`with cuda_region(...)` in compiled code). It cannot
            # enter a context manager made outside the traced code (an error under
            # fullgraph=True), but it can one made inside: the region is left out of the graph.
            return contextlib.nullcontext()  # type: ignore[return-value]
        if plain:
            if DISABLED_AT_IMPORT:
                # Cached like a real region, so `with cuda_region("x"):` is one dict hit and
                # an empty C enter/exit: +114 ns a call, 576 ns when every call came down here
                # (benchmarks/disabled_cost.py).
                self._regions[_check_name(name)] = NULL_REGION  # type: ignore[assignment]
                return NULL_REGION  # type: ignore[return-value]
            region = self._make(name, self.mode, None, None, None, self.clock)
            self._regions[name] = region
            return region
        made = self._make(
            name,
            self.mode if mode is None else mode,
            color,
            category,
            payload,
            self.clock if clock is None else clock,
            streams,
            every,
        )
        # With CUDATIMER_DISABLE the options are still checked, and the region does nothing.
        return NULL_REGION if DISABLED_AT_IMPORT else made  # type: ignore[return-value]

    def _sampler(self, name: str, every: int) -> itertools.count[int]:
        counter = self._samplers.get((name, every))
        if counter is None:
            counter = self._samplers.setdefault((name, every), itertools.count())
        return counter

    def _make(
        self,
        name: object,
        mode: object,
        color: object,
        category: object,
        payload: object,
        clock: object,
        streams: object = None,
        every: object = None,
    ) -> Region:
        name = _check_name(name)
        keys = _check_streams(streams)
        if every is None:
            every = 1
        if isinstance(every, bool) or not isinstance(every, int):
            raise TypeError(
                f"every must be an int N >= 1 (time 1 call in N), got {type(every).__name__} "
                f"({every!r})"
            )
        if every < 1:
            raise ValueError(f"every must be >= 1 (every=1 times every call), got {every}")
        if mode not in _MODES:
            raise ValueError(f"mode must be one of {', '.join(_MODES)}; got {mode!r}")
        if clock not in _CLOCKS:
            raise ValueError(f"clock must be one of {', '.join(_CLOCKS)}; got {clock!r}")
        if category is not None and (
            isinstance(category, bool) or not isinstance(category, (int, str))
        ):
            raise TypeError(f"category must be an int or a str, got {type(category).__name__}")
        if isinstance(category, int) and category < 0:
            raise ValueError(f"category must be >= 0, got {category}")
        if payload is not None and (
            isinstance(payload, bool) or not isinstance(payload, (int, float))
        ):
            raise TypeError(f"payload must be an int or a float, got {type(payload).__name__}")
        rgb = resolve_color(name, color)
        if every != 1 and mode != "nvtx":
            return _SampledRegion(
                self, name, mode, rgb, category, payload, clock, keys, every  # type: ignore[arg-type]
            )
        return Region(self, name, mode, rgb, category, payload, clock, keys)  # type: ignore[arg-type]

    def timed(self, fn: Any = None, /, name: str | None = None, **options: Any) -> Any:
        """Decorator: ``@timer.timed``, ``@timer.timed("name")`` or ``@timer.timed(name=...)``.

        The default name is the function's ``__qualname__`` (``Model.forward``).
        """
        from ._wrap import timed

        return timed(self, fn, name, options)

    # -- switches -----------------------------------------------------------------------------
    def enable(self) -> None:
        """Turn timing back on (regions entered from now on are recorded)."""
        if DISABLED_AT_IMPORT:
            warnings.warn(
                "cudatimer: CUDATIMER_DISABLE is set, so regions were made no-ops at import; "
                "enable() has no effect. Unset CUDATIMER_DISABLE to time regions.",
                RuntimeWarning,
                stacklevel=2,
            )
        self._enabled = True
        if self._core is not None:
            self._core.enabled = True

    def disable(self) -> None:
        """Stop timing: regions entered from now on do no timing and emit no NVTX."""
        self._enabled = False
        if self._core is not None:
            self._core.enabled = False

    @property
    def enabled(self) -> bool:
        return self._enabled and not DISABLED_AT_IMPORT

    def mark(
        self,
        name: str,
        *,
        color: int | str | None = None,
        category: int | str | None = None,
        payload: float | None = None,
    ) -> None:
        """An instant NVTX marker in this Timer's domain (e.g. ``timer.mark("checkpoint")``).

        Markers are rare, so attributes are built per call; nothing is recorded for reports.
        """
        _check_name(name)
        probe = self._make(name, "full", color, category, payload, "auto")  # validates options
        if self._enabled and probe.attrs is not None:
            self.domain.mark(probe.attrs)

    def step(self) -> int:
        """Mark an iteration boundary; returns the new step number."""
        self._step += 1
        if self._core is not None:
            self._core.step = self._step
        return self._step

    # -- the hot path ---------------------------------------------------------------------------
    def _enter(self, r: Region) -> None:
        if _is_compiling():
            # Dynamo would trace into thread-locals and event objects and crash or lose them
            # (seen with torch 2.11); inside a compiled graph the region does nothing.
            return
        stack = self._local.stack
        node = (stack[-1][1] if stack else self._root).child(r.name)
        if not self._enabled:
            stack.append((r, node, None, None, _OFF))
            return
        if r.nvtx:
            r.domain.push(r.attrs)
        if not r.timing:
            stack.append((r, node, None, None, _NVTX_ONLY))
            return
        if not r.events:
            stack.append((r, node, None, None, _perf_ns()))
            return
        if _BACKEND.state == _cuda.USABLE or _BACKEND.probe():
            try:
                entry = _BACKEND.current_entry()
                if entry is None:  # capturing a CUDA graph: host time only, counted as skipped
                    stack.append((r, node, None, _SKIP, _perf_ns()))
                    return
                start = _take_recorded(entry)
            except BaseException:
                if r.nvtx:
                    r.domain.pop()
                raise
            stack.append((r, node, entry, start, _perf_ns()))
            return
        stack.append((r, node, None, None, _perf_ns()))

    def _enter_sampled(self, r: Region) -> None:
        """Enter hook of ``every=N`` regions: time call 0, N, 2N...; count the others."""
        if _is_compiling():
            return
        if next(r.counter) % r.every == 0:
            self._enter(r)
            return
        stack = self._local.stack
        node = (stack[-1][1] if stack else self._root).child(r.name)
        if not self._enabled:
            stack.append((r, node, None, None, _OFF))
            return
        # A frame like any other (inner regions nest under it), without events or host time.
        clock = _BACKEND.clock_now(r.events)
        if r.nvtx:
            r.domain.push(r.attrs)
        stack.append((r, node, clock, None, _UNTIMED))

    def _exit(self, r: Region, clean: bool) -> None:
        if _is_compiling():
            return
        t1 = _perf_ns()
        stack = self._local.stack
        try:
            frame = stack.pop()
        except IndexError:
            raise RuntimeError(
                f"cudatimer: region {r.name!r} exited on a thread where no region is open "
                "(was __exit__ called twice, or from another thread than __enter__?)"
            ) from None
        if frame[0] is not r:
            frame = self._out_of_order(r, frame, stack)
            self._finish(frame, t1)
            if clean:
                raise RuntimeError(
                    f"cudatimer: region {r.name!r} was closed while a region opened inside it "
                    f"({stack[-1][0].name!r}) is still open; close regions in reverse order. "
                    "Both are still recorded."
                )
            return
        self._finish(frame, t1)

    def _begin(self, r: Region) -> tuple[Any, ...] | None:
        """Open a detached region (async functions): not on the thread's stack, NVTX
        start/end instead of push/pop; its parent is the region open on this thread now."""
        if _is_compiling() or not self._enabled:
            return None
        stack = self._local.stack
        node = (stack[-1][1] if stack else self._root).child(r.name)
        range_id = r.domain.start(r.attrs) if r.nvtx else None
        if not r.timing:
            return (r, node, None, None, _NVTX_ONLY, range_id)
        if r.counter is not None and next(r.counter) % r.every:
            return (r, node, _BACKEND.clock_now(r.events), None, _UNTIMED, range_id)
        entry = start = None
        if r.events and (_BACKEND.state == _cuda.USABLE or _BACKEND.probe()):
            entry = _BACKEND.current_entry()
            start = _SKIP if entry is None else _take_recorded(entry)
        return (r, node, entry, start, _perf_ns(), range_id)

    def _end(self, r: Region, token: tuple[Any, ...] | None) -> None:
        if token is not None:
            self._finish(token[:5], _perf_ns(), token[5])

    def _finish(self, frame: tuple[Any, ...], t1: int, range_id: Any = None) -> None:
        r, node, entry, start, t0 = frame
        if t0 < 0:
            if t0 == _UNTIMED:
                with _LOCK:
                    if node.gen == self._gen:
                        node.count(entry)
            if t0 != _OFF and r.nvtx:
                r.domain.pop() if range_id is None else r.domain.end(range_id)
            return
        try:
            if entry is not None:
                # One stream lookup (0.14 us) tells whether the region still runs on the stream
                # and device it started on; side streams and switches take the slower branch.
                if r.streams or _get_stream(_CURRENT_DEVICE) != entry.key:
                    self._finish_streams(r, node, entry, start, t0, t1)
                    return
                end = _take_recorded(entry)
                pend = entry.pending
                pend.append((node, start, end, t0, t1, self._step, self._local.stack.tid))
                if len(pend) >= entry.check_at:
                    _BACKEND.try_harvest(entry)
            else:
                with _LOCK:
                    self._record(
                        node,
                        "host",
                        None,
                        (t1 - t0) * 1e-6,
                        self._step,
                        start is _SKIP,
                        t0,
                        self._local.stack.tid,
                        None,
                        None,
                    )
        finally:
            if r.nvtx:
                r.domain.pop() if range_id is None else r.domain.end(range_id)

    def _finish_streams(
        self, r: Region, node: _Node, entry: Any, start: Any, t0: int, t1: int
    ) -> None:
        """Exit of a region with side streams, or whose current stream or device changed.

        The end event on the start stream is always recorded (valid whatever the current
        device). Each other stream of the start device gets its own end event; the sample's GPU
        time runs to the latest of them. No stream waits on another: only events are recorded.
        """
        # torch's record, not the compiled one: the current device may have changed, and
        # torch's record switches to the event's device first.
        end = entry.take_recorded()
        extra = []
        covered = {entry.key}
        key = _get_stream(_CURRENT_DEVICE)
        if key != entry.key:
            if key[1] != entry.device:
                self._warn(
                    r,
                    _W_DEVICE,
                    f"cudatimer: region {r.name!r} started on cuda:{entry.device} and ended on "
                    f"cuda:{key[1]} (the current device changed inside it); its GPU time covers "
                    f"cuda:{entry.device} only. Open a region inside the device switch to time "
                    "work on the other device.",
                )
            elif not (key[0] != 0 and _cuda._is_capturing is not None and _cuda._is_capturing()):
                other = _BACKEND.entries.get(key) or _BACKEND.entry(key)
                ev = entry.take()
                ev.record(other.stream)
                extra.append(ev)
                covered.add(key)
                self._warn(
                    r,
                    _W_STREAM,
                    f"cudatimer: region {r.name!r} ended on another CUDA stream than it started "
                    "on (the current stream changed inside it and was not restored); its GPU "
                    "time runs from its start to the later of its ends on both streams. Switch "
                    "streams with `with torch.cuda.stream(s):` inside the region, or pass "
                    "streams=[...] to cover side streams.",
                )
        for skey, stream in r.streams:
            if skey in covered:
                continue
            if skey[1] != entry.device:
                self._warn(
                    r,
                    _W_SIDE_DEVICE,
                    f"cudatimer: region {r.name!r} ran on cuda:{entry.device}, but one of its "
                    f"streams= is on cuda:{skey[1]}; events of two devices cannot be compared, "
                    "so that stream is not covered.",
                )
                continue
            ev = entry.take()
            ev.record(stream)
            extra.append(ev)
            covered.add(skey)
        pend = entry.pending
        pend.append(
            (
                node,
                start,
                _Ends(end, tuple(extra)) if extra else end,
                t0,
                t1,
                self._step,
                self._local.stack.tid,
            )
        )
        if len(pend) >= entry.check_at:
            _BACKEND.try_harvest(entry)

    @staticmethod
    def _warn(r: Region, bit: int, message: str) -> None:
        """Warn once per region and kind, pointing at the line that closed the region."""
        if not r.warned & bit:
            r.warned |= bit
            warnings.warn(message, RuntimeWarning, stacklevel=_user_stacklevel())

    def _record(
        self,
        node: _Node,
        clock: str,
        gpu_ms: float | None,
        cpu_ms: float,
        step: int,
        skipped: bool,
        t0: int,
        tid: int,
        entry: Any,
        gpu_at_ns: float | None,
    ) -> None:
        """Fold a finished sample in (caller holds LOCK); ``gpu_at_ns`` places its GPU start on
        the host clock for the trace (``StreamEntry.place``)."""
        if node.gen != self._gen:
            return  # recorded before reset(): discarded
        node.add(clock, gpu_ms, cpu_ms, skipped)
        if self.keep_steps:
            self._keep_sample(node, clock, step, gpu_ms if gpu_ms is not None else _NAN, cpu_ms)
        if not self.trace_samples:
            return
        ring = self._trace
        if len(ring) >= self.trace_samples:
            ring.popleft()
        ring.append((node.path, clock, entry, gpu_at_ns, gpu_ms, t0, cpu_ms, step, tid))

    def _keep_sample(
        self, node: _Node, clock: str, step: int, gpu_ms: float, cpu_ms: float
    ) -> None:
        """Append one raw sample to ``step``'s series (caller holds LOCK), up to
        STEP_SAMPLE_CAP samples per step; past that the step's raw samples are dropped."""
        # The node remembers its series of the current step and the step's sample count: one
        # tuple test per sample instead of two dict lookups and a key tuple.
        last = node.last
        if last is None or last[0] != step or last[1] != clock:
            last = self._series(node, clock, step)
            if last is None:
                return
        count = last[3]
        count[0] += 1
        if count[0] <= _steps.STEP_SAMPLE_CAP:
            series = last[2]
            series[0].append(gpu_ms)
            series[1].append(cpu_ms)
        else:
            self._drop_step(step)

    def _series(
        self, node: _Node, clock: str, step: int
    ) -> tuple[int, str, Any, list[int]] | None:
        """``node``'s cache entry for ``clock`` in ``step``: (step, clock, (gpu ms, cpu ms)
        series, the step's sample count), the series made if new; None for a dropped step."""
        per_step, count = self._kept_step(step)
        if count[0] > _steps.STEP_SAMPLE_CAP:
            node.last = None
            return None
        key = (node.path, clock)
        series = per_step.get(key)
        if series is None:
            series = per_step[key] = (array("d"), array("d"))
        node.last = (step, clock, series, count)
        return node.last

    def _kept_step(self, step: int) -> tuple[dict[tuple[str, str], Any], list[int]]:
        """The raw series of ``step`` and its sample count, made if new (the oldest kept step
        then goes once there are more than ``keep_steps``)."""
        per_step = self._steps.get(step)
        if per_step is None:
            per_step = self._steps[step] = {}
            self._step_counts[step] = [0]
            if len(self._steps) > self.keep_steps:
                oldest = next(iter(self._steps))
                del self._steps[oldest]
                del self._step_counts[oldest]
        return per_step, self._step_counts[step]

    def _drop_step(self, step: int) -> None:
        """Forget the raw samples of ``step`` and keep no more of it (it passed
        STEP_SAMPLE_CAP samples); it keeps its place among the kept steps, empty, so windows
        leave it out and say so, and older steps still age out on time."""
        per_step, count = self._kept_step(step)
        per_step.clear()
        count[0] = max(count[0], _steps.STEP_SAMPLE_CAP + 1)
        # Nodes that cached the step's series see the count past the cap and append no more;
        # the arrays they still point at go when they move on to another step.

    def _dropped_steps(self) -> set[int]:
        """Kept steps whose raw samples were dropped (past STEP_SAMPLE_CAP)."""
        cap = _steps.STEP_SAMPLE_CAP
        return {step for step, count in self._step_counts.items() if count[0] > cap}

    def _absorb(self) -> None:
        """Take in what the compiled harvest recorded (caller holds LOCK): statistics merged
        per node and clock, per-step samples and trace samples as ``_record`` keeps them."""
        if self._core is None:
            return
        stats, series, trace, over = self._core.collect()
        for step in over:
            self._drop_step(step)
        gen = self._gen
        for node, device, calls, gpu, cpu in stats:
            if node.gen != gen:
                continue
            clock = f"cuda:{device}"
            acc = node.stats.get(clock)
            if acc is None:
                acc = node.stats[clock] = _Acc()
            acc.calls += calls
            acc.gpu.merge_counts(*gpu)
            acc.cpu.merge_counts(*cpu)
        for node, device, step, gpu_ms, cpu_ms in series:
            if node.gen == gen and self.keep_steps:
                self._keep_sample(node, f"cuda:{device}", step, gpu_ms, cpu_ms)
        if not trace:
            return
        kept = [
            (node.path, entry.clock, entry, at_ns, gpu_ms, t0, cpu_ms, step, tid)
            for node, entry, at_ns, gpu_ms, t0, cpu_ms, step, tid in trace
            if node.gen == gen
        ]
        # The trace window keeps the last ``trace_samples`` samples by exit time (the order the
        # Python harvest appends them in), whichever path recorded them.
        merged = sorted([*self._trace, *kept], key=lambda s: s[5] + s[6] * 1e6)
        self._trace = deque(merged[max(0, len(merged) - self.trace_samples) :])

    def _note_sync(self, kind: str, location: str) -> bool:
        """Count one host-device synchronisation against the innermost region open on this
        thread; False (nothing counted) when no region of this Timer is open here."""
        stack = self._local.stack
        if not stack:
            return False
        node = stack[-1][1]
        with _LOCK:
            if node.gen != self._gen:
                return False
            node.syncs += 1
            key = (location, kind, node.path)
            self._sync_sites[key] = self._sync_sites.get(key, 0) + 1
        return True

    def _out_of_order(
        self, r: Region, top: tuple[Any, ...], stack: list[tuple[Any, ...]]
    ) -> tuple[Any, ...]:
        """Find ``r``'s frame below ``top``; keep the inner frames open, return ``r``'s."""
        stack.append(top)
        for i in range(len(stack) - 1, -1, -1):
            if stack[i][0] is r:
                return stack.pop(i)
        raise RuntimeError(
            f"cudatimer: region {r.name!r} exited on this thread without having been entered "
            f"here (open regions: {', '.join(f[0].name for f in stack)})"
        )

    # -- reading ------------------------------------------------------------------------------
    def summary(
        self,
        *,
        timeout_s: float = 60.0,
        last: int | None = None,
        steps: Iterable[int] | None = None,
        warmup: int = 0,
        step_stats: bool = False,
        trace: bool = False,
    ) -> Summary:
        """Resolve every finished sample and return frozen records (never clears anything).

        Waits at most ``timeout_s`` for GPU work still running; samples not finished by then
        stay pending (``Summary.pending``) and appear in a later summary.

        A window of steps (``step()`` marks them): ``last=N`` covers the last N finished steps,
        ``steps=range(10, 20)`` (or any step numbers) those steps, ``warmup=K`` skips steps
        before K (alone: every finished step from K on). Window statistics are rebuilt from the
        raw samples of the last ``keep_steps`` steps; sync counts stay whole-run.
        ``step_stats=True`` adds per-step records (``Summary.step_stats``), ``trace=True`` the
        last ``trace_samples`` calls placed on their timelines (``Summary.trace``).

        >>> import cudatimer
        >>> t = cudatimer.Timer(name="doc")
        >>> for i in range(4):
        ...     with t.region("it"):
        ...         pass
        ...     _ = t.step()
        >>> t.summary(warmup=1).steps, t.summary(last=2)["it"].calls
        (3, 2)
        """
        from . import _trace

        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)):
            raise TypeError(
                f"timeout_s must be a number of seconds, got {type(timeout_s).__name__}"
            )
        if timeout_s < 0:
            raise ValueError(f"timeout_s must be >= 0, got {timeout_s}")
        for arg, flag in (("step_stats", step_stats), ("trace", trace)):
            if not isinstance(flag, bool):
                raise TypeError(f"{arg} must be a bool, got {type(flag).__name__}")
        window_args: dict[str, Any] = {"last": last, "steps": steps, "warmup": warmup}
        _steps.select(self._step, None, self.keep_steps, **window_args)  # bad input fails early
        _BACKEND.drain(float(timeout_s))
        with _LOCK:
            self._absorb()
            window = _steps.select(
                self._step,
                _steps.oldest_kept(self),
                self.keep_steps,
                dropped=self._dropped_steps(),
                **window_args,
            )
            per_step = _steps.step_stats(self, window) if step_stats else ()
            samples = _trace.resolve(self, window) if trace else ()
            regions: list[RegionStats] = []
            todo = list(reversed(self._root.children.values()))
            while todo:
                node = todo.pop()
                for i, (clock, acc) in enumerate(node.stats.items()):
                    regions.append(
                        RegionStats(
                            name=node.path,
                            clock=clock,
                            calls=acc.calls,
                            gpu=acc.gpu.freeze() if clock != "host" else None,
                            cpu=acc.cpu.freeze(),
                            skipped=acc.skipped,
                            depth=node.depth,
                            syncs=node.syncs if i == 0 else 0,
                        )
                    )
                todo.extend(reversed(node.children.values()))
            if window is not None:
                regions = list(_steps.window_regions(self, window))
            pending = sum(
                1
                for e in _BACKEND.entries.values()
                for sample in list(e.pending)
                if sample[0].owner is self
            ) + (self._core.pending() if self._core is not None else 0)
            sites = tuple(
                SyncSite(location=loc, kind=kind, region=path, count=n)
                for (loc, kind, path), n in sorted(
                    self._sync_sites.items(), key=lambda item: (-item[1], item[0])
                )
            )
        meta: tuple[tuple[str, str], ...] = (
            ("timer", self.name),
            ("torch", str(torch.__version__)),
        )
        if window is not None:
            meta += _steps.window_meta(window)
        return Summary(
            regions=tuple(regions),
            sync_sites=sites,
            pending=pending,
            open=len(self._local.stack),
            steps=self._step if window is None else len(window),
            meta=meta,
            step_stats=per_step,
            trace=samples,
        )

    def report(
        self,
        *,
        timeout_s: float = 60.0,
        file: Any = None,
        logger: logging.Logger | None = None,
        level: int = logging.INFO,
        last: int | None = None,
        steps: Iterable[int] | None = None,
        warmup: int = 0,
        **options: Any,
    ) -> str:
        """Render this Timer's results and print them; returns the text.

        Output goes to stdout, or to ``file`` (a text stream), or to ``logger`` (a
        ``logging.Logger``, at ``level``). ``last``/``steps``/``warmup`` pick a window of steps
        as in :meth:`summary`. Other options go to the renderer: ``view`` ("flat" or "tree"),
        ``sort``, ``fmt`` (any tabulate format), ``columns``, ``match``, ``min_share``.
        """
        from ._report import emit, render

        emit("", file=file, logger=logger, level=level, check_only=True)
        result = self.summary(timeout_s=timeout_s, last=last, steps=steps, warmup=warmup)
        text = render(result, **options)
        emit(text, file=file, logger=logger, level=level)
        return text

    def save(
        self, path: str | os.PathLike[str], *, timeout_s: float = 60.0, **window: Any
    ) -> Summary:
        """Write this Timer's summary as JSON (``cudatimer.load`` reads it back exactly),
        with its per-step stats and trace samples; ``window``: last/steps/warmup."""
        from ._export import save

        result = self.summary(timeout_s=timeout_s, step_stats=True, trace=True, **window)
        save(result, path)
        return result

    def reset(self) -> None:
        """Forget every result of this Timer. Samples still on the GPU are discarded when they
        finish (their events go back to the pool); regions open now are not recorded."""
        with _LOCK:
            self._gen += 1
            self._root = _Node(self, "", None)
            self._step = 0
            self._steps = {}
            self._step_counts = {}
            self._sync_sites = {}
            self._trace = deque()
            if self._core is not None:
                self._core.reset(self._gen)
                self._core.step = 0

    # -- data and exports (reading only: none of these clears anything) ------------------------
    def step_series(
        self,
        *,
        timeout_s: float = 60.0,
        last: int | None = None,
        steps: Iterable[int] | None = None,
        warmup: int = 0,
    ) -> tuple[StepStats, ...]:
        """Per-step time of every region, one ``StepStats`` per (step, region, clock), ordered
        by step then tree order, for the kept steps (the last ``keep_steps``) in the window.

        >>> import cudatimer
        >>> t = cudatimer.Timer(name="series")
        >>> for i in range(3):
        ...     with t.region("it"):
        ...         pass
        ...     _ = t.step()
        >>> [(s.step, s.name, s.calls) for s in t.step_series(warmup=1)]
        [(1, 'it', 1), (2, 'it', 1)]
        """
        return self.summary(
            timeout_s=timeout_s, last=last, steps=steps, warmup=warmup, step_stats=True
        ).step_stats

    def export_trace(
        self, path: str | os.PathLike[str] | Any, *, timeout_s: float = 60.0, **window: Any
    ) -> None:
        """Write the last ``trace_samples`` calls as a Chrome/Perfetto trace (JSON): GPU spans on
        a track per device and stream, host spans on a track per thread. Open it in
        https://ui.perfetto.dev or chrome://tracing. ``window``: last/steps/warmup."""
        from ._trace import write_chrome

        write_chrome(self.summary(timeout_s=timeout_s, trace=True, **window), path)

    def to_csv(
        self,
        path: str | os.PathLike[str] | Any,
        *,
        what: str = "regions",
        timeout_s: float = 60.0,
        **window: Any,
    ) -> None:
        """Write regions (``what="regions"``), per-step stats ("steps") or trace samples
        ("trace") as CSV to a path or a text stream. ``window``: last/steps/warmup."""
        from ._export import to_csv

        result = self.summary(
            timeout_s=timeout_s, step_stats=what == "steps", trace=what == "trace", **window
        )
        to_csv(result, path, what=what)

    def to_dataframe(self, *, what: str = "regions", timeout_s: float = 60.0, **window: Any) -> Any:
        """A pandas DataFrame of regions, per-step stats ("steps") or trace samples ("trace")
        (pandas is optional; ImportError names it if missing). ``window``: last/steps/warmup."""
        from ._export import to_dataframe

        result = self.summary(
            timeout_s=timeout_s, step_stats=what == "steps", trace=what == "trace", **window
        )
        return to_dataframe(result, what=what)

    def plot(
        self,
        path: str | os.PathLike[str] | Any,
        *,
        top: int = 12,
        timeout_s: float = 60.0,
        **window: Any,
    ) -> None:
        """Write a PNG of where time goes (top regions, GPU vs CPU; time per step when steps
        were marked). Needs matplotlib. ``window``: last/steps/warmup."""
        from ._plot import plot

        plot(self.summary(timeout_s=timeout_s, step_stats=True, **window), path, top=top)


#: Every live Timer (sync detection and the report at exit look them up).
_TIMERS: weakref.WeakSet[Timer] = weakref.WeakSet()


def _skip_dynamo() -> None:
    """Dynamo must never compile the recorder's own frames (see ``_wrap.skip_dynamo_frames``)."""
    import sys

    from . import _hist, _nvtx, _wrap

    _wrap.skip_dynamo_frames(sys.modules[__name__], _cuda, _hist, _nvtx, _wrap)


_skip_dynamo()
