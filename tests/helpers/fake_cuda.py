"""A fake CUDA for the recorder's CUDA paths on a machine without a GPU.

It replaces the few CUDA entry points cudatimer uses (``_cuda_getCurrentStream``, the capture
check, Stream and Event construction, the caching allocator's event history:
``FakeAllocator``) with deterministic stand-ins: each stream has a virtual
"busy until" time in ms, ``run(ms)`` queues work on a stream, an event recorded on a stream takes
that stream's busy-until time, and events complete when the test says so (all, by default).
Timing semantics follow what was measured on an H200: elapsed_time raises ValueError on an
unrecorded event and RuntimeError on an unfinished one or on events of two devices; query never
blocks.

The real behaviour is checked on the GPU (tests/gpu/); this checks the recorder's logic.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from cudatimer.core import _device


class FakeEvent:
    """A timing event: records a stream's busy-until time; complete once the GPU passed it."""

    def __init__(self, gpu: FakeGPU, device: int) -> None:
        self.gpu = gpu
        self.device = device
        self.t_ms: float | None = None
        self.stream: tuple[int, int, int] | None = None

    def record(self, stream: Any) -> None:
        key = (int(stream.stream_id), int(stream.device_index), 1)
        if key[1] != self.device:
            raise RuntimeError(
                f"Event device {self.device} does not match recording stream's device {key[1]}"
            )
        if self.gpu.capturing.get(key):
            self.gpu.poisoned.add(id(self))  # a timing event recorded in capture is poisoned
        self.gpu.records += 1
        self.stream = key
        self.t_ms = self.gpu.busy.get(key, 0.0)

    def query(self) -> bool:
        if self.gpu.query_cpu_s:  # a slow driver: this much CPU per query
            end = time.thread_time() + self.gpu.query_cpu_s
            while time.thread_time() < end:
                pass
        if self.gpu.any_capturing():
            raise RuntimeError("operation not permitted when stream is capturing")
        return self.t_ms is None or self.t_ms <= self.gpu.done_ms.get(self.stream, math.inf)

    def elapsed_time(self, end: FakeEvent) -> float:
        if self.t_ms is None or end.t_ms is None:
            raise ValueError("Both events must be recorded before calculating elapsed time.")
        if id(self) in self.gpu.poisoned or id(end) in self.gpu.poisoned:
            raise RuntimeError("CUDA error: invalid argument")
        if self.device != end.device:
            raise RuntimeError("Both events must be on the same device")
        if not (self.query() and end.query()):
            raise RuntimeError("Both events must be completed before calculating elapsed time.")
        return end.t_ms - self.t_ms


class FakeGPU:
    """Streams, devices and a virtual GPU clock; install() plugs it into cudatimer's device
    seam (``cudatimer.core._device.use``), as a ``_device.Device``."""

    native = False  # not torch's stream getter: the C core calls ours

    def __init__(self, devices: int = 2) -> None:
        self.devices = devices
        self.local = threading.local()
        self.busy: dict[tuple[int, int, int], float] = {}
        self.done_ms: dict[tuple[int, int, int] | None, float] = {}
        self.capturing: dict[tuple[int, int, int], bool] = {}
        self.poisoned: set[int] = set()
        self.records = 0
        self.query_cpu_s = 0.0  # CPU seconds each event query burns (0: free)
        self._next_id = 100
        # CUDA graphs (FakeGraph): the ops a graph capture on a stream took so far.
        self.graph_ops: dict[tuple[int, int, int], list[tuple[Any, ...]]] = {}
        self.copies_held = False  # device timestamp copies stay unfinished while True
        self.copies = 0
        self.recycled = 0  # copies read and given back
        self._stamps: dict[int, FakeStamps] = {}
        self.memory = FakeAllocator(self)

    # -- what a test drives ------------------------------------------------------------------
    def new_stream(self, device: int = 0) -> torch.Stream:
        self._next_id += 1
        return torch.Stream(stream_id=self._next_id, device_index=device, device_type=1)

    def default_stream(self, device: int = 0) -> torch.Stream:
        return torch.Stream(stream_id=0, device_index=device, device_type=1)

    def run(self, ms: float, stream: torch.Stream | None = None) -> None:
        """Queue ``ms`` of work on ``stream`` (the current stream by default); inside a
        FakeGraph capture, capture it instead (each replay runs it)."""
        key = self.current_key() if stream is None else self.key(stream)
        ops = self.graph_ops.get(key)
        if ops is not None:
            ops.append(("work", ms))
            return
        self.busy[key] = self.busy.get(key, 0.0) + ms

    def hold(self, stream: torch.Stream | None = None) -> None:
        """Events recorded on ``stream`` from now on stay unfinished until release()."""
        key = self.current_key() if stream is None else self.key(stream)
        self.done_ms[key] = self.busy.get(key, 0.0) - 1e-9

    def release(self) -> None:
        self.done_ms.clear()

    @contextmanager
    def use(self, stream: torch.Stream) -> Iterator[None]:
        """Like ``torch.cuda.stream(s)``: current stream of s's device, on this thread."""
        streams = self._streams()
        key = self.key(stream)
        prev = streams.get(key[1])
        streams[key[1]] = key
        try:
            yield
        finally:
            if prev is None:
                del streams[key[1]]
            else:
                streams[key[1]] = prev

    def set_stream(self, stream: torch.Stream) -> None:
        """Like ``torch.cuda.set_stream(s)``: not restored."""
        key = self.key(stream)
        self._streams()[key[1]] = key

    def set_device(self, device: int) -> None:
        self.local.device = device

    @contextmanager
    def capture(self, stream: torch.Stream) -> Iterator[None]:
        """Like ``torch.cuda.graph``: ``stream`` is current and capturing inside."""
        key = self.key(stream)
        with self.use(stream):
            self.capturing[key] = True
            try:
                yield
            finally:
                self.capturing[key] = False

    # -- what cudatimer calls ----------------------------------------------------------------
    @staticmethod
    def key(stream: Any) -> tuple[int, int, int]:
        return (int(stream.stream_id), int(stream.device_index), 1)

    def _streams(self) -> dict[int, tuple[int, int, int]]:
        streams = getattr(self.local, "streams", None)
        if streams is None:
            streams = self.local.streams = {}
        return streams

    def current_device(self) -> int:
        return int(getattr(self.local, "device", 0))

    def current_key(self) -> tuple[int, int, int]:
        return self.get_stream(-1)

    def get_stream(self, device: int) -> tuple[int, int, int]:
        if device == -1:
            device = self.current_device()
        if not 0 <= device < self.devices:
            raise RuntimeError(f"invalid device ordinal {device}")
        return self._streams().get(device, (0, device, 1))

    def is_capturing(self) -> bool:
        return bool(self.capturing.get(self.current_key()))

    def any_capturing(self) -> bool:
        return any(self.capturing.values())

    def is_initialized(self) -> bool:
        return True

    def stream(self, key: tuple[int, int, int]) -> torch.Stream:
        return torch.Stream(stream_id=key[0], device_index=key[1], device_type=1)

    def event_factory(self, device: int, stream: Any) -> tuple[Callable[[], Any], int | None]:
        return (lambda: FakeEvent(self, device)), None

    def stamps(self, device: int) -> FakeStamps:
        if device not in self._stamps:
            self._stamps[device] = FakeStamps(self)
        return self._stamps[device]

    def marker(self, key: tuple[int, int, int]) -> None:
        return None

    def allocator(self) -> FakeAllocator:
        return self.memory


class FakeAllocator:
    """The caching allocator's event history on the fake GPU (``_device.Allocator``): a test
    allocates and frees bytes on a device (``alloc``/``free``), each event carries the
    calling thread's metadata as ``tag`` last set it, and ``read`` hands over the events
    since the last read, as the real history does when cudatimer owns it.

    ``why``: set it to a reason to make the allocator unusable; ``lose``: devices whose next
    read reports lost events; ``capacity``: bytes a device holds (an allocation past it raises
    torch.OutOfMemoryError, as the real allocator does). ``pause`` turns the history off
    (events then are not recorded, what it held is dropped) and ``resume`` on again, as
    ``_record_memory_history`` does; ``owned = False`` makes it the program's own history,
    which cudatimer never turns off."""

    @property
    def ring(self) -> int | None:
        return 65536 if self.owned else None

    def __init__(self, gpu: FakeGPU) -> None:
        self.gpu = gpu
        self.local = threading.local()
        self.events: dict[int, list[tuple[str, int]]] = {}
        self.level: dict[int, int] = {}
        self.why: str | None = None
        self.lose: set[int] = set()
        self.capacity = 1 << 40
        self.tags = 0  # boundaries marked
        self.reads = 0
        self.starts = 0
        self.owned = True
        self.recording = False  # the history is recorded (start, resume; not after pause)
        self.pauses = 0
        self.resumes = 0
        self.recorded = 0  # events the history recorded
        #: Called after each boundary's mark, before cudatimer keeps the boundary (a test
        #: reads the history there, as another thread might).
        self.on_tag: Callable[[], None] | None = None

    def why_not(self) -> str | None:
        return self.why

    def start(self) -> str | None:
        self.starts += 1
        self.recording = True
        return None

    def pause(self) -> bool:
        if not self.owned:
            return False
        self.pauses += 1
        self.recording = False
        self.events = {}
        return True

    def resume(self) -> None:
        self.resumes += 1
        self.recording = True

    def tag(self, text: str) -> None:
        self.tags += 1
        self.local.meta = text
        if self.on_tag is not None:
            self.on_tag()

    def _event(self, device: int, nbytes: int) -> None:
        self.level[device] = self.level.get(device, 0) + nbytes
        if not self.recording and self.owned:
            return
        self.recorded += 1
        meta = getattr(self.local, "meta", "")
        self.events.setdefault(device, []).append((meta, nbytes))

    def alloc(self, nbytes: int, device: int | None = None) -> tuple[int, int]:
        """Allocate ``nbytes`` on ``device`` (the current one by default); the handle frees it."""
        dev = self.gpu.current_device() if device is None else device
        if self.level.get(dev, 0) + nbytes > self.capacity:
            raise torch.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {nbytes} bytes on device {dev}"
            )
        self._event(dev, nbytes)
        return (dev, nbytes)

    def free(self, handle: tuple[int, int]) -> None:
        self._event(handle[0], -handle[1])

    def temp(self, nbytes: int, device: int | None = None) -> None:
        """Allocate and free ``nbytes`` at once (a temporary)."""
        self.free(self.alloc(nbytes, device))

    def read(self) -> tuple[dict[int, list[tuple[str, int]]], set[int]]:
        self.reads += 1
        events, self.events = self.events, {}
        lost, self.lose = self.lose, set()
        return events, lost

    def usage(self, device: int) -> tuple[int, int]:
        allocated = self.level.get(device, 0)
        return allocated, allocated + (1 << 20)


class FakeCopy:
    """A copy of a timestamp chunk: it reads the chunk at once (stream order: the GPU is
    done with the replays before it), or, while copies are held, when they are released
    (a copy that ran late, after more replays)."""

    def __init__(self, gpu: FakeGPU, chunk: list[int], cap: int) -> None:
        self.gpu = gpu
        self.chunk = chunk
        self.cap = cap
        self._words: torch.Tensor | None = None if gpu.copies_held else self._read()

    def _read(self) -> torch.Tensor:
        count = self.chunk[self.cap + 1]
        return torch.tensor([count, *self.chunk[: self.cap], count], dtype=torch.int64)

    def done(self) -> bool:
        if self.gpu.copies_held:
            return False
        if self._words is None:
            self._words = self._read()
        return True

    def words(self) -> torch.Tensor:
        assert self._words is not None, "words() before done()"
        return self._words

    def recycle(self) -> None:
        self.gpu.recycled += 1


class FakeStamps:
    """Device timestamps (``cudatimer.core._stamps.Stamps``) on the fake GPU: captured as graph
    ops, written at replay with the stream's virtual clock in ns."""

    def __init__(self, gpu: FakeGPU) -> None:
        self.gpu = gpu
        self.stamped = 0  # timestamps captured

    def _ops(self) -> list[tuple[Any, ...]]:
        ops = self.gpu.graph_ops.get(self.gpu.current_key())
        if ops is None:
            raise RuntimeError("a timestamp kernel launched outside a graph capture")
        return ops

    def chunk(self, cap: int) -> list[int]:
        return [0] * (cap + 2)

    def stamp(self, chunk: list[int], k: int, cap: int) -> None:
        self.stamped += 1
        self._ops().append(("stamp", chunk, k, cap))

    def advance(self, chunk: list[int], n: int, cap: int) -> None:
        self._ops().append(("advance", chunk, n, cap))

    def position(self) -> Any:
        ops = self.gpu.graph_ops.get(self.gpu.current_key())
        return None if ops is None else (id(ops), len(ops))

    def copy(self, chunk: list[int], cap: int, after: list[Any] | None) -> FakeCopy:
        self.gpu.copies += 1
        return FakeCopy(self.gpu, chunk, cap)


class FakeGraph:
    """A CUDA graph on the fake GPU, through the same hooks as ``torch.cuda.CUDAGraph``
    (``cudatimer.sources._capture``): ``with g.capture(stream):`` captures, ``g.replay()`` runs
    the captured work and timestamps on the current stream."""

    def __init__(self, gpu: FakeGPU) -> None:
        self.gpu = gpu
        self.ops: list[tuple[Any, ...]] = []

    @contextmanager
    def capture(self, stream: torch.Stream) -> Iterator[None]:
        from cudatimer.sources import _capture

        gpu = self.gpu
        key = gpu.key(stream)
        with gpu.use(stream):
            _capture.capture_begin(self)
            gpu.capturing[key] = True
            ops: list[tuple[Any, ...]] = []
            gpu.graph_ops[key] = ops
            try:
                yield
                _capture.capture_end(self)
            finally:
                del gpu.graph_ops[key]
                gpu.capturing[key] = False
        self.ops = ops

    def replay(self) -> None:
        from cudatimer.sources import _capture

        _capture.replay(self, FakeGraph._run)

    def _run(self) -> None:
        gpu = self.gpu
        key = gpu.current_key()
        for op in self.ops:
            if op[0] == "work":
                gpu.busy[key] = gpu.busy.get(key, 0.0) + op[1]
            elif op[0] == "stamp":
                _, chunk, k, cap = op
                chunk[(chunk[cap] + k) % cap] = round(gpu.busy.get(key, 0.0) * 1e6)
            else:
                _, chunk, n, cap = op
                chunk[cap] = (chunk[cap] + n) % cap
                chunk[cap + 1] += 1

    def reset(self) -> None:
        from cudatimer.sources import _capture

        _capture.reset(self)
        self.ops = []


@contextmanager
def install() -> Iterator[FakeGPU]:
    """Give cudatimer a fake two-device CUDA inside the block: regions get fake events.

    Use it from a fixture: ``with install() as gpu: yield gpu``.
    """
    gpu = FakeGPU()
    old = _device.use(gpu)
    try:
        yield gpu
    finally:
        _device.use(old)
