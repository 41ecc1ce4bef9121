"""Device timestamps for CUDA graphs: the one part of graph timing that runs on the GPU.

A region inside a captured graph cannot use a timing event (recorded in capture, it poisons
the graph; an external event is overwritten by every replay). Instead each boundary adds a
one-thread kernel node that reads ``%globaltimer`` (ns, 32 ns steps on an H200) into a ring
of int64 words the graph owns; the graph's last node moves the ring's write offset on and
counts the replay. Measured on an H200 (torch 2.11): 0.06-0.09 us of a replay's GPU time per
timestamp on a branch off the captured stream (1.13 us on the stream itself); NVRTC compiles
the kernels in about 0.5 s, once per process and device, before the first capture. A third
kernel copies a chunk into pinned host memory for the host to read.

A chunk is ``cap + 2`` words: the ring ``[0, cap)``, then the offset of the replay being
written (``cap``) and the count of finished replays (``cap + 1``). ``_capture`` holds the
bookkeeping; this module is the narrow device primitive it calls (the fake GPU of the tests
gives its own with the same methods).
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any, Protocol

import torch

__all__ = ["Copy", "CudaStamps", "Stamps", "cuda_stamps", "why_not"]

_SOURCE = r"""
extern "C" __global__ void ct_stamp(long long* chunk, int k, int cap) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    long long base = chunk[cap];
    chunk[(base + k) % cap] = (long long)t;
}
extern "C" __global__ void ct_advance(long long* chunk, int n, int cap) {
    chunk[cap] = (chunk[cap] + n) % cap;
    chunk[cap + 1] += 1;
}
// One block copies a chunk into pinned host memory (its address in two ints: the launcher
// passes ints as 32-bit), in the order the host reads it: the count of finished replays, the
// ring, the count again; barriers keep the three reads in that order against a replay that
// runs meanwhile on another stream.
extern "C" __global__ void ct_snapshot(const long long* chunk, int lo, int hi, int cap) {
    long long* dst = (long long*)(((unsigned long long)(unsigned)hi << 32) | (unsigned)lo);
    const volatile long long* src = chunk;
    __shared__ long long before;
    if (threadIdx.x == 0) before = src[cap + 1];
    __syncthreads();
    for (int i = threadIdx.x; i < cap; i += blockDim.x) dst[1 + i] = src[i];
    __syncthreads();
    if (threadIdx.x == 0) {
        dst[0] = before;
        dst[cap + 1] = src[cap + 1];
    }
}
"""


class Copy(Protocol):
    """An asynchronous copy of a chunk to host memory."""

    def done(self) -> bool:
        """Whether the copy finished (never blocks)."""
        ...

    def words(self) -> Any:
        """``[count before, ring..., count after]`` as a CPU int64 tensor; once ``done()``."""
        ...

    def recycle(self) -> None:
        """The words were read: their buffer may take the next copy."""
        ...


class Stamps(Protocol):
    """What graph timing asks of a device."""

    def chunk(self, cap: int) -> Any:
        """A zeroed chunk of ``cap + 2`` words (called outside capture)."""
        ...

    def stamp(self, chunk: Any, k: int, cap: int) -> None:
        """Capture timestamp ``k`` on the current stream."""
        ...

    def advance(self, chunk: Any, n: int, cap: int) -> None:
        """Capture the end of a replay of ``n`` timestamps on the current stream."""
        ...

    def position(self) -> Any:
        """What the current stream's capture last added (equal across two calls: nothing was
        captured on it in between), or None when unknown."""
        ...

    def copy(self, chunk: Any, cap: int, after: list[Any] | None) -> Copy:
        """Start copying ``chunk`` to the host without blocking it: on the current stream
        (``after`` None: behind the replays launched on it), or on a side stream behind the
        events ``after``."""
        ...


class _CudaCopy:
    def __init__(self, staging: Any, event: Any, free: list[Any]) -> None:
        self._staging = staging
        self._event = event
        self._free = free

    def done(self) -> bool:
        return bool(self._event.query())

    def words(self) -> Any:
        return self._staging

    def recycle(self) -> None:
        self._free.append(self._staging)


class _Chunk:
    """A graph's ring on the device, and the side stream its timestamps branch onto."""

    def __init__(self, words: Any, side: Any, fork: Any) -> None:
        self.words = words
        self.side = side
        self.fork = fork
        self.stamped = False
        # Pinned buffers read and free again: a new pinned buffer of 512 KiB per copy cost ~9 us
        # a replay (amortised over the 324 replays between copies; H200 host, torch 2.11).
        self.free: list[Any] = []


class _CaptureInfo:
    """``cuStreamGetCaptureInfo`` of the driver, through ctypes: the nodes the next captured
    node would depend on. A stream whose only dependency is the previous timestamp's node
    captured nothing since, so two boundaries with no work between them share a timestamp."""

    def __init__(self) -> None:
        self._fn: Any = None
        self._v3 = False
        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError:
            return
        for name, v3 in (("cuStreamGetCaptureInfo_v3", True), ("cuStreamGetCaptureInfo_v2", False)):
            fn = getattr(lib, name, None)
            if fn is not None:
                fn.restype = ctypes.c_int
                self._fn, self._v3 = fn, v3
                return

    def last_node(self, stream: int) -> Any:
        if self._fn is None:
            return None
        status = ctypes.c_int(0)
        cid = ctypes.c_uint64(0)
        graph = ctypes.c_void_p(0)
        deps = ctypes.POINTER(ctypes.c_void_p)()
        count = ctypes.c_size_t(0)
        out = [ctypes.byref(v) for v in (status, cid, graph, deps)]
        if self._v3:  # v3 has the edges' data before the count
            out.append(ctypes.byref(ctypes.c_void_p(0)))
        rc = self._fn(ctypes.c_void_p(stream), *out, ctypes.byref(count))
        if rc != 0 or status.value != 1 or count.value != 1:  # 1: CU_STREAM_CAPTURE_STATUS_ACTIVE
            return None
        return (cid.value, deps[0])


class CudaStamps:
    """The timestamp kernels of one CUDA device (compiled by NVRTC when first needed)."""

    def __init__(self, device: int) -> None:
        self.device = device
        compile_kernel = torch.cuda._compile_kernel  # type: ignore[attr-defined]
        with torch.cuda.device(device):
            self._stamp = compile_kernel(_SOURCE, "ct_stamp")
            self._advance = compile_kernel(_SOURCE, "ct_advance")
            self._snapshot = compile_kernel(_SOURCE, "ct_snapshot")
        self._info = _CaptureInfo()
        self._side: Any = None

    def chunk(self, cap: int) -> _Chunk:
        return _Chunk(
            torch.zeros(cap + 2, dtype=torch.int64, device=f"cuda:{self.device}"),
            torch.cuda.Stream(device=self.device),  # type: ignore[no-untyped-call]
            torch.cuda.Event(),  # type: ignore[no-untyped-call]
        )

    def stamp(self, chunk: Any, k: int, cap: int) -> None:
        # A branch off the captured stream: the timestamp node depends on the work before it,
        # and nothing depends on it but the next timestamp and the graph's end. On the
        # stream itself each one delayed the next kernel by ~1.1 us (a graph node's launch).
        main = torch.cuda.current_stream(self.device)
        chunk.fork.record(main)
        chunk.side.wait_event(chunk.fork)
        with torch.cuda.stream(chunk.side):  # type: ignore[no-untyped-call]
            self._stamp(grid=(1, 1, 1), block=(1, 1, 1), args=[chunk.words, k, cap])
        chunk.stamped = True

    def advance(self, chunk: Any, n: int, cap: int) -> None:
        if chunk.stamped:
            torch.cuda.current_stream(self.device).wait_stream(chunk.side)  # join the branch
        self._advance(grid=(1, 1, 1), block=(1, 1, 1), args=[chunk.words, n, cap])

    def position(self) -> Any:
        raw = torch._C._cuda_getCurrentRawStream(self.device)  # type: ignore[attr-defined]
        return self._info.last_node(int(raw))

    def copy(self, chunk: Any, cap: int, after: list[Any] | None) -> Copy:
        # On the replays' own stream a copy reads exactly the replays before it; a report's
        # copy waits for every stream the graph was replayed on, from a side stream. One
        # kernel writes the pinned buffer (host memory is addressable from the device under
        # unified addressing): three copy_ calls took ~270 us of host time each time on an
        # H200 host (0.8 us a replay amortised), the kernel's launch a few us.
        if after is None:
            stream = torch.cuda.current_stream(self.device)
        else:
            if self._side is None:
                self._side = torch.cuda.Stream(device=self.device)  # type: ignore[no-untyped-call]
            stream = self._side
        staging = (
            chunk.free.pop()
            if chunk.free
            else torch.empty(cap + 2, dtype=torch.int64, pin_memory=True)
        )
        ptr = staging.data_ptr()
        lo, hi = ptr & 0xFFFFFFFF, ptr >> 32
        lo -= (1 << 32) if lo >= 1 << 31 else 0  # as the signed 32-bit int it is passed as
        hi -= (1 << 32) if hi >= 1 << 31 else 0
        with torch.cuda.stream(stream):  # type: ignore[no-untyped-call]
            for event in after or ():
                stream.wait_event(event)
            self._snapshot(grid=(1, 1, 1), block=(1024, 1, 1), args=[chunk.words, lo, hi, cap])
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record(stream)
        return _CudaCopy(staging, event, chunk.free)


_lock = threading.Lock()
_by_device: dict[int, CudaStamps | None] = {}
_why_not: list[str] = []


def cuda_stamps(device: int) -> CudaStamps | None:
    """The device's timestamp kernels, or None where they cannot be built (no NVRTC, a torch
    without ``torch.cuda._compile_kernel``); ``why_not()`` says why."""
    with _lock:
        if device not in _by_device:
            try:
                _by_device[device] = CudaStamps(device)
            except Exception as e:  # any failure: regions in graphs are counted as skipped
                _by_device[device] = None
                _why_not.append(f"{type(e).__name__}: {e}")
        return _by_device[device]


def why_not() -> str:
    return _why_not[-1] if _why_not else ""
