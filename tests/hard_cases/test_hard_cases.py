"""The hard cases on the CPU: streams, devices, graph capture, fork, threads, decorated
generators and context managers, sampling, reset and exit with samples pending.

CUDA-specific logic runs against tests/helpers/fake_cuda.py (deterministic streams, devices and
events);
tests/hard_cases/test_gpu_hard_cases.py checks the same cases on a real GPU.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import multiprocessing
import threading
import time
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import torch

import cudatimer
from cudatimer import Timer
from cudatimer.core import _core, _device
from cudatimer.render._report import render
from tests.helpers.fake_cuda import FakeGPU, install


@pytest.fixture
def gpu() -> Iterator[FakeGPU]:
    """A fake GPU (the suite runs once per recorder core: see test_core_contract.py)."""
    with install() as fake:
        yield fake


def calls(timer: Timer) -> dict[str, int]:
    return {r.name: r.calls for r in timer.summary().regions}


@contextlib.contextmanager
def caught() -> Iterator[list[warnings.WarningMessage]]:
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        yield got


# -- streams --------------------------------------------------------------------------------------


def test_plain_region_looks_the_stream_up_once_per_enter_and_exit(
    gpu: FakeGPU, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Enter and exit each make one current-stream read (of the current device) and no more."""
    t = Timer(name="lookups")
    with t.region("warm"):  # the first region on a stream creates its entry
        pass
    seen: list[int] = []
    real = gpu.get_stream

    def get_stream(device: int) -> tuple[int, int, int]:
        seen.append(device)
        return real(device)

    monkeypatch.setattr(gpu, "get_stream", get_stream)
    _core.set_stream_getter(get_stream, False)
    try:
        with t.region("warm"):
            gpu.run(2.0, gpu.default_stream())  # (the fake's own lookup is not counted)
    finally:
        _core.set_stream_getter(real, False)
    assert seen == [-1, -1]
    assert t.summary()["warm"].gpu_max_ms == 2.0


def test_stream_switched_inside_region_warns_once_and_covers_both_streams(gpu: FakeGPU) -> None:
    """A stream switch not undone before exit warns once (naming the region); GPU time runs to
    the later end, so work moved to the new stream is not lost."""
    t = Timer(name="switch")
    side = gpu.new_stream()
    region = t.region("moved")
    with caught() as got:
        for _ in range(2):
            with region:
                gpu.run(1.0)
                gpu.set_stream(side)
                gpu.run(100.0)
            gpu.set_stream(gpu.default_stream())
    messages = [str(w.message) for w in got]
    assert len(messages) == 1 and "'moved'" in messages[0] and "another CUDA stream" in messages[0]
    assert got[0].filename == __file__  # points at the user's code, not at cudatimer
    r = t.summary()["moved"]
    assert r.calls == 2 and r.gpu_min_ms == pytest.approx(100.0)


def test_side_streams_cover_the_latest_end(gpu: FakeGPU) -> None:
    """streams=[s] records an end event on s too and takes the latest: 100 ms, not 1 ms."""
    t = Timer(name="side")
    side = gpu.new_stream()
    for name, streams in (("without", None), ("with", [side])):
        with t.region(name, streams=streams):
            gpu.run(1.0)
            gpu.run(100.0, side)
        gpu.busy.clear()
    s = t.summary()
    assert s["without"].gpu_max_ms == pytest.approx(1.0)
    assert s["with"].gpu_max_ms == pytest.approx(100.0)


def test_side_stream_results_wait_for_every_stream(gpu: FakeGPU) -> None:
    """A sample is resolved only when the end on every stream is done; until then it is
    pending, and the events all return to the pool once it resolves."""
    t = Timer(name="side-pending")
    side = gpu.new_stream()
    with t.region("warm", streams=[side]):
        pass
    entry = _core.stream_of((0, 0, 1))
    t.summary()
    pooled = entry.pooled
    gpu.run(50.0, side)
    gpu.hold(side)
    with t.region("multi", streams=[side]):
        gpu.run(1.0)
    assert t.summary(timeout_s=0.01).pending == 1
    gpu.release()
    s = t.summary()
    assert s.pending == 0 and s["multi"].gpu_max_ms == pytest.approx(50.0)
    # all three back in the pool: the trace window keeps the sample's placement, not its events
    assert entry.pooled == pooled


def test_side_stream_equal_to_start_stream_records_one_end(gpu: FakeGPU) -> None:
    """Listing the region's own stream adds no event: two records per call, as without."""
    t = Timer(name="same")
    with t.region("x"):
        pass
    before = gpu.records
    with t.region("x", streams=[gpu.default_stream()]):
        pass
    assert gpu.records - before == 2


def test_side_stream_on_another_device_is_left_out_with_a_warning(gpu: FakeGPU) -> None:
    """A side stream of another device cannot be compared with the start event: warned, skipped."""
    t = Timer(name="other-device")
    far = gpu.new_stream(device=1)
    with caught() as got, t.region("x", streams=[far]):
        gpu.run(3.0)
        gpu.run(90.0, far)
    assert len(got) == 1 and "cuda:1" in str(got[0].message)
    assert t.summary()["x"].gpu_max_ms == pytest.approx(3.0)


# -- devices -----------------------------------------------------------------------------------


def test_region_on_device_1_is_timed_on_its_clock(gpu: FakeGPU) -> None:
    """The current device picks the clock: cuda:1 regions are rows of their own."""
    t = Timer(name="dev1")
    gpu.set_device(1)
    with t.region("x"):
        gpu.run(4.0)
    gpu.set_device(0)
    with t.region("x"):
        gpu.run(2.0)
    s = t.summary()
    assert s.get("x", clock="cuda:1").gpu_max_ms == pytest.approx(4.0)  # type: ignore[union-attr]
    assert s.get("x", clock="cuda:0").gpu_max_ms == pytest.approx(2.0)  # type: ignore[union-attr]


def test_device_switch_inside_region_warns_and_times_the_start_device(gpu: FakeGPU) -> None:
    """Entering on cuda:0 and leaving on cuda:1 warns once and records the end on cuda:0 (no
    cross-device elapsed_time error)."""
    t = Timer(name="devswitch")
    with caught() as got:
        for _ in range(2):
            with t.region("hop"):
                gpu.run(5.0)
                gpu.set_device(1)
                gpu.run(70.0)
            gpu.set_device(0)
    assert len(got) == 1
    text = str(got[0].message)
    assert "'hop'" in text and "cuda:0" in text and "cuda:1" in text
    r = t.summary()["hop"]
    assert r.clock == "cuda:0" and r.calls == 2 and r.gpu_max_ms == pytest.approx(5.0)


# -- CUDA graph capture ----------------------------------------------------------------------------


def test_region_in_capture_records_no_event_and_is_counted_skipped(gpu: FakeGPU) -> None:
    """Inside capture: no event recorded (none poisoned), host time, counted as skipped and
    noted in the report; the region around the capture is timed with events."""
    t = Timer(name="capture")
    capture_stream = gpu.new_stream()
    with t.region("outer"):
        records = gpu.records
        with gpu.capture(capture_stream):
            for _ in range(70):  # more than a harvest batch: no query may run in capture
                with t.region("inside"):
                    pass
        assert gpu.records == records
    assert not gpu.poisoned
    s = t.summary()
    inside = s["outer/inside"]
    assert (inside.clock, inside.calls, inside.skipped) == ("host", 70, 70)
    assert s["outer"].clock == "cuda:0"
    assert "70 call(s) had no GPU timing" in render(s)


def test_timed_replay_times_each_replay(gpu: FakeGPU) -> None:
    """timed_replay(graph, name) puts each replay in a region with GPU time."""

    class Graph:
        def replay(self) -> None:
            gpu.run(3.0)

    t = Timer(name="replay")
    graph = Graph()
    for _ in range(4):
        cudatimer.timed_replay(graph, "decode", timer=t)
    r = t.summary()["decode"]
    assert r.calls == 4 and r.gpu_max_ms == pytest.approx(3.0)


# -- fork ------------------------------------------------------------------------------------------


def _fork_child(conn: Any) -> None:
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        t = Timer(name="child")
        for _ in range(3):
            with t.region("work"):
                pass
        r = t.summary(timeout_s=0.0)["work"]
    conn.send((r.clock, r.calls, [str(w.message) for w in got]))


def test_fork_after_cuda_init_times_the_child_on_the_host_clock(gpu: FakeGPU) -> None:
    """A child forked after CUDA init times regions on the host clock, with one warning, and
    never touches CUDA."""
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_fork_child, args=(child,))
    proc.start()
    assert parent.poll(30), "the forked child did not answer"
    clock, n, messages = parent.recv()
    proc.join(30)
    assert proc.exitcode == 0
    assert (clock, n) == ("host", 3)
    assert len(messages) == 1 and "forked" in messages[0]


def _open_region_child(conn: Any, timer: Timer) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        timer.region("epoch").__exit__(None, None, None)  # opened in the parent, before fork
    conn.send([(r.name, r.clock, r.calls) for r in timer.summary(timeout_s=0.0).regions])


def test_region_open_across_fork_closes_on_the_host_clock_in_the_child(gpu: FakeGPU) -> None:
    """A region opened (with a CUDA event) before the fork and closed in the child is
    recorded there on the host clock: the parent's event is never touched."""
    t = Timer(name="across-fork")
    region = t.region("epoch")
    region.__enter__()
    try:
        ctx = multiprocessing.get_context("fork")
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_open_region_child, args=(child, t))
        proc.start()
        assert parent.poll(30)
        rows = parent.recv()
        proc.join(30)
    finally:
        region.__exit__(None, None, None)
    assert rows == [("epoch", "host", 1)]
    assert t.summary()["epoch"].clock == "cuda:0"  # the parent's own call, on events


def _locked_child(conn: Any) -> None:
    t = Timer(name="locked-child", clock="host")
    with t.region("x"):  # records under the lock
        pass
    conn.send(t.summary()["x"].calls)


@pytest.mark.skipif(not hasattr(_core, "_LOCK"), reason="this core has no lock (the GIL)")
def test_fork_while_another_thread_holds_the_lock_does_not_deadlock_the_child() -> None:
    """The recorder's lock, held by a parent thread at the fork, is free in the child."""
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with _core._LOCK:
            holding.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    holding.wait(10)
    try:
        ctx = multiprocessing.get_context("fork")
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_locked_child, args=(child,))
        proc.start()
        answered = parent.poll(20)
        result = parent.recv() if answered else None
    finally:
        release.set()
        holder.join()
    proc.join(10)
    if proc.is_alive():  # pragma: no cover - the failure this test exists for
        proc.kill()
    assert result == 1


class _Dataset(torch.utils.data.Dataset[Any]):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> tuple[int, str, int]:
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            with cudatimer.cuda_region("load"):
                pass
        forked = sum("forked" in str(w.message) for w in got)
        return i, cudatimer.summary(timeout_s=0.0)["load"].clock, forked


def test_dataloader_fork_workers_with_regions_in_the_dataset(gpu: FakeGPU) -> None:
    """DataLoader workers forked after CUDA init keep timing, on the host clock, one warning
    per worker, and nothing fails."""
    loader = torch.utils.data.DataLoader(
        _Dataset(),
        num_workers=2,
        multiprocessing_context="fork",
        collate_fn=lambda batch: batch,
        batch_size=2,
    )
    items = [item for batch in loader for item in batch]
    assert sorted(i for i, _, _ in items) == list(range(8))
    assert {clock for _, clock, _ in items} == {"host"}
    assert sum(w for _, _, w in items) == 2  # one per worker process


# -- threads ---------------------------------------------------------------------------------------


def test_thread_pool_counts_are_exact_and_stacks_per_thread() -> None:
    """A pool of 8 threads running nested regions gives exact counts and no cross-thread
    nesting, sampled regions included."""
    t = Timer(name="pool")
    outer, inner = t.region("task"), t.region("step")
    sampled = t.region("hot", every=3)

    def task(_: int) -> None:
        with outer:
            for _ in range(10):
                with inner, sampled:
                    pass

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(task, range(400)))
    s = t.summary()
    assert {r.name: r.calls for r in s.regions} == {
        "task": 400,
        "task/step": 4000,
        "task/step/hot": 4000,
    }
    assert s["task/step/hot"].cpu.count == 1334  # calls 0, 3, ..., 3999: exactly one in three


def test_region_opened_on_another_thread_does_not_nest_under_this_one() -> None:
    """A region on another thread (like autograd's backward threads) has its own stack."""
    t = Timer(name="threads")

    def backward() -> None:
        with t.region("backward"):
            pass

    with t.region("forward"):
        worker = threading.Thread(target=backward)
        worker.start()
        worker.join()
    assert set(calls(t)) == {"forward", "backward"}


def test_region_inside_autograd_backward() -> None:
    """A region inside a custom autograd Function's backward is recorded."""
    t = Timer(name="autograd")

    class Double(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            return x * 2

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
            with t.region("double.backward"):
                return grad * 2

    x = torch.ones(3, requires_grad=True)
    Double.apply(x).sum().backward()
    assert x.grad is not None and x.grad.tolist() == [2.0, 2.0, 2.0]
    assert calls(t) == {"double.backward": 1}


# -- generators, context managers, re-entrancy, out-of-order ---------------------------------------


def test_decorated_contextmanager_spans_the_with_block() -> None:
    """@cuda_timed over @contextmanager times setup, body and teardown as one call, with the
    body's regions nested inside."""
    t = Timer(name="cm")

    @t.timed("session")
    @contextlib.contextmanager
    def session() -> Iterator[int]:
        time.sleep(0.002)
        yield 7
        time.sleep(0.002)

    with session() as value, t.region("body"):
        pass
    assert value == 7
    s = t.summary()
    assert calls(t) == {"session": 1, "session/body": 1}
    assert s["session"].cpu_total_ms >= 4.0


def test_decorated_contextmanager_closes_on_exception() -> None:
    """An exception in the body propagates, the region closes, the stack is clean."""
    t = Timer(name="cm-exc")

    @t.timed("guarded")
    @contextlib.contextmanager
    def guarded() -> Iterator[None]:
        yield

    with pytest.raises(KeyError), guarded():
        raise KeyError("x")
    assert calls(t) == {"guarded": 1} and len(t.recorder.store.stack()) == 0


def test_decorated_context_manager_class() -> None:
    """A context manager class is timed from __enter__ to __exit__ and stays a class."""
    t = Timer(name="cm-class")

    @t.timed
    class Lock:
        def __enter__(self) -> Lock:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

    with Lock() as lock, t.region("held"):
        pass
    assert isinstance(lock, Lock)
    assert calls(t) == {
        "test_decorated_context_manager_class.<locals>.Lock": 1,
        "test_decorated_context_manager_class.<locals>.Lock/held": 1,
    }


def test_decorating_a_plain_class_is_an_error() -> None:
    """A class that is neither an nn.Module nor a context manager cannot be decorated."""
    with pytest.raises(TypeError, match="decorate its methods"):

        @cudatimer.cuda_timed
        class Plain:
            pass


def test_decorated_module_class_times_every_instance() -> None:
    """@cuda_timed on an nn.Module subclass times forward of each instance."""
    t = Timer(name="module-class")

    @t.timed("Block")
    class Block(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + 1

    a, b = Block(), Block()
    a(torch.zeros(1))
    b(torch.zeros(1))
    assert isinstance(a, torch.nn.Module) and calls(t) == {"Block": 2}


def test_generator_abandoned_midway_leaves_the_stack_balanced() -> None:
    """A timed generator closed early (or dropped) records its resumes and leaves no frame."""
    t = Timer(name="gen")

    @t.timed("items")
    def items() -> Iterator[int]:
        yield from range(10)

    g = items()
    assert [next(g), next(g)] == [0, 1]
    g.close()
    for _ in items():
        break
    assert len(t.recorder.store.stack()) == 0
    assert calls(t) == {"items": 3}


def test_same_region_object_re_entered_nests() -> None:
    """One Region object entered inside itself records two nested calls."""
    t = Timer(name="reentrant")
    r = t.region("r")
    with r, r:
        pass
    assert calls(t) == {"r": 1, "r/r": 1}


def test_out_of_order_close_with_events_keeps_both_samples(gpu: FakeGPU) -> None:
    """Closing the outer region first raises, and both get GPU times once the inner closes."""
    t = Timer(name="order")
    a, b = t.region("a"), t.region("b")
    a.__enter__()
    gpu.run(1.0)
    b.__enter__()
    gpu.run(2.0)
    with pytest.raises(RuntimeError, match="reverse order"):
        a.__exit__(None, None, None)
    gpu.run(4.0)
    b.__exit__(None, None, None)
    s = t.summary()
    assert s["a"].gpu_max_ms == pytest.approx(3.0)
    assert s["a/b"].gpu_max_ms == pytest.approx(6.0)
    assert len(t.recorder.store.stack()) == 0


# -- sampling: every=N -----------------------------------------------------------------------------


def test_every_times_one_call_in_n_and_counts_all() -> None:
    """every=4 over 10 calls: calls 10, timed 3 (calls 0, 4, 8); children always nest."""
    t = Timer(name="every")
    for _ in range(10):
        with t.region("hot", every=4), t.region("inner"):
            pass
    s = t.summary()
    assert (s["hot"].calls, s["hot"].cpu.count) == (10, 3)
    assert s["hot/inner"].calls == 10


def test_every_is_noted_in_the_report() -> None:
    """The report says which regions were sampled and that their times cover timed calls."""
    t = Timer(name="every-report")
    for _ in range(4):
        with t.region("hot", every=2), t.region("always"):
            pass
    text = render(t.summary())
    assert "note: hot: sampled (every=N)" in text
    assert "always" not in text.split("note:")[1]


def test_every_on_decorated_function_generator_and_coroutine() -> None:
    """Decorator forms honour every=N: function, generator (per resume), async function."""
    t = Timer(name="every-forms")

    @t.timed("f", every=2)
    def f() -> None:
        pass

    @t.timed("g", every=2)
    def g() -> Iterator[int]:
        yield from range(3)

    @t.timed("c", every=2)
    async def c() -> None:
        await asyncio.sleep(0)

    for _ in range(5):
        f()
    list(g())  # 4 resumes: 0, 1, 2, StopIteration

    async def main() -> None:
        for _ in range(3):
            await c()

    asyncio.run(main())
    s = t.summary()
    assert [(s[n].calls, s[n].cpu.count) for n in ("f", "g", "c")] == [(5, 3), (4, 2), (3, 2)]


def test_every_with_events_counts_on_the_gpu_clock(gpu: FakeGPU) -> None:
    """Calls not timed are counted in the same cuda:0 row as the timed ones."""
    t = Timer(name="every-gpu")
    for _ in range(6):
        with t.region("hot", every=3):
            gpu.run(1.0)
    (r,) = t.summary().regions
    assert (r.clock, r.calls, r.gpu.count) == ("cuda:0", 6, 2)  # type: ignore[union-attr]


def test_every_disabled_timer_counts_nothing() -> None:
    """A disabled Timer neither times nor counts sampled calls."""
    t = Timer(name="every-off")
    t.disable()
    for _ in range(4):
        with t.region("hot", every=2):
            pass
    t.enable()
    assert t.summary().regions == ()


# -- reset and exit with samples pending -----------------------------------------------------------


def free_events(entry: Any) -> int:
    """Events in the stream's pool."""
    return int(entry.pooled)


def test_reset_with_pending_events_returns_them_and_drops_old_samples(gpu: FakeGPU) -> None:
    """reset() while samples are on the GPU: they never appear, their events go back to the
    pool, and regions after the reset are recorded."""
    t = Timer(name="reset-pending", trace_samples=0)
    with t.region("warm"):
        pass
    t.summary()
    entry = _core.stream_of((0, 0, 1))
    pooled = free_events(entry)
    gpu.hold()
    for _ in range(10):
        with t.region("old"):
            gpu.run(1.0)
    assert free_events(entry) == pooled - 20
    t.reset()
    gpu.release()
    with t.region("new"):
        pass
    assert calls(t) == {"new": 1}
    assert free_events(entry) == pooled


def test_trace_window_keeps_numbers_not_events(gpu: FakeGPU) -> None:
    """A full trace window holds no CUDA events: every event is back in the pool after the
    harvest, and the spans still sit where the GPU ran them."""
    t = Timer(name="ring", trace_samples=64)
    for _ in range(50):  # the pool grows to what 50 regions between harvests need
        with t.region("warm"):
            gpu.run(10.0)  # and placement anchors itself far from the reference
    t.summary()
    entry = _core.stream_of((0, 0, 1))
    pooled = free_events(entry)
    for i in range(40):
        with t.region("r"):
            gpu.run(1.0 + i)
    spans = [x for x in t.summary(trace=True).trace if x.name == "r"]
    assert free_events(entry) == pooled
    assert [round(x.gpu_ms or 0.0, 6) for x in spans] == [1.0 + i for i in range(40)]
    starts = [x.gpu_start_ms or 0.0 for x in spans]
    assert [round(b - a, 6) for a, b in itertools.pairwise(starts)] == [1.0 + i for i in range(39)]


def test_at_exit_drops_pending_samples_and_later_regions_use_the_host_clock(
    gpu: FakeGPU,
) -> None:
    """The exit handler drops pending samples without waiting; regions after it (other exit
    handlers) are timed on the host clock."""
    t = Timer(name="exit")
    gpu.hold()
    with t.region("pending"):
        gpu.run(1.0)
    started = time.monotonic()
    _device._at_exit()
    assert time.monotonic() - started < 0.5
    assert _core.pending_total() == 0
    with t.region("late"):
        pass
    assert t.summary(timeout_s=0.0)["late"].clock == "host"


@pytest.mark.skipif(not hasattr(_core, "_LOCK"), reason="this core has no lock (the GIL)")
def test_at_exit_gives_up_when_another_thread_holds_the_lock(gpu: FakeGPU) -> None:
    """The exit handler never blocks on a lock held by a stuck thread: it leaves things."""
    t = Timer(name="exit-locked")
    gpu.hold()
    with t.region("pending"):
        pass
    with _core._LOCK:
        started = time.monotonic()
        _device._at_exit()
        assert time.monotonic() - started < 2.0
    assert _core.pending_total() == 1
