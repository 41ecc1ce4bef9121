"""The hard cases on a real GPU: streams, side streams, devices, CUDA graph capture and
replay, torch.compile, fork after CUDA init (DataLoader workers), exit with events pending,
autograd's backward threads. Run: python3 -m pytest -q tests/hard_cases/test_gpu_hard_cases.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import cudatimer
from cudatimer import Timer
from cudatimer.core import _core
from cudatimer.render._report import render

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]

from tests.hard_cases.test_gpu_core import sleep_ms  # noqa: E402  (calibrated spin kernel)


@pytest.fixture(autouse=True)
def _warm() -> Iterator[None]:
    torch.cuda.init()
    sleep_ms(0.1)  # load the sleep kernel once (lazy module loading costs ~10 ms)
    torch.cuda.synchronize()
    yield
    torch.cuda.set_stream(torch.cuda.default_stream())
    torch.cuda.synchronize()


def run_script(code: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=str(ROOT),
    )


# -- the stream lookup the hot path relies on ----------------------------------------------------


def test_current_stream_of_the_current_device_by_minus_one() -> None:
    """_cuda_getCurrentStream(-1) is the current device's current stream, device included."""
    get = torch._C._cuda_getCurrentStream
    assert get(-1) == get(torch.cuda.current_device())
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        assert get(-1) == (side.stream_id, side.device_index, side.device_type)
    if torch.cuda.device_count() > 1:
        with torch.cuda.device(1):
            assert get(-1)[1] == 1


# -- streams ---------------------------------------------------------------------------------------


def test_stream_switch_inside_region_warns_and_covers_the_new_stream() -> None:
    """set_stream inside a region without restoring: one warning, GPU time includes the 50 ms
    queued on the new stream (recorded on the start stream alone it would be ~0)."""
    t = Timer(name="switch")
    side = torch.cuda.Stream()
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        for _ in range(2):
            with t.region("moved"):
                torch.cuda.set_stream(side)
                sleep_ms(50)
            torch.cuda.set_stream(torch.cuda.default_stream())
    assert len(got) == 1 and "'moved'" in str(got[0].message)
    r = t.summary()["moved"]
    assert r.calls == 2 and r.clock == "cuda:0"
    assert r.gpu_min_ms is not None and r.gpu_min_ms > 40.0


def test_side_streams_are_covered_without_waits() -> None:
    """streams=[s]: the GPU time runs to the end of s's 50 ms; without it, ~0. No stream is
    made to wait: the default stream finishes while s is still busy."""
    t = Timer(name="side")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    for name, streams in (("without", None), ("with", [side])):
        with t.region(name, streams=streams), torch.cuda.stream(side):
            sleep_ms(50)
        if name == "with":
            done = torch.cuda.Event()
            done.record()
            done.synchronize()
            assert not side.query(), "the default stream waited for the side stream"
        torch.cuda.synchronize()
    s = t.summary()
    assert s["without"].gpu_max_ms is not None and s["without"].gpu_max_ms < 5.0
    assert s["with"].gpu_max_ms is not None and s["with"].gpu_max_ms > 40.0


# -- devices ---------------------------------------------------------------------------------------


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_region_on_device_1_and_device_switch_inside_a_region() -> None:
    """Regions on cuda:1 have their own clock; switching device inside a region warns and
    records on the start device (no cross-device elapsed_time error)."""
    t = Timer(name="devices")
    with torch.cuda.device(1), t.region("on1"):
        sleep_ms(5)
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        with t.region("hop"):
            sleep_ms(5)
            torch.cuda.set_device(1)
            sleep_ms(50)
        torch.cuda.set_device(0)
    assert len(got) == 1 and "cuda:1" in str(got[0].message)
    s = t.summary()
    assert s["on1"].clock == "cuda:1"
    hop = s["hop"]
    assert hop.clock == "cuda:0" and hop.gpu_max_ms is not None and hop.gpu_max_ms < 40.0


# -- CUDA graphs -----------------------------------------------------------------------------------


def test_capture_with_regions_inside_works_and_replays_are_timed() -> None:
    """Regions inside capture record no event (the capture and its replays work): each replay
    times them by device timestamps, under the region around the replay; timed_replay times
    each replay as a whole with events."""
    t = Timer(name="graphs")
    x = torch.randn(1024, 1024, device="cuda")
    w = torch.randn(1024, 1024, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on a side stream, as torch.cuda.graph asks
        for _ in range(3):
            x @ w
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with t.region("capture"), torch.cuda.graph(g):
        for _ in range(80):  # more than a harvest batch: nothing may be polled in capture
            with t.region("layer"):
                y = x @ w
    for _ in range(5):
        cudatimer.timed_replay(g, "replay", timer=t)
    torch.cuda.synchronize()
    assert torch.allclose(y, x @ w, rtol=1e-3, atol=1e-3)
    s = t.summary()
    assert "capture/layer" not in {r.name for r in s.regions}  # the capture ran no GPU work
    layer = s["replay/layer"]
    assert (layer.clock, layer.calls, layer.skipped) == ("cuda:0", 5 * 80, 0)
    replay = s["replay"]
    assert replay.clock == "cuda:0" and replay.calls == 5
    assert replay.gpu_min_ms is not None and replay.gpu_min_ms > 0.0
    assert layer.gpu_total_ms is not None and layer.gpu_total_ms <= replay.gpu_total_ms  # type: ignore[operator]
    assert "no GPU timing" not in render(s)


# -- torch.compile ---------------------------------------------------------------------------------


@pytest.mark.parametrize("fullgraph", [False, True])
def test_compiled_function_on_gpu_is_timed_with_events(fullgraph: bool) -> None:
    """torch.compile(timed_fn) with inductor: each compiled call timed with CUDA events, and
    the region inside the compiled code too."""
    torch._dynamo.reset()
    t = Timer(name=f"compiled-{fullgraph}")

    @t.timed("fn")
    def fn(x: torch.Tensor) -> torch.Tensor:
        with t.region("inside"):
            y = torch.nn.functional.gelu(x @ x)
        return y * 2

    compiled = torch.compile(fn, fullgraph=fullgraph)
    x = torch.randn(512, 512, device="cuda")
    for _ in range(3):
        compiled(x)
    s = t.summary()
    assert [(r.name, r.clock, r.calls) for r in s.regions] == [
        ("fn", "cuda:0", 3),
        ("fn/inside", "cuda:0", 3),
    ]


def test_compiled_module_reduce_overhead_and_instrumented_model() -> None:
    """An instrumented model compiled with mode="reduce-overhead" (CUDA graphs): the model's
    region times each call; submodule regions, inside the graph, are timed with events in
    the warm-up run and by device timestamps on every replay, never counted as skipped."""
    torch._dynamo.reset()
    t = Timer(name="reduce-overhead")
    net = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU()).cuda()
    x = torch.randn(64, 256, device="cuda")
    with cudatimer.instrument(net, timer=t), torch.no_grad():
        compiled = torch.compile(net, mode="reduce-overhead")
        for _ in range(5):
            compiled(x)
    s = t.summary()
    assert s["Sequential"].clock == "cuda:0" and s["Sequential"].calls == 5
    inside = [r for r in s.regions if r.name != "Sequential"]
    assert inside and all(r.calls in (4, 5) and r.skipped == 0 for r in inside), inside
    assert all(r.clock == "cuda:0" and r.gpu_total_ms for r in inside), inside


# -- fork, spawn and import ------------------------------------------------------------------------


def test_import_does_not_initialise_cuda() -> None:
    """Importing cudatimer and timing a region before CUDA is used leave CUDA uninitialised."""
    done = run_script(
        """
        import torch, cudatimer
        with cudatimer.cuda_region("early"):
            pass
        print(torch.cuda.is_initialized(), cudatimer.summary()["early"].clock)
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "host"]


def test_dataloader_workers_forked_after_cuda_init() -> None:
    """DataLoader workers (fork) with regions in the dataset, after CUDA init in the parent:
    they time on the host clock with one warning each; never 'Cannot re-initialize CUDA'."""
    done = run_script(
        """
        import torch, cudatimer
        x = torch.ones(4, device="cuda")
        with cudatimer.cuda_region("parent"):
            x = x * 2

        class Data(torch.utils.data.Dataset):
            def __len__(self):
                return 16

            def __getitem__(self, i):
                with cudatimer.cuda_region("load"):
                    item = torch.full((2,), float(i))
                return item, cudatimer.summary(timeout_s=0)["load"].clock

        loader = torch.utils.data.DataLoader(
            Data(), batch_size=4, num_workers=2, multiprocessing_context="fork"
        )
        clocks = set()
        for item, clock in loader:
            clocks.update(clock)
        print(sorted(clocks), cudatimer.summary()["parent"].clock)
        """
    )
    assert done.returncode == 0, done.stderr
    assert "re-initialize" not in done.stderr
    assert done.stdout.split("\n")[0] == "['host'] cuda:0"
    assert done.stderr.count("forked after CUDA was initialised") == 2


def test_forked_child_exits_cleanly_after_timing() -> None:
    """A plain os.fork child of a CUDA process times regions, closes a region opened before the
    fork on the host clock, and exits normally (interpreter finalisation included) without
    touching the parent's CUDA objects (no CUDA warning from their destructors)."""
    done = run_script(
        """
        import os, sys, torch, cudatimer
        with cudatimer.cuda_region("parent"):
            torch.ones(4, device="cuda").sum()
        with cudatimer.cuda_region("open-at-fork"):
            pid = os.fork()
            if pid == 0:
                with cudatimer.cuda_region("child"):
                    pass
        if pid == 0:
            s = cudatimer.summary(timeout_s=0)
            sys.stdout.write(s["open-at-fork/child"].clock + " " + s["open-at-fork"].clock + "\\n")
            sys.stdout.flush()
            sys.exit(0)
        _, status = os.waitpid(pid, 0)
        print("child-status", os.waitstatus_to_exitcode(status))
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["host", "host", "child-status", "0"]
    # Our one warning (it names CUDA) aside, nothing may mention CUDA: no destructor errors.
    others = [line for line in done.stderr.splitlines() if "cudatimer" not in line]
    assert not any("CUDA" in line for line in others), done.stderr


# -- exit, reset -----------------------------------------------------------------------------------


def test_exit_with_events_pending_is_quick_and_clean() -> None:
    """A process that exits while 2 s of GPU work and its regions are pending (some of them
    from another thread) and a region is open exits 0 and prints nothing."""
    done = run_script(
        """
        import threading, time, torch, cudatimer

        stop = threading.Event()

        def spin():
            x = torch.ones(8, device="cuda")
            while not stop.is_set():
                with cudatimer.cuda_region("spin"):
                    x = x + 1

        clock_khz = torch.cuda.get_device_properties(0).clock_rate
        r = cudatimer.cuda_region("pending")
        for _ in range(200):
            with r:
                torch.cuda._sleep(int(10 * clock_khz))
        worker = threading.Thread(target=spin)
        worker.start()
        time.sleep(0.2)
        # torch itself aborts ("terminate called without an active exception") when a thread
        # is still launching CUDA work at interpreter exit, with or without cudatimer.
        stop.set()
        worker.join()
        cudatimer.cuda_region("left-open").__enter__()
        print("exiting", flush=True)
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "exiting"
    assert done.stderr == ""


def test_reset_while_events_are_pending() -> None:
    """reset() while samples are on the GPU: old samples never appear, their events return."""
    t = Timer(name="reset-gpu", trace_samples=0)
    with t.region("warm"):
        pass
    t.summary()
    rec = _core.stream_of(torch._C._cuda_getCurrentStream(-1))
    assert rec is not None
    pooled = rec.pooled
    with t.region("old"):
        sleep_ms(100)
    assert t.summary(timeout_s=0).pending == 1
    t.reset()
    with t.region("new"):
        pass
    s = t.summary()
    assert s.names == ("new",)
    assert rec.pooled == pooled and rec.pending == 0


# -- threads ---------------------------------------------------------------------------------------


def test_backward_regions_run_on_autograd_threads() -> None:
    """instrument(backward=True) on a CUDA model: backward regions are timed with events and are
    not nested under the caller's region (autograd runs CUDA backward on its own thread)."""
    t = Timer(name="autograd")
    net = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(inplace=True)).cuda()
    x = torch.randn(64, 256, device="cuda", requires_grad=True)
    with cudatimer.instrument(net, backward=True, timer=t), t.region("step"):
        net(x).sum().backward()
    s = t.summary()
    backward = [r for r in s.regions if r.name.endswith(".backward")]
    assert backward and all(r.clock == "cuda:0" for r in backward)
    assert all("/" not in r.name for r in backward), [r.name for r in backward]


def test_every_counts_all_calls_on_the_gpu_clock() -> None:
    """every=4 with events: one row on cuda:0, all calls counted, one in four timed."""
    t = Timer(name="every-gpu")
    x = torch.ones(16, device="cuda")
    for _ in range(12):
        with t.region("hot", every=4):
            x = x + 1
    (r,) = t.summary().regions
    gpu: Any = r.gpu
    assert (r.clock, r.calls, gpu.count) == ("cuda:0", 12, 3)
