"""The recorder contract: what ``_speedups`` (C) and ``_core_py`` (plain Python, the reference)
both implement, and all the rest of cudatimer may use of them. ``_core`` picks one at import.

Behind it: everything done per sample (the per-thread stacks, stream records with their event
pools and pending samples, the harvest and trace placement, the fold into histograms, the
per-step series and the trace ring) and the switches a Timer's regions read (``Store.enabled``,
``Store.step``, ``Store.gen``). Outside it, in Python: options, the region tree (slot numbers
for region paths, given through ``Store``'s ``child`` callback), windows, records, renderers.

A region boundary is recorded by a *source*: today a pooled CUDA event on a stream
(``StreamRec``, whose harvest folds into the store) or the host clock (``Store.record`` by the
general path). Another source (a marker op in compiled graphs, a device timestamp in a CUDA
graph) only has to call ``Store.record`` with the sample it resolved: the records and the
renderers never see where a sample came from.

Both implementations hold to this file name by name and signature by signature (checked by
``tests/test_core_stub.py``): parameter names, kinds and defaults, and no public name besides.
A ``/`` marks the parameters the C core takes by position only (one-argument and fast-call
methods: no keyword parsing on the hot path); the Python core takes them the same way. The
records (``HistState`` to ``Snapshot``) are ``NamedTuple`` classes in Python and struct
sequences in C: their fields, by name and in this order, are the contract; only the core builds
them. The C core's own extras are declared in ``_speedups.pyi``.
"""

from collections.abc import Callable
from types import TracebackType
from typing import Any, Final, NamedTuple

IMPL: Final[str]  # "c" or "python"

# Frame kinds
TIMED: Final[int]  # start event recorded on ``rec``: the exit records the end, a pending sample
HOST: Final[int]  # host clock only
SKIP: Final[int]  # entered while its stream captured a CUDA graph: host time, counted skipped
OFF: Final[int]  # the Timer was off at enter: the exit pops the frame, nothing else
NVTX: Final[int]  # mode="nvtx": the exit pops the NVTX range only
UNTIMED: Final[int]  # every=N, a call not sampled: the exit counts it on clock ``dev``
ORPHAN: Final[int]  # closed on another thread (Store.orphan): its own thread drops it
GRAPH: Final[int]  # entered while its stream captured a CUDA graph (``_capture``): timestamps

def configure(
    *, inv_log_gamma: float, harvest_batch: int, anchor_hop_ms: float, prewarm: int
) -> None: ...
def set_stream_getter(getter: Callable[[int], tuple[int, int, int]] | None, c10: bool) -> None:
    """``getter(device)`` -> (stream id, device, device type) of the current stream (-1: the
    current device). ``c10``: the getter is torch's own and checked, so the C implementation
    may read c10's current stream directly instead of calling it."""

def set_usable(on: bool, /) -> None: ...
def runtime_bound() -> bool: ...
def now_ns() -> int:
    """The host clock of every sample (CLOCK_MONOTONIC), in ns."""

class Frame:
    region: Any
    slot: int
    gen: int
    kind: int
    rec: StreamRec | None
    start: Any
    t0_ns: int
    dev: int  # clock of an UNTIMED frame: device index, -1 host
    range_id: Any  # NVTX range of a detached frame (not on a stack), else None
    def __init__(
        self,
        region: Any,
        slot: int,
        gen: int,
        kind: int,
        rec: StreamRec | None = None,
        start: Any = None,
        t0_ns: int = 0,
        dev: int = -1,
        range_id: Any = None,
    ) -> None: ...

class Stack:
    """A thread's (or a running asyncio task's) open regions of one store, innermost last."""

    @property
    def tid(self) -> int: ...
    @property
    def base(self) -> int:
        """The slot regions nest under while it is empty: -1 (the root) for a thread; for a
        task, the innermost region open where the task first opened one."""
    def push(self, frame: Frame, /) -> None: ...
    def pop(self) -> Frame:
        """The innermost frame, removed (IndexError when empty)."""

    def top(self) -> Frame | None: ...
    def take(self, region: Any, /) -> Frame | None:
        """Remove and return the innermost frame of ``region`` (None if it has none)."""

    def frames(self) -> list[Frame]: ...
    def clear(self) -> None: ...
    def bury(self, grave: list[Any], /) -> None:
        """Forked child: TIMED frames become HOST frames, their events go into ``grave``."""

    def __len__(self) -> int: ...

class StreamRec:
    """A stream regions ran on: event pool, pending samples, trace reference and anchor."""

    @property
    def key(self) -> tuple[int, int, int]: ...
    @property
    def device(self) -> int: ...
    @property
    def stream(self) -> Any: ...
    @property
    def ref_ns(self) -> int: ...
    @property
    def anchor_ms(self) -> float: ...
    @property
    def anchor_is_ref(self) -> bool: ...
    @property
    def pooled(self) -> int: ...
    @property
    def pending(self) -> int: ...
    def __init__(
        self,
        key: tuple[int, int, int],
        stream: Any,
        raw: int | None,
        make_event: Callable[[], Any],
    ) -> None:
        """Records the trace reference and ``prewarm`` pooled events on ``stream`` now.
        ``raw``: its cudaStream_t, for records through the runtime (None: torch's record)."""

    def take(self, torch_record: bool = False) -> Any:
        """A pooled event recorded on this stream now (``torch_record``: by torch's record,
        which switches to the event's device first)."""

    def give(self, event: Any, /) -> None: ...
    def push(
        self,
        store: Store,
        slot: int,
        gen: int,
        start: Any,
        end: Any,
        extra: tuple[Any, ...],
        t0: int,
        t1: int,
        step: int,
        tid: int,
    ) -> None:
        """Queue a sample (GPU time: ``start`` to the latest of ``end`` and ``extra``); every
        HARVEST_BATCH samples the finished ones are harvested, without blocking."""

    def harvest(self) -> None: ...

def stream_of(key: tuple[int, int, int], /) -> StreamRec | None: ...
def new_stream(
    key: tuple[int, int, int], stream: Any, raw: int | None, make_event: Callable[[], Any], /
) -> StreamRec:
    """Make and register the record of ``key`` (a default stream's also serves the hot path)."""

def all_streams() -> list[StreamRec]: ...
def forget_streams(grave: list[Any] | None = None) -> None: ...
def pending_total() -> int: ...
def clear_pending() -> None: ...
def drain(timeout_s: float, /) -> int:
    """Poll (never block in CUDA) until every stream's newest sample is done or the time is
    up, harvest, and return how many samples are still pending."""

class HistState(NamedTuple):
    """A distribution as ``_hist.Histogram`` takes it (``Histogram(*state)``)."""

    n: int
    total: float
    min: float
    max: float
    zeros: int
    buckets: tuple[tuple[int, int], ...]

class SlotStats(NamedTuple):
    slot: int
    dev: int  # -1: host clock
    order: int
    calls: int
    skipped: int
    gpu: HistState
    cpu: HistState

class SeriesRow(NamedTuple):
    step: int
    slot: int
    dev: int
    gpu_ms: bytes  # native float64 values
    cpu_ms: bytes

class TraceItem(NamedTuple):
    slot: int
    dev: int
    stream: int
    at_ns: float  # GPU start on the host clock; NaN: unknown
    gpu_ms: float  # NaN: host sample
    t0_ns: int
    cpu_ms: float
    step: int
    tid: int

class Snapshot(NamedTuple):
    stats: list[SlotStats]
    kept: tuple[int, ...]
    dropped: tuple[int, ...]
    series: list[SeriesRow]
    trace: list[TraceItem]

class Store:
    """One Timer's results and switches."""

    enabled: bool
    step: int
    @property
    def gen(self) -> int: ...
    @property
    def keep_steps(self) -> int: ...
    @property
    def trace_samples(self) -> int: ...
    @property
    def step_cap(self) -> int:
        """Raw samples kept per step; past it the step's series are dropped."""
    @property
    def child(self) -> Callable[[int, str], int]: ...
    def __init__(
        self,
        keep_steps: int,
        trace_samples: int,
        step_cap: int,
        child: Callable[[int, str], int],
    ) -> None: ...
    def stack(self) -> Stack:
        """The calling thread's stack, or the running asyncio task's (tasks interleave on
        one thread; each nests its own regions)."""

    def open_slots(self) -> list[int]:
        """The slots of the frames open on every stack of this store, and the stacks' bases
        (what the region tree keeps at ``reset()``)."""

    def open_frames(self) -> list[tuple[int, int, int, int, int]]:
        """Every frame open on a stack of this store now, as ``(stack, tid, slot, kind,
        t0_ns)``: ``stack`` numbers the stacks of this call, each stack's frames come
        outermost first, ORPHAN frames are left out (``t0_ns`` is 0 where the kind keeps no
        host time: OFF, NVTX, UNTIMED). Changes nothing; any thread may call it."""

    def reset(self) -> None: ...
    def record(
        self,
        slot: int,
        gen: int,
        dev: int,
        gpu_ms: float,
        cpu_ms: float,
        step: int,
        t0_ns: int,
        tid: int,
        at_ns: float,
        stream: int,
        skipped: bool,
    ) -> None: ...
    def record_ring(
        self,
        gen: int,
        dev: int,
        ring: Any,
        first: int,
        n: int,
        slots: Any,
        enter: Any,
        leave: Any,
        step: Any,
        t0_ns: Any,
        tid: Any,
        stream: Any,
        offset_ns: float,
    ) -> float:
        """Fold m replays of a CUDA graph read from its timestamp ring (the graph's whole
        ring, ``cap`` int64 words): replay ``i``'s ``n`` timestamps (GPU-clock ns) start at
        word ``(first + i*n) % cap``; column ``j`` is the region call of slot ``slots[j]``
        between its replay's timestamps ``enter[j]`` and ``leave[j]``. Buffers of native int64:
        ``slots``, ``enter``, ``leave`` (c each), ``step``, ``t0_ns``, ``tid``, ``stream`` (m
        each). ``offset_ns``: the least GPU-minus-host clock offset seen so far (inf: none);
        the block's least lead of a first timestamp over ``t0_ns`` lowers it, and the trace
        starts are placed with the result (``at_ns = timestamp - offset``), which is returned.
        CPU time is 0; ValueError on a length or index that does not fit."""
    def count(self, slot: int, gen: int, dev: int) -> None: ...
    def orphan(self, region: Any, /) -> bool:
        """Mark the innermost frame of ``region`` on another thread's stack ORPHAN (a call
        closed elsewhere: a generator collected on another thread); False if none."""

    def snapshot(self, series: bool = False, trace: bool = False) -> Snapshot: ...
    def step_rows(self, first: int, stop: int) -> list[SeriesRow]:
        """The rows of the kept steps with ``first <= step < stop`` (as ``snapshot(series=True)``
        gives them), in the order the steps were kept; changes nothing. Costs the rows asked
        for, not every kept step's: what a per-step feed reads as steps finish."""
    def pending(self) -> int: ...

class RegionBase:
    def bind(
        self,
        store: Store,
        fast: bool,
        name: str,
        push: Callable[[Any], Any] | None,
        attrs: Any,
        pop: Callable[[], Any] | None,
        enter: Callable[[Any], None],
        exit: Callable[[Any, Any], None],
        start: Callable[[Any], Any] | None = None,
        end: Callable[[Any], Any] | None = None,
    ) -> None:
        """``exit(region, exc_type)``: the general hook, with the block's exception type;
        ``start(attrs)`` -> range id and ``end(range_id)``: NVTX of detached calls."""
    def open_at(self, slot: int, gen: int, /) -> Frame | None:
        """A detached call (a frame on no stack: a backward row) at ``slot`` in the common
        case of ``__enter__``: a TIMED frame, its start recorded on the current device's
        default stream now, its NVTX range started; None, with nothing done, otherwise (the
        caller takes the general path)."""
    def close(self, frame: Frame, /) -> bool:
        """End a TIMED frame of this region whose stream is still the current one: the end
        recorded, the sample queued, the NVTX range ended, the frame OFF afterwards. False,
        with nothing done, for any other frame or stream (the general path's)."""
    def __enter__(self) -> Any: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
        /,
    ) -> None: ...

class NullRegion:
    """What regions become under ``CUDATIMER_DISABLE``: nothing on enter, exit or call."""

    @property
    def name(self) -> str:
        """``""``: a disabled region has no name."""
    def __enter__(self) -> NullRegion: ...
    def __exit__(self, *exc: object) -> None: ...
    def __call__(self, fn: Any, /) -> Any:
        """``fn`` itself: a decorated function comes back unchanged."""
    def backward_from(self, *outputs: object) -> None: ...
