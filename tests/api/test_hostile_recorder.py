"""The recorder under a hostile program: fork while other threads record, reset() inside open
regions. Run on the chosen core here and on the other one by the nested suite run."""

from __future__ import annotations

import asyncio
import contextlib
import io
import linecache
import os
import sys
import threading
import time
from typing import Any

import pytest
import torch

import cudatimer
from cudatimer.core import _core
from tests.helpers.subproc import run_python


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_fork_while_threads_record_never_deadlocks_the_child() -> None:
    """20 children forked while two threads record each open a region and exit in time."""
    code = """
        import os, threading, time, warnings
        import cudatimer
        warnings.simplefilter("ignore", DeprecationWarning)  # fork in a threaded process
        stop = False
        def record():
            while not stop:
                with cudatimer.cuda_region("bg"):
                    pass
        for _ in range(2):
            threading.Thread(target=record, daemon=True).start()
        time.sleep(0.1)
        hung = bad = 0
        for _ in range(20):
            pid = os.fork()
            if pid == 0:
                with cudatimer.cuda_region("child"):
                    pass
                os._exit(0 if cudatimer.summary(timeout_s=1.0)["child"].calls == 1 else 3)
            deadline = time.monotonic() + 10
            while True:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    bad += os.waitstatus_to_exitcode(status) != 0
                    break
                if time.monotonic() > deadline:
                    os.kill(pid, 9)
                    os.waitpid(pid, 0)
                    hung += 1
                    break
                time.sleep(0.005)
        stop = True
        print("hung", hung, "bad", bad)
    """
    done = run_python(code, {})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["hung", "0", "bad", "0"], done.stdout + done.stderr


def test_reset_inside_an_open_region_keeps_what_opens_after_it() -> None:
    """Regions opened after a reset() inside an open region are in every view alike."""
    with cudatimer.cuda_region("a"):
        cudatimer.reset()
        with cudatimer.cuda_region("b"):
            pass
    s = cudatimer.summary(step_stats=True, trace=True)
    assert s.names == ("a/b",) and s["a/b"].calls == 1  # "a" began before the reset
    assert [x.name for x in s.step_stats] == ["a/b"]
    assert [x.name for x in s.trace] == ["a/b"]
    assert "a/b" in cudatimer.report(file=io.StringIO())


def test_reset_from_another_thread_keeps_regions_opened_after_it() -> None:
    """A reset() on another thread while a region is open: what opens after it is recorded."""
    reset_done = threading.Event()

    def reset() -> None:
        cudatimer.reset()
        reset_done.set()

    with cudatimer.cuda_region("outer"):
        thread = threading.Thread(target=reset)
        thread.start()
        assert reset_done.wait(10)
        thread.join()
        for _ in range(3):
            with cudatimer.cuda_region("inner"):
                pass
    s = cudatimer.summary(step_stats=True)
    assert s.names == ("outer/inner",) and s["outer/inner"].calls == 3
    assert sum(x.calls for x in s.step_stats) == 3


def test_reset_releases_the_regions_and_paths_it_makes_unreachable() -> None:
    """2x10^4 distinct names with a reset() every 1000 hold what 1000 hold, not all of them."""
    import gc
    import tracemalloc

    timer = cudatimer.Timer(name="churn")

    def churn(first: int, count: int) -> None:
        for i in range(first, first + count):
            with timer.region(f"name-{i}"), timer.region("inner"):
                pass
            if i % 1000 == 999:
                timer.reset()

    churn(0, 2000)  # caches, pools and interned strings warmed
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        churn(2000, 20000)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # Kept, two regions and two paths per name cost ~1.1 KB: 22 MB here. Released: the last
    # 1000 names and the previous generation's paths, well under 1 MB.
    assert grown < 1_000_000, f"{grown / 1e6:.1f} MB held after 20 resets"
    assert timer.summary().regions == ()  # the last reset came after the last region


@pytest.mark.parametrize("gpu", [False, True], ids=["host-clock", "fake-gpu"])
def test_a_region_held_across_reset_nests_where_it_runs_now(gpu: bool) -> None:
    """A decorated function timed before reset() (at the root, under "a") and after it."""
    from tests.helpers.fake_cuda import install

    with install() if gpu else contextlib.nullcontext():
        timer = cudatimer.Timer(name="held")

        @timer.region("f")
        def f() -> None:
            pass

        for _ in range(3):
            with timer.region("a"):
                f()
            f()  # the region's cached slot is the root's "f", which the reset forgets
        timer.reset()
        f()
        with timer.region("b"):
            f()
        s = timer.summary(step_stats=True, trace=True)
    assert s.names == ("f", "b", "b/f")
    assert [(x.name, x.calls) for x in s.step_stats] == [("f", 1), ("b", 1), ("b/f", 1)]
    assert sorted(x.name for x in s.trace) == ["b", "b/f", "f"]


def test_resets_racing_with_regions_on_other_threads_lose_no_path() -> None:
    """Threads nesting regions while another thread resets 200 times: every report reads."""
    timer = cudatimer.Timer(name="race")
    stop = threading.Event()
    errors: list[BaseException] = []
    rounds = [0, 0, 0]

    def work(k: int) -> None:
        try:
            while not stop.is_set():
                with timer.region(f"t{k}"), timer.region("mid"), timer.region(f"leaf{k % 2}"):
                    pass
                rounds[k] += 1
        except BaseException as e:  # pragma: no cover - the assertion below shows it
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    try:
        for _ in range(200):
            timer.reset()
            timer.summary(step_stats=True, trace=True)
        seen = list(rounds)  # each thread goes twice round after the last reset
        while any(now < then + 2 for now, then in zip(rounds, seen, strict=True)) and not errors:
            time.sleep(0.001)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors, errors
    s = timer.summary(step_stats=True, trace=True)
    allowed = {f"t{k}" for k in range(3)}
    allowed |= {f"t{k}/mid" for k in range(3)} | {f"t{k}/mid/leaf{k % 2}" for k in range(3)}
    assert set(s.names) <= allowed and sum(r.calls for r in s.regions) > 0
    assert {x.name for x in s.step_stats} <= allowed


def _nest(region: Any, depth: int) -> None:
    """Enter ``region`` recursively ``depth`` deep (the recursion limit raised meanwhile)."""

    def recurse(n: int) -> None:
        with region:
            if n:
                recurse(n - 1)

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 4 * depth))
    try:
        recurse(depth - 1)
    finally:
        sys.setrecursionlimit(limit)


def test_summary_of_a_deep_recursion_needs_no_deep_stack() -> None:
    """Paths of regions nested 1500 deep are built without recursion (default limit)."""
    _nest(cudatimer.cuda_region("r"), 1500)
    s = cudatimer.summary()
    assert len(s.regions) == 1500 and s.regions[-1].depth == 1499
    assert s.regions[-1].name == "/".join(["r"] * 1500)


def test_text_reports_of_a_deep_recursion_stay_small() -> None:
    """3000 nested regions: every text row is short; the data keep whole paths."""
    timer = cudatimer.Timer(name="deep")
    _nest(timer.region("recurse"), 3000)
    s = timer.summary()
    assert s.regions[-1].name == "/".join(["recurse"] * 3000)  # the data: whole

    def text(**options: Any) -> str:
        return timer.report(summary=s, file=io.StringIO(), **options)

    for view in ("flat", "tree"):
        lines = text(view=view).splitlines()
        assert len(lines) >= 3000
        # Whole paths or a growing indent would make rows of up to 24 KB (3000 x 8 chars).
        assert max(map(len, lines)) < 400, (view, max(map(len, lines)))
    flat = text(view="flat", sort="order")
    assert "recurse/recurse/.../(2995 more)/recurse/recurse/recurse " in flat
    assert flat.splitlines()[2].split()[0] == "recurse"
    assert "[level 2999] recurse" in text(view="tree")


def _double(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def test_torch_jit_script_of_a_timed_function_is_refused_with_what_to_do() -> None:
    """Scripting a timed function would time nothing: refused; scripted first, it is timed."""
    timed = cudatimer.cuda_timed(_double)
    with pytest.raises(RuntimeError, match=r"Script first and time the result"):
        torch.jit.script(timed)
    scripted = cudatimer.cuda_timed(torch.jit.script(_double), name="scripted")
    assert torch.equal(scripted(torch.ones(2)), torch.full((2,), 2.0))
    assert cudatimer.summary()["scripted"].calls == 1


class _Doubler(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


def test_torch_jit_script_of_a_timed_module_is_refused_with_what_to_do() -> None:
    """Scripting a timed module (an instance or a decorated class) is refused naming the
    region and what to do, not with TorchScript's error from inside cudatimer; scripted
    first, the module is timed."""
    timed = cudatimer.cuda_timed(_Doubler(), name="doubler")
    with pytest.raises(RuntimeError) as info:
        torch.jit.script(timed)
    message = str(info.value)
    assert "torch.jit.script cannot compile this _Doubler" in message
    assert "timed as region 'doubler'" in message
    assert "cudatimer.cuda_timed(torch.jit.script(model), name=...)" in message

    @cudatimer.cuda_timed
    class Tripler(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 3

    with pytest.raises(RuntimeError, match="cannot compile class Tripler: its forward is timed"):
        torch.jit.script(Tripler())
    scripted = cudatimer.cuda_timed(torch.jit.script(_Doubler()), name="scripted")
    assert torch.equal(scripted(torch.ones(2)), torch.full((2,), 2.0))
    assert cudatimer.summary()["scripted"].calls == 1


def test_torch_jit_script_of_an_instrumented_model_is_refused_until_removed() -> None:
    """An instrumented model refuses scripting, saying to remove() first; after remove() it
    scripts and runs as before."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    handle = cudatimer.instrument(model)
    with pytest.raises(RuntimeError) as info:
        torch.jit.script(model)
    message = str(info.value)
    assert "cannot compile a Sequential that instrument() times (region 'Sequential')" in message
    assert "Call remove() on the handle instrument() returned" in message
    handle.remove()
    x = torch.ones(1, 4)
    assert torch.equal(torch.jit.script(model)(x), model(x))


_GENERATOR_ON_ANOTHER_THREAD = """
    import gc, sys, threading
    import cudatimer

    def suspended():
        with cudatimer.cuda_region("held"):
            yield 1
            yield 2

    g = suspended()
    next(g)  # suspended inside "held" on the main thread
    errors = []

    def collect():
        global g
        sys.unraisablehook = lambda u: errors.append(repr(u.exc_value))
        del g  # closed here: GeneratorExit runs the region's exit on this thread
        gc.collect()

    worker = threading.Thread(target=collect)
    worker.start()
    worker.join()
    assert errors == [], errors
    with cudatimer.cuda_region("probe"):
        pass
    s = cudatimer.summary()
    assert s.names == ("probe",) and s.open == 0, (s.names, s.open)
"""


def test_generator_holding_a_region_collected_on_another_thread() -> None:
    """Its region closes without an error; both threads' stacks and NVTX ranges stay right."""
    done = run_python(_GENERATOR_ON_ANOTHER_THREAD, {})
    assert done.returncode == 0, done.stderr


def test_generator_on_another_thread_keeps_nvtx_balanced() -> None:
    """With an NVTX tool attached, every range pushed is popped on the thread that pushed it."""
    from tests.helpers.nvtx_harness import HarnessUnavailable, run_with_injection, trace

    try:
        records = run_with_injection(_GENERATOR_ON_ANOTHER_THREAD)  # checks the balance
    except HarnessUnavailable as exc:
        pytest.skip(str(exc))
    assert trace(records) == ["+held", "-held", "+probe", "-probe"]


async def _serve(names: list[str], inner: bool = True) -> None:
    async def request(name: str) -> None:
        with cudatimer.cuda_region(name):
            await asyncio.sleep(0.001)
            if inner:
                with cudatimer.cuda_region("inner"):
                    await asyncio.sleep(0.001)

    with cudatimer.cuda_region("server"):
        await asyncio.gather(*(request(n) for n in names))


def test_concurrent_tasks_each_nest_their_own_regions() -> None:
    """Four tasks in one region each nest under the task that made them, not in each other."""
    asyncio.run(_serve(["req"] * 4))
    s = cudatimer.summary()
    assert [(r.name, r.calls) for r in s.regions] == [
        ("server", 1),
        ("server/req", 4),
        ("server/req/inner", 4),
    ]
    assert s.open == 0


def test_concurrent_tasks_with_distinct_names_raise_nothing() -> None:
    """Tasks whose regions have other names close them in their own order, without errors."""
    asyncio.run(_serve(["a", "b", "c"]))
    assert cudatimer.summary().names == (
        "server",
        "server/a",
        "server/a/inner",
        "server/b",
        "server/b/inner",
        "server/c",
        "server/c/inner",
    )


def test_tasks_on_the_fake_gpu_take_the_event_path() -> None:
    """Under asyncio the common case still records events, on each task's own stack."""
    from tests.helpers.fake_cuda import install

    with install():
        t = cudatimer.Timer(name="tasks-gpu")

        async def request() -> None:
            with t.region("req"):
                await asyncio.sleep(0.001)
                with t.region("inner"):
                    await asyncio.sleep(0)

        async def main() -> None:
            with t.region("server"):
                await asyncio.gather(*(request() for _ in range(3)))

        asyncio.run(main())
        s = t.summary()
    assert [(r.name, r.clock, r.calls) for r in s.regions] == [
        ("server", "cuda:0", 1),
        ("server/req", "cuda:0", 3),
        ("server/req/inner", "cuda:0", 3),
    ]


_PACKAGE = os.path.dirname(cudatimer.__file__)


def _interrupted(at: int, body: Any) -> bool:
    """Run ``body`` with a KeyboardInterrupt raised at the ``at``-th step (a call or a line)
    of cudatimer's Python code, as a signal handler could; False once ``at`` is past the last
    step (nothing was interrupted)."""
    steps = [0]

    def local(frame: Any, event: str, arg: Any) -> Any:
        # A `try:` line runs no instruction where CPython checks for signals, and the second
        # line event of a `with` line is its exit (the lock's release, say), which no signal
        # can come before either: neither is a step.
        if event == "line":
            text = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
            if text == "try:" or text.startswith("with "):
                return local
        if event in ("call", "line"):
            steps[0] += 1
            if steps[0] == at:
                raise KeyboardInterrupt
        return local

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        if not frame.f_code.co_filename.startswith(_PACKAGE):
            return None
        if (
            frame.f_code.co_name == "__exit__"
            and event == "call"
            and "_core_py" in frame.f_code.co_filename
        ):
            return local  # the one window the pure-Python core cannot close (see its __exit__)
        return local(frame, event, arg)

    sys.settrace(tracer)
    try:
        body()
    except KeyboardInterrupt:
        pass
    finally:
        sys.settrace(None)
    return steps[0] >= at


@pytest.mark.timeout(120)
@pytest.mark.parametrize("gpu", [False, True], ids=["host-clock", "fake-gpu"])
def test_an_interrupt_at_any_step_leaves_no_region_open(gpu: bool) -> None:
    """A KeyboardInterrupt at each step of enter and exit in turn leaves the stack empty."""
    from tests.helpers.fake_cuda import install

    def body() -> None:
        with t.region("a"), t.region("b"):
            pass

    with install() if gpu else contextlib.nullcontext():
        t = cudatimer.Timer(name=f"interrupt-{gpu}")
        stack = t.recorder.store.stack()
        at = 1
        while _interrupted(at, body):
            assert len(stack) == 0, f"interrupted at step {at}: {stack.frames()}"
            lock = getattr(_core, "_LOCK", None)  # the Python core's; the C core has none
            assert lock is None or not lock.locked(), f"lock left held at step {at}"
            at += 1
        assert at > 10  # the steps were there to interrupt (both paths run Python code)
        with t.region("probe"):
            pass
        assert "probe" in t.summary().names and len(stack) == 0
