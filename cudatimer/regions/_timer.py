"""Timer and Region: options, the region cache and the verbs; the recording itself is the
core's (``_core``: per sample) and the recorder's (``_recorder``: the general path, the region
tree, the summary).

One Region object serves every call of its name: the state of each call lives on the calling
thread's stack, never on the region, so one Region can be entered recursively and from many
threads at once. The common case of ``with region:`` is one C call each way (or, without the C
core, its Python reference): a stack read, a cached path slot, an NVTX push/pop with cached
attributes, one stream read, two pooled event records, two host clock reads and a pending
sample. No synchronisation, no allocation of events, no Python Stream objects. Events are
resolved when a sample is harvested (every HARVEST_BATCH exits, without blocking) or when a
report is asked.
"""

from __future__ import annotations

import itertools
import math
import os
import threading
import warnings
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import IO, Any, Literal, TypedDict, TypeVar

import torch
from typing_extensions import Unpack  # a dependency of torch; imported for get_type_hints

from .._config import DISABLED_AT_IMPORT, PURE_PYTHON
from ..core import _core, _device
from ..recorder._recorder import Recorder
from ..records._records import StepStats, Summary
from ..sources import _backward, _compile, _flops, _memory
from ..sources._source import TIMERS, Probe
from . import _output
from ._machine import machine_meta
from ._nvtx import Domain, resolve_color

F = TypeVar("F", bound=Callable[..., Any])
StrPath = str | os.PathLike[str]

# Bounds of the NVTX event attributes, checked when a region or marker is made, so an argument
# fails the same way whether or not a tool is attached (the nvtx package only converts them
# to C when one is, e.g. under Nsight Systems): the category is a uint32_t, an int payload is
# passed as int64_t (a float one as a double, which must be finite to mean anything).
_CATEGORY_MAX = 2**32 - 1
_PAYLOAD_MIN, _PAYLOAD_MAX = -(2**63), 2**63 - 1
# keep_steps: each kept step holds up to STEP_SAMPLE_CAP raw samples (1 MB) and a new step
# moves the list of kept steps, so a step costs O(keep_steps); 10^6 keeps that under a
# millisecond, far more steps than a window is ever asked over.
_KEEP_STEPS_MAX = 10**6
# trace_samples: the trace ring grows to 72 bytes a sample in the C core (more in pure
# Python), so 10^7 samples are 0.7 GB; a trace that size is already too big for Perfetto.
_TRACE_SAMPLES_MAX = 10**7
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
    backward: bool | None
    memory: bool | None
    memory_every: int | None
    flops: bool | None


_REGION_OPTIONS = frozenset(RegionOptions.__annotations__)

# Dynamo folds both to True while it traces. is_dynamo_compiling is one Python frame that
# returns False (0.017 us); is_compiling is two (0.047 us): the region cache uses the cheaper.
_is_compiling: Callable[[], bool] = getattr(
    getattr(torch, "compiler", None), "is_compiling", lambda: False
)
_is_dynamo_compiling: Callable[[], bool] = getattr(
    getattr(torch, "compiler", None), "is_dynamo_compiling", _is_compiling
)


def check_name(name: object, what: str = "name") -> str:
    if not isinstance(name, str):
        raise TypeError(f"{what} must be a str, got {type(name).__name__} ({name!r})")
    if not name or not name.strip():
        raise ValueError(f"{what} must be a non-empty string")
    if "/" in name:
        raise ValueError(
            f"{what} {name!r} contains '/', which separates nesting levels in region paths; "
            "nest regions instead, or use another separator such as '.'"
        )
    if "\x00" in name:
        # NVTX takes C strings: a range named "a\x00b" read "a" in Nsight while the report
        # said "a\x00b" (with a tool attached). Refused, as "/" is, so both always agree.
        raise ValueError(
            f"{what} {name!r} contains a NUL character ('\\x00'), which NVTX cannot carry "
            "(its names are C strings: Nsight would show the name cut at it); drop it or "
            "write it escaped, e.g. name.replace('\\x00', '\\\\x00')"
        )
    _check_utf8(name, what)
    return name


def _check_utf8(text: str, what: str) -> None:
    """NVTX registers names as UTF-8: a lone surrogate (e.g. from a bad decode) cannot be."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = text[exc.start : exc.end]
        raise ValueError(
            f"{what} {text!r} is not valid Unicode: it holds the lone surrogate {bad!r}, which "
            "has no UTF-8 form (NVTX registers names as UTF-8); decode the text with "
            "errors='replace' or drop that character"
        ) from None


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
                f"streams must hold torch.cuda.Stream objects, got {type(item).__name__} ({item!r})"
            )
        if item.device_type != 1:  # c10::DeviceType::CUDA
            raise ValueError(f"streams must be CUDA streams, got {item!r}")
        key = (int(item.stream_id), int(item.device_index), int(item.device_type))
        keys.append((key, item))
    return tuple(keys)


class Region(_core.RegionBase):
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
        "compiled",
        "counter",
        "domain",
        "events",
        "every",
        "flop_state",
        "name",
        "nvtx",
        "probes",
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
        probes: tuple[Probe, ...] = (),
    ) -> None:
        self.timer = timer
        self.name = name
        # What options such as memory=True measure around each call (their classes below
        # run them; a region without any is one of the plain classes, nothing per call).
        self.probes = probes
        # flops=True: the counts of its signatures (a decorated callable's), its last count.
        self.flop_state = _flops.RegionFlops() if _flops.FLOPS in probes else None
        # Decided here, once, so the hooks test plain attributes: attrs is None when NVTX is
        # off, no tool is attached, or mode="events"; the region's domain is the Timer's, or
        # past the process's bound of registered names the plain-message one (see _nvtx).
        self.attrs = (
            timer.domain.attributes(name, color, category, payload) if mode != "events" else None
        )
        self.domain: Any = timer.domain.of(self.attrs)
        self.nvtx = self.attrs is not None
        self.timing = mode != "nvtx"  # mode="nvtx": a range in Nsight, nothing recorded
        self.events = self.timing and clock != "host"
        self.warned = 0  # warnings already given for this region (bits, see _recorder)
        self.compiled = False  # traced into torch.compile'd code (set by _compile)
        # Side streams whose work the GPU time must cover: ((stream key, Stream), ...). Empty
        # for almost every region.
        self.streams = streams
        # every=N: time one call in N (all counted). The call counter is shared by every Region
        # of this name and rate in the Timer, so `with cuda_region("x", every=8):` in a loop
        # samples too; next() on itertools.count is atomic under the GIL, so exact in threads.
        self.every = every
        self.counter: Any = timer._sampler(name, every) if every != 1 else None
        rec = timer.recorder
        # Decided once: may this region take the core's common case of __enter__/__exit__?
        fast = self.events and not streams and every == 1
        self.bind(
            rec.store,
            fast,
            name,
            self.domain.push if self.nvtx else None,
            self.attrs,
            self.domain.pop if self.nvtx else None,
            rec.enter,
            rec.exit_block,
            self.domain.start if self.nvtx else None,
            self.domain.end if self.nvtx else None,
        )

    def __call__(self, fn: F) -> F:
        from ._wrap import wrap

        wrapped: F = wrap(fn, self)
        return wrapped

    def __repr__(self) -> str:
        return f"Region({self.name!r}, timer={self.timer.name!r})"

    def _store_stack(self) -> Any:
        """This thread's stack of the region's store: the Python-level enters read its depth
        before the core's, so that an exception raised as the core's enter returns (a
        KeyboardInterrupt from a signal handler) can tell whether the call was opened."""
        return self.timer.recorder.store.stack()


class _SampledRegion(Region):
    """A region with ``every=N``: its own enter hook decides, so plain regions pay nothing."""

    __slots__ = ()

    def __enter__(self) -> Region:
        rec = self.timer.recorder
        stack = self._store_stack()
        depth = len(stack)
        try:
            rec.enter_sampled(self)
        except BaseException:  # a KeyboardInterrupt as the hook returned: no frame stays
            rec.unwind(stack, depth, self)
            raise
        return self


class _Probed:
    """Mixed into a region class whose regions have probes (``memory=True``): each probe
    runs after the region's own enter and before its own exit. Only these classes run
    them, so regions without probes pay nothing for them."""

    __slots__ = ()
    probes: tuple[Probe, ...]

    def __enter__(self) -> Any:
        stack = self._store_stack()  # type: ignore[attr-defined]  # (a Region's)
        depth = len(stack)
        try:
            super().__enter__()  # type: ignore[misc]
            for probe in self.probes:
                probe.enter(self)
        except BaseException as exc:  # (a KeyboardInterrupt, say): an opened call closes
            if len(stack) > depth:
                super().__exit__(type(exc), exc, exc.__traceback__)  # type: ignore[misc]
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            for probe in reversed(self.probes):
                probe.exit(self, exc[1])
        finally:
            super().__exit__(*exc)  # type: ignore[misc]

    def hooks_without(self, option: str) -> tuple[Callable[[], Any], Callable[..., Any]]:
        """This region's enter and exit with every probe but the one of ``option`` (a
        decorated callable counts its FLOPs itself, around the call, by its arguments)."""
        base_enter = super().__enter__  # type: ignore[misc]
        base_exit = super().__exit__  # type: ignore[misc]
        probes = tuple(p for p in self.probes if p.option != option)
        if not probes:
            return base_enter, base_exit

        def enter() -> Any:
            base_enter()
            for probe in probes:
                probe.enter(self)
            return self

        def exit_(*exc: Any) -> None:
            try:
                for probe in reversed(probes):
                    probe.exit(self, exc[1])
            finally:
                base_exit(*exc)

        return enter, exit_


class _ProbedRegion(_Probed, Region):
    __slots__ = ()


class _ProbedSampledRegion(_Probed, _SampledRegion):
    __slots__ = ()


class _Seqs(threading.local):
    """Per thread: the autograd node number at each open ``with`` of one backward region, and
    whether ``backward_from`` was called in it."""

    def __init__(self) -> None:
        self.stack: list[int] = []
        self.hooked: list[bool] = []


class _BackwardRegion(Region):
    """A region with ``backward=True``: its calls' backward is the row ``<name>.backward``.

    Decorating: the wrapper (``_wrap``) hooks each call's tensor outputs. ``with`` block: the
    block records the autograd node number at its start, and ``backward_from(*outputs)``
    inside it hooks the tensors handed in; their backward row covers the nodes made since.
    """

    __slots__ = ("_seqs", "backward_site")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        timer: Timer = args[0]
        name: str = args[1]
        # Under CUDATIMER_DISABLE this region only checks its options (NULL_REGION runs).
        # The backward row measures what the region measures (memory=True: its memory too).
        same = {k: v for probe in self.probes for k, v in probe.options.items()}
        row = None if DISABLED_AT_IMPORT else timer.region(f"{name}.backward", **same)  # type: ignore[arg-type]
        # every=N: one call's backward row in N, by a counter of the row's own name (shared,
        # as the forward's, by every Region of this name and rate).
        counter = timer._sampler(f"{name}.backward", self.every) if self.every != 1 else None
        self.backward_site = (
            None if row is None else _backward.Site(row, (f"{name}.backward",), counter, self.every)
        )
        self._seqs = _Seqs()

    def __enter__(self) -> Region:
        seqs = self._seqs
        stack = self._store_stack()
        depth = len(stack)
        seqs.stack.append(_backward.seq_now())
        seqs.hooked.append(False)
        try:
            if self.counter is not None:  # every=N: the sampled enter hook
                self.timer.recorder.enter_sampled(self)
            else:
                _core.RegionBase.__enter__(self)
        except BaseException as exc:  # (a KeyboardInterrupt, say): nothing of it stays open
            if len(stack) > depth:
                _core.RegionBase.__exit__(self, type(exc), exc, exc.__traceback__)
            del seqs.stack[depth:], seqs.hooked[depth:]
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            _core.RegionBase.__exit__(self, *exc)
        finally:
            seqs = self._seqs
            if seqs.stack:
                seqs.stack.pop()
                if not seqs.hooked.pop() and exc[0] is None:
                    self._warn_unhooked()

    def _warn_unhooked(self) -> None:
        """A ``with`` block of a backward region that never called ``backward_from`` has no
        backward row, and nothing else would say so: the forward row alone reads as if the
        backward cost nothing. Once per name and Timer (``region(name, backward=True)`` makes
        a new Region each call), when a backward row could have been timed."""
        site = self.backward_site
        if (
            site is None
            or not site.store.enabled
            or not torch.is_grad_enabled()
            or torch.compiler.is_compiling()
        ):
            return
        warned = _UNHOOKED_WARNED.setdefault(self.timer, set())
        if self.name in warned:
            return
        warned.add(self.name)
        warnings.warn(
            f"cudatimer: region {self.name!r} has backward=True, but its `with` block ended "
            f"without calling backward_from(...), so it gets no backward row "
            f"({self.name}.backward). Inside the block, hand it the tensors the block computed: "
            f"`with cuda_region({self.name!r}, backward=True) as blk: out = f(x); "
            "blk.backward_from(out)`",
            RuntimeWarning,
            stacklevel=3,
        )

    def backward_from(self, *outputs: torch.Tensor) -> None:
        """Inside ``with region:``: time the backward of ``outputs`` (tensors computed in the
        block) as the row ``<name>.backward``: from the moment autograd runs the node that
        made the newest of them until it runs a node made before the block began, or the
        backward pass ends. Does nothing outside grad mode or with the Timer off."""
        if not outputs:
            raise TypeError("backward_from() needs at least one tensor (outputs), got none")
        for i, out in enumerate(outputs):
            if not isinstance(out, torch.Tensor):
                raise TypeError(
                    f"backward_from() takes tensors; outputs[{i}] is {type(out).__name__}"
                )
        stack = self._seqs.stack
        if not stack:
            raise RuntimeError(
                f"backward_from() of region {self.name!r} was called outside `with` of it on "
                "this thread: the backward of a block is the autograd nodes made since the "
                "block began, so call it inside the block"
            )
        self._seqs.hooked[-1] = True
        site = self.backward_site
        if site is not None and torch.is_grad_enabled() and site.store.enabled:
            if site.sampled():
                _backward.watch(outputs, stack[-1], site, bounded=True)
            else:
                site.skip()


#: Per Timer, the backward regions already warned about a block without ``backward_from``.
_UNHOOKED_WARNED: weakref.WeakKeyDictionary[Timer, set[str]] = weakref.WeakKeyDictionary()


class _ProbedBackwardRegion(_Probed, _BackwardRegion):
    __slots__ = ()


#: What regions become when ``CUDATIMER_DISABLE`` is set: nothing on enter, exit or call.
NULL_REGION: Any = _core.NullRegion()


def compiled() -> bool:
    """True when regions run the C core (``_speedups``)."""
    return bool(_core.IMPL == "c")


def _core_note() -> str | None:
    """The report's note when the Python core runs: it costs more per region than the C one
    (2.44x in the launch-bound loop, docs/benchmarks.md), and nothing else would say so."""
    if compiled():
        return None
    if PURE_PYTHON:
        why = "CUDATIMER_PURE_PYTHON is set; unset it to run the C core"
    else:
        why = (
            "the C core cudatimer.core._speedups was not built (no C compiler or Python headers at "
            "install); reinstall where gcc and the Python headers are present"
        )
    return (
        f"the recorder runs its Python core, about 2.4x the C core's cost per region "
        f"(docs/benchmarks.md): {why}"
    )


def _disabled_note(enabled: bool) -> str | None:
    """The report's note when recording is off, naming the switch (else an empty report reads
    as if the program entered no region)."""
    if DISABLED_AT_IMPORT:
        return (
            "cudatimer is disabled: CUDATIMER_DISABLE was set when cudatimer was imported, so "
            "every region is a no-op; unset it to time regions"
        )
    if not enabled:
        return "this Timer is disabled (disable() or Timer(enabled=False)); enable() records again"
    return None


def _check_timer_args(
    name: str,
    domain: str,
    mode: object,
    clock: object,
    enabled: object,
    keep_steps: object,
    trace_samples: object,
) -> None:
    """``Timer()``'s arguments, each refused with a TypeError or ValueError naming it."""
    check_name(name, "name")
    for arg, value, most in (
        ("keep_steps", keep_steps, _KEEP_STEPS_MAX),
        ("trace_samples", trace_samples, _TRACE_SAMPLES_MAX),
    ):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{arg} must be an int, got {type(value).__name__}")
        if value < 0:
            raise ValueError(f"{arg} must be >= 0, got {value}")
        if value > most:
            raise ValueError(f"{arg} must be at most {most:,}, got {value:,}")
    check_name(domain, "domain")
    if mode not in _MODES:
        raise ValueError(f"mode must be one of {', '.join(_MODES)}; got {mode!r}")
    if clock not in _CLOCKS:
        raise ValueError(f"clock must be one of {', '.join(_CLOCKS)}; got {clock!r}")
    if not isinstance(enabled, bool):
        raise TypeError(f"enabled must be a bool, got {type(enabled).__name__}")


def _probes(memory: object, memory_every: object, flops: object, mode: object) -> tuple[Probe, ...]:
    """The probes of the options ``memory`` (with ``memory_every``) and ``flops`` (each a bool
    or None), checked."""
    probes: tuple[Probe, ...] = ()
    options: tuple[tuple[str, object, Probe], ...] = (
        ("memory", memory, _memory.MEMORY),
        ("flops", flops, _flops.FLOPS),
    )
    for option, wanted, probe in options:
        if wanted is not None and not isinstance(wanted, bool):
            raise TypeError(
                f"{option} must be a bool or None, got {type(wanted).__name__} ({wanted!r})"
            )
        if wanted and mode == "nvtx":
            raise ValueError(
                f"{option}=True needs a row to hold the values, and mode='nvtx' records none; "
                "use mode='full' or 'events'"
            )
        if wanted:
            if option == "memory" and memory_every is not None:
                probe = _memory.probe(_memory.check_every(memory_every, memory))
            probes += (probe,)
    if memory_every is not None and not memory:
        _memory.check_every(memory_every, memory)  # raises: memory_every needs memory=True
    return probes


class Timer:
    """An independent registry of regions with its own NVTX domain and results.

    ``keep_steps`` (at most 10**6) steps keep raw samples for window reports, and the trace
    keeps the last ``trace_samples`` (at most 10**7) calls; 0 keeps none. ``peak_tflops``:
    the peak MFU is taken against (a number, or a dict by dtype: ``{"bf16": 989}``; default
    the table of known GPUs, or ``CUDATIMER_PEAK_TFLOPS``); ``flop_every``: one call in N of
    a ``flops=True`` ``with`` block is counted (docs/flops.md).

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
        peak_tflops: float | Mapping[str, float] | None = None,
        flop_every: int = 64,
    ) -> None:
        _check_timer_args(name, domain, mode, clock, enabled, keep_steps, trace_samples)
        self.name = name
        # With CUDATIMER_DISABLE no NVTX call is made at all (not even creating the domain).
        self.domain = Domain(domain, enabled=not DISABLED_AT_IMPORT)
        self.mode: Mode = mode
        self.clock: Clock = clock
        #: The region tree, the general path and the store (per-sample state, in the core).
        #: Reports read it through a snapshot; it is the Timer's only state besides options.
        self.recorder = Recorder(keep_steps, trace_samples)
        #: flops=True regions: the peaks MFU is taken against, one call in flop_every of a
        #: `with` block counted (docs/flops.md).
        self.recorder.flops.configure(peak_tflops, flop_every)
        self.recorder.store.enabled = enabled
        #: Raw samples of the last ``keep_steps`` steps make window reports exact; whole-run
        #: statistics never depend on them. The last ``trace_samples`` calls feed the trace.
        self.keep_steps = keep_steps
        self.trace_samples = trace_samples
        self._regions: dict[str, Region] = {}  # NULL_REGION under CUDATIMER_DISABLE
        self._samplers: dict[tuple[str, int], itertools.count[int]] = {}  # every=N call counters
        #: This Timer's number in the one registry of Timers (``sources._source.TIMERS``),
        #: by which regions inside torch.compile'd code name it.
        self.compile_key = TIMERS.add(self)

    # -- building regions -------------------------------------------------------------------
    def region(self, name: str, **options: Unpack[RegionOptions]) -> Region:
        """A region named ``name``: ``with timer.region("fwd"):`` or ``@timer.region("fwd")``.

        Options: ``mode`` ("full": events and NVTX; "nvtx": NVTX range only, no events;
        "events": no NVTX), ``color`` (a name or 0xRRGGBB; default: stable per name),
        ``category`` (an int in 0..2**32-1 or a str, NVTX category), ``payload`` (an int in
        int64's range or a finite float shown on the NVTX range, e.g. a step number; both are
        checked here, the same whether or not an NVTX tool is attached), ``clock`` ("auto":
        CUDA events when CUDA is in use, else the host clock; "host": always the host clock,
        for CPU-only code), ``streams`` (CUDA streams the region's work also runs on: an end
        event is recorded on each at exit and the GPU time runs to the latest; no stream is
        made to wait), ``every`` (time one call in ``every``, count them all: for hot code;
        ``calls`` counts every call, the times cover the timed ones), ``backward`` (True: also
        time the backward of what the region computes, as the top-level row
        ``<name>.backward``: a decorated function's or module's tensor outputs, or in a
        ``with`` block the tensors handed to ``region.backward_from(...)``; see
        docs/instrument.md), ``memory`` (True: also measure each call's GPU memory, the bytes
        it leaves allocated and the most it held while open, columns ``mem_delta`` and
        ``mem_peak``; its backward row too; see docs/memory.md), ``memory_every`` (with
        ``memory=True``: measure one call in N of this region when it is the outermost
        memory region open, with every call inside it; default 10, 1 measures all),
        ``flops`` (True: also count each call's FLOPs, columns ``TFLOP/s`` and ``MFU``: a
        decorated callable's once per input signature, a ``with`` block's one call in
        ``flop_every``; see docs/flops.md).

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
        if _is_dynamo_compiling():
            # Dynamo traces this call (`with cuda_region(...)` in compiled code). It cannot
            # enter a Region, but it can a context manager made inside the traced code: the
            # region's two marks, which run the Region when the compiled code runs.
            marks: Region = _compile.block(self.compile_key, name, dict(options))
            return marks
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
            if cached is not None:
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
        backward: bool | None = None,
        memory: bool | None = None,
        memory_every: int | None = None,
        flops: bool | None = None,
    ) -> Region:
        """``region`` past its cache: checks the options and makes the region (cached by name
        when ``plain``: no options, or all None)."""
        if plain:
            if DISABLED_AT_IMPORT:
                # Cached like a real region, so `with cuda_region("x"):` is one dict hit and
                # an empty C enter/exit: +114 ns a call, 576 ns when every call came down here
                # (benchmarks/disabled_cost.py).
                self._regions[check_name(name)] = NULL_REGION
                null: Region = NULL_REGION
                return null
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
            backward,
            memory,
            memory_every,
            flops,
        )
        # With CUDATIMER_DISABLE the options are still checked, and the region does nothing.
        return NULL_REGION if DISABLED_AT_IMPORT else made  # type: ignore[no-any-return]

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
        backward: object = None,
        memory: object = None,
        memory_every: object = None,
        flops: object = None,
    ) -> Region:
        name = check_name(name)
        if backward is not None and not isinstance(backward, bool):
            raise TypeError(
                f"backward must be a bool or None, got {type(backward).__name__} ({backward!r})"
            )
        probes = _probes(memory, memory_every, flops, mode)
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
        if isinstance(category, int):
            if not 0 <= category <= _CATEGORY_MAX:
                raise ValueError(
                    f"category must be in 0..{_CATEGORY_MAX} (NVTX's uint32), got {category}"
                )
            category = int(category)  # an int subclass (IntEnum) as the plain int NVTX takes
        elif isinstance(category, str):
            _check_utf8(category, "category")
        if payload is not None and (
            isinstance(payload, bool) or not isinstance(payload, (int, float))
        ):
            raise TypeError(f"payload must be an int or a float, got {type(payload).__name__}")
        if isinstance(payload, int):
            if not _PAYLOAD_MIN <= payload <= _PAYLOAD_MAX:
                raise ValueError(
                    f"payload must be in {_PAYLOAD_MIN}..{_PAYLOAD_MAX} (NVTX's int64) when an "
                    f"int, got {payload}"
                )
            payload = int(payload)  # the nvtx package takes exactly int or float
        elif isinstance(payload, float):
            if not math.isfinite(payload):
                raise ValueError(f"payload must be a finite number when a float, got {payload}")
            payload = float(payload)
        rgb = resolve_color(name, color)
        if backward:
            # every=N samples the backward rows too: one call's in N hooks its outputs.
            rate = every if mode != "nvtx" else 1
            kind: type[_BackwardRegion] = _ProbedBackwardRegion if probes else _BackwardRegion
            return kind(
                self, name, mode, rgb, category, payload, clock, keys, every=rate, probes=probes
            )
        if every != 1 and mode != "nvtx":
            made: Mode = mode  # type: ignore[assignment]
            on: Clock = clock  # type: ignore[assignment]
            sampled: type[_SampledRegion] = _ProbedSampledRegion if probes else _SampledRegion
            return sampled(self, name, made, rgb, category, payload, on, keys, every, probes)
        plain: type[Region] = _ProbedRegion if probes else Region
        return plain(self, name, mode, rgb, category, payload, clock, keys, probes=probes)  # type: ignore[arg-type]

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
        self.recorder.store.enabled = True

    def disable(self) -> None:
        """Stop timing: regions entered from now on do no timing and emit no NVTX."""
        self.recorder.store.enabled = False

    @property
    def enabled(self) -> bool:
        return self.recorder.store.enabled and not DISABLED_AT_IMPORT

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
        The options are those of :meth:`region`, checked the same way.
        """
        check_name(name)
        probe = self._make(name, "full", color, category, payload, "auto")  # validates options
        if self.recorder.store.enabled and probe.attrs is not None:
            self.domain.mark(probe.attrs)

    def step(self) -> int:
        """Mark an iteration boundary; returns the new step number."""
        store = self.recorder.store
        store.step += 1
        return store.step

    # -- reading and outputs (none of them clears anything; see ``_output``) -------------------
    def summary(self, **options: Unpack[_output.SummaryOptions]) -> Summary:
        """Resolve every finished sample and return frozen records (never clears anything).

        Waits at most ``timeout_s`` for GPU work still running; samples not finished by then
        stay pending (``Summary.pending``) and appear in a later summary. ``timeout_s`` must be
        finite (NaN and infinity are refused: a report never waits for ever; pass a large
        number such as 3600 to wait long).

        A window of steps (``step()`` marks them): ``last=N`` covers the last N finished steps,
        ``steps=range(10, 20)`` (or any step numbers) those steps, ``warmup=K`` skips steps
        before K (alone: every finished step from K on). Window statistics are rebuilt from the
        raw samples of the last ``keep_steps`` steps; sync counts stay whole-run. A summary of
        a window that holds no step is empty (``steps`` 0); the outputs below refuse one.
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
        return _output.summary(self, options)

    def meta(self) -> tuple[tuple[str, str], ...]:
        """What this Timer adds to ``Summary.meta``: its name, torch's version, its notes."""
        meta: tuple[tuple[str, str], ...] = (
            ("timer", self.name),
            ("torch", str(torch.__version__)),
            *machine_meta(),
        )
        for key, note in (
            ("disabled_note", _disabled_note(self.recorder.store.enabled)),
            ("core_note", _core_note()),
        ):
            if note:
                meta += ((key, note),)
        return meta

    # Every output takes a window (``last``/``steps``/``warmup``) and ``timeout_s`` as summary
    # does, and refuses a window that holds no step, naming it and the steps there were.
    def report(self, **options: Unpack[_output.ReportOptions]) -> str:
        """Print the table of this Timer's results (or of ``summary``) and return it: to
        stdout, ``file`` (a text stream) or ``logger`` (at ``level``). The table's options:
        ``view``, ``sort``, ``fmt``, ``columns``, ``match``, ``min_share``, ``top_syncs``."""
        return _output.report(self, options)

    def save(self, path: str | os.PathLike[str], **options: Unpack[_output.Window]) -> Summary:
        """Write this Timer's results as JSON with per-step rows and trace samples (read back
        exactly by ``cudatimer.load``); returns the Summary written."""
        return _output.save(self, path, options)

    def reset(self) -> None:
        """Forget every result of this Timer. Samples still on the GPU are discarded when they
        finish (their events go back to the pool); regions open now are not recorded, regions
        opened from now on are (inside those, too). The Region objects and paths the Timer
        cached are released (a region held elsewhere, by a decorator, keeps working). The
        notes of the boundary sources (regions left out of compiled code, graph replays lost)
        go with the results."""
        self._regions = {}
        self._samplers = {}
        self.recorder.reset()

    def step_series(self, **options: Unpack[_output.Window]) -> tuple[StepStats, ...]:
        """Per-step time of every region, one ``StepStats`` per (step, region, clock), ordered
        by step then tree order, for the kept steps (the last ``keep_steps``) in the window."""
        return _output.step_series(self, options)

    def export_trace(
        self, path: StrPath | IO[str], **options: Unpack[_output.TraceOptions]
    ) -> None:
        """Write the last ``trace_samples`` calls (or ``summary``'s) as a Chrome/Perfetto trace
        (JSON; https://ui.perfetto.dev): GPU spans per device and stream, host spans per thread."""
        _output.export_trace(self, path, options)

    def to_csv(self, path: StrPath | IO[str], **options: Unpack[_output.TableOptions]) -> None:
        """Write regions (``what="regions"``), per-step stats ("steps") or trace samples
        ("trace") as CSV to a path or a text stream."""
        _output.to_csv(self, path, options)

    def to_dataframe(self, **options: Unpack[_output.TableOptions]) -> Any:
        """A pandas DataFrame of regions, per-step stats ("steps") or trace samples ("trace")
        (pandas is optional; ImportError names it if missing)."""
        return _output.to_dataframe(self, options)

    def plot(self, path: StrPath | IO[bytes], **options: Unpack[_output.PlotOptions]) -> None:
        """Write a PNG of where time goes (the ``top`` regions, GPU vs CPU; time per step when
        steps were marked). Needs matplotlib."""
        _output.plot(self, path, options)

    def html(self, path: StrPath | IO[str], **options: Unpack[_output.HtmlOptions]) -> None:
        """Write one self-contained HTML page of this Timer's results, or of ``summary`` (a
        Summary or a cross-rank ``RankSummary``); ``base``: a run to compare with first (by
        ``stat``, within ``tolerance``); ``top``: regions charted per step; ``title``."""
        _output.html(self, path, options)


def live_timers() -> list[Timer]:
    """Every Timer alive now, oldest first (sync detection and the report at exit look them
    up in the one registry, ``sources._source.TIMERS``)."""
    timers: list[Timer] = TIMERS.live()
    return timers


def _bury_open_frames(grave: list[Any]) -> None:
    for timer in live_timers():
        timer.recorder.bury(grave)


_device.on_fork(_bury_open_frames)


def _skip_dynamo() -> None:
    """Dynamo must never compile the recorder's own frames (see ``_wrap.skip_dynamo_frames``)."""
    import sys

    from ..core import _device
    from ..recorder import _recorder, _view
    from ..records import _hist
    from ..sources import _compile
    from . import _nvtx, _wrap

    # _compile too: its functions are inlined where Dynamo traces them (marking a code object
    # only stops Dynamo from starting a compile at it), and the mark ops' bodies, which run
    # while compiled code runs, then cost no frame evaluation.
    _wrap.skip_dynamo_frames(
        sys.modules[__name__], _compile, _device, _hist, _nvtx, _recorder, _view, _wrap
    )


_skip_dynamo()

_DEFAULT = Timer()


def default_timer() -> Timer:
    """The Timer behind the module-level functions (``cudatimer.cuda_region`` and the rest).

    >>> import cudatimer
    >>> cudatimer.default_timer() is cudatimer.default_timer()
    True
    """
    return _DEFAULT
