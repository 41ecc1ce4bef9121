"""Core behaviour on the host clock: API forms, nesting, exceptions, threads, statistics."""

from __future__ import annotations

import asyncio
import math
import random
import threading
import time

import pytest
import torch

import cudatimer
from cudatimer import Histogram, Timer
from tests.helpers.subproc import run_python


def names(summary: cudatimer.Summary) -> dict[str, int]:
    return {r.name: r.calls for r in summary.regions}


# -- API forms -------------------------------------------------------------------------------


def test_context_manager_records_one_call() -> None:
    """`with cuda_region(name)` records one call with host time."""
    with cudatimer.cuda_region("load"):
        time.sleep(0.002)
    r = cudatimer.summary()["load"]
    assert r.calls == 1
    assert r.clock == "host"
    assert r.cpu_total_ms >= 2.0


def test_region_is_cached_per_name() -> None:
    """cuda_region returns one shared object per name (no per-call allocation)."""
    assert cudatimer.cuda_region("a") is cudatimer.cuda_region("a")
    assert cudatimer.cuda_region("a") is not cudatimer.cuda_region("b")


def test_region_as_decorator() -> None:
    """A region object decorates a function and keeps its metadata."""

    @cudatimer.cuda_region("decorated")
    def f(x: int) -> int:
        """Doc."""
        return x + 1

    assert f(1) == 2
    assert f.__name__ == "f" and f.__doc__ == "Doc."
    assert cudatimer.summary()["decorated"].calls == 1


def test_cuda_timed_bare_uses_qualname() -> None:
    """@cuda_timed names the region by the function's qualified name."""

    @cudatimer.cuda_timed
    def work() -> int:
        return 3

    assert work() == 3
    assert work.__wrapped__.__name__ == "work"  # type: ignore[attr-defined]
    (region,) = cudatimer.summary().regions
    assert region.name == "test_cuda_timed_bare_uses_qualname.<locals>.work"


def test_cuda_timed_with_name_and_options() -> None:
    """@cuda_timed("name") and @cuda_timed(name=..., color=...) both work."""

    @cudatimer.cuda_timed("first")
    def a() -> None:
        pass

    @cudatimer.cuda_timed(name="second", color="red", category="io")
    def b() -> None:
        pass

    @cudatimer.cuda_timed()
    def c() -> None:
        pass

    a(), b(), b(), c()
    got = names(cudatimer.summary())
    assert got["first"] == 1 and got["second"] == 2
    assert got["test_cuda_timed_with_name_and_options.<locals>.c"] == 1


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    @cudatimer.cuda_timed
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)

    @cudatimer.cuda_timed
    @classmethod
    def build(cls) -> Model:
        return cls()

    @cudatimer.cuda_timed("helper")
    @staticmethod
    def helper(x: int) -> int:
        return x * 2

    @classmethod
    @cudatimer.cuda_timed
    def build_inner(cls) -> Model:
        return cls()


def test_methods_class_and_static_methods_and_forward() -> None:
    """Methods, class/static methods (either decorator order) and Module.forward are timed."""
    m = Model.build()
    Model.build_inner()
    m(torch.ones(2, 4))
    m(torch.ones(2, 4))
    assert Model.helper(2) == 4 and m.helper(3) == 6
    got = names(cudatimer.summary())
    assert got == {
        "Model.build": 1,
        "Model.build_inner": 1,
        "Model.forward": 2,
        "helper": 2,
    }


def test_module_instance_is_timed_in_place() -> None:
    """cuda_timed(module) wraps that module's forward and returns the module itself."""
    lin = torch.nn.Linear(2, 2)
    assert cudatimer.cuda_timed(lin) is lin
    lin(torch.ones(1, 2))
    assert names(cudatimer.summary()) == {"Linear": 1}


def test_async_function_timed_until_coroutine_finishes() -> None:
    """An async function's region spans its awaits, not just the coroutine's creation."""

    @cudatimer.cuda_timed("fetch")
    async def fetch() -> int:
        await asyncio.sleep(0.02)
        return 7

    async def main() -> list[int]:
        return list(await asyncio.gather(fetch(), fetch()))

    assert asyncio.run(main()) == [7, 7]
    r = cudatimer.summary()["fetch"]
    assert r.calls == 2
    assert r.cpu_min_ms >= 19.0


def test_generator_function_timed_per_resume() -> None:
    """A generator is timed step by step; values sent in and returned pass through."""

    @cudatimer.cuda_timed("gen")
    def gen() -> object:
        got = yield 1
        yield got
        return "done"

    g = gen()
    assert next(g) == 1
    assert g.send("x") == "x"
    with pytest.raises(StopIteration) as stop:
        next(g)
    assert stop.value.value == "done"
    assert cudatimer.summary()["gen"].calls == 3


# -- nesting, exceptions, recursion ------------------------------------------------------------


def test_nested_names_are_paths() -> None:
    """`inner` inside `outer` is reported as `outer/inner`, parents before children."""
    with cudatimer.cuda_region("outer"):
        with cudatimer.cuda_region("inner"):
            pass
        with cudatimer.cuda_region("inner"):
            pass
    with cudatimer.cuda_region("inner"):
        pass
    s = cudatimer.summary()
    assert [(r.name, r.calls, r.depth) for r in s.regions] == [
        ("outer", 1, 0),
        ("outer/inner", 2, 1),
        ("inner", 1, 0),
    ]


def test_exception_in_body_still_records_and_propagates() -> None:
    """A raising body is recorded, the exception propagates and the stack is left clean."""
    with pytest.raises(KeyError), cudatimer.cuda_region("outer"), cudatimer.cuda_region("bad"):
        raise KeyError("boom")

    @cudatimer.cuda_timed("fails")
    def fails() -> None:
        raise ValueError("x")

    with pytest.raises(ValueError):
        fails()
    assert names(cudatimer.summary()) == {"outer": 1, "outer/bad": 1, "fails": 1}
    assert len(cudatimer.default_timer().recorder.store.stack()) == 0


def test_recursion_nests_per_call() -> None:
    """A recursive decorated function nests one level per call, with exact counts."""

    @cudatimer.cuda_timed("fib")
    def fib(n: int) -> int:
        return n if n < 2 else fib(n - 1) + fib(n - 2)

    assert fib(5) == 5
    got = names(cudatimer.summary())
    assert got["fib"] == 1
    assert sum(got.values()) == 15  # fib(5) makes 15 calls in all
    assert max(n.count("/") for n in got) == 4


def test_out_of_order_close_is_an_error_and_keeps_both() -> None:
    """Closing an outer region before its inner one raises, and both are still recorded."""
    a, b = cudatimer.cuda_region("a"), cudatimer.cuda_region("b")
    a.__enter__()
    b.__enter__()
    with pytest.raises(RuntimeError, match="reverse order"):
        a.__exit__(None, None, None)
    b.__exit__(None, None, None)
    assert names(cudatimer.summary()) == {"a": 1, "a/b": 1}


def test_exit_without_enter_is_an_error() -> None:
    """Exiting a region that was never entered on this thread is a clear error."""
    with pytest.raises(RuntimeError, match="no region is open"):
        cudatimer.cuda_region("never").__exit__(None, None, None)


# -- threads ----------------------------------------------------------------------------------


def test_eight_threads_exact_counts() -> None:
    """8 threads x 10^4 regions (nested) give exact counts and per-thread nesting."""
    n = 10_000
    barrier = threading.Barrier(8)

    def work() -> None:
        barrier.wait()
        outer, inner = cudatimer.cuda_region("t_outer"), cudatimer.cuda_region("t_inner")
        for _ in range(n):
            with outer, inner:
                pass

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    got = names(cudatimer.summary())
    assert got == {"t_outer": 8 * n, "t_outer/t_inner": 8 * n}


def test_shared_region_across_threads_keeps_state_per_thread() -> None:
    """One Region object open on two threads at once records two separate calls."""
    region = cudatimer.cuda_region("shared")
    inside, release = threading.Event(), threading.Event()

    def hold() -> None:
        with region:
            inside.set()
            release.wait()

    t = threading.Thread(target=hold)
    t.start()
    inside.wait()
    with region:
        pass
    release.set()
    t.join()
    assert cudatimer.summary()["shared"].calls == 2


# -- enable / disable ---------------------------------------------------------------------------


def test_disable_records_nothing_and_enable_resumes() -> None:
    """disable() stops recording; enable() resumes; nesting stays balanced across the switch."""

    @cudatimer.cuda_timed("f")
    def f() -> None:
        pass

    cudatimer.disable()
    assert not cudatimer.is_enabled()
    f()
    with cudatimer.cuda_region("off"):
        pass
    assert cudatimer.summary().regions == ()
    cudatimer.enable()
    f()
    assert names(cudatimer.summary()) == {"f": 1}


def test_env_disable_makes_decorators_identity() -> None:
    """CUDATIMER_DISABLE=1 at import: decorators return the function itself, regions do nothing."""
    code = (
        "import cudatimer\n"
        "def f(): return 1\n"
        "assert cudatimer.cuda_timed(f) is f\n"
        "assert cudatimer.cuda_timed('x')(f) is f\n"
        "with cudatimer.cuda_region('r'): pass\n"
        "assert cudatimer.summary().regions == ()\n"
        "assert not cudatimer.is_enabled()\n"
        "r = cudatimer.cuda_region('r')\n"
        "assert r is cudatimer.default_timer()._regions['r']  # cached: one dict hit\n"
        "assert r(f) is f and r.__enter__() is r and r.__exit__(None, None, None) is None\n"
        "assert r.name == ''\n"
        "try:\n"
        "    cudatimer.cuda_region('')\n"
        "except ValueError:\n"
        "    print('ok')\n"
    )
    for value in ("1", "true", "YES"):
        out = run_python(code, {"CUDATIMER_DISABLE": value})
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == "ok"


def test_env_disable_false_values_keep_timing() -> None:
    """CUDATIMER_DISABLE=0/false/no keep timing on; a bad value is a clear error."""
    code = "import cudatimer\nprint(cudatimer.is_enabled())\n"
    for value in ("0", "false", "no"):
        out = run_python(code, {"CUDATIMER_DISABLE": value})
        assert out.stdout.strip() == "True", out.stderr
    bad = run_python(code, {"CUDATIMER_DISABLE": "maybe"})
    assert bad.returncode != 0 and "CUDATIMER_DISABLE" in bad.stderr


# -- independent timers, reset, purity -----------------------------------------------------------


def test_timers_are_independent() -> None:
    """A Timer keeps its own results; the default Timer does not see them."""
    t = Timer(name="mine")
    with t.region("x"):
        pass

    @t.timed
    def g() -> None:
        pass

    g()
    assert names(t.summary()) == {"x": 1, "test_timers_are_independent.<locals>.g": 1}
    assert cudatimer.summary().regions == ()
    t.reset()
    assert t.summary().regions == ()


def test_reading_never_mutates() -> None:
    """Any number of summaries and reports see the same data until reset()."""
    for _ in range(3):
        with cudatimer.cuda_region("r"):
            pass
    first = cudatimer.summary()
    for _ in range(3):
        cudatimer.report()
    assert cudatimer.summary().regions == first.regions
    cudatimer.reset()
    assert cudatimer.summary().regions == ()


def test_reset_inside_open_region_is_safe() -> None:
    """reset() while a region is open drops that call and leaves later results clean."""
    with cudatimer.cuda_region("open"):
        cudatimer.reset()
    with cudatimer.cuda_region("after"):
        pass
    assert names(cudatimer.summary()) == {"after": 1}


# -- statistics ----------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_percentiles_within_stated_error(seed: int) -> None:
    """Histogram percentiles are within ALPHA (1%) of exact nearest-rank percentiles."""
    rng = random.Random(seed)
    values = [rng.lognormvariate(0.0, 2.0) for _ in range(20_000)] + [0.0] * 5
    h = Histogram.of(values)
    ordered = sorted(values)
    for q in (0.0, 0.01, 0.1, 0.5, 0.9, 0.99, 0.999, 1.0):
        exact = ordered[max(1, math.ceil(q * len(ordered))) - 1]
        got = h.quantile(q)
        assert abs(got - exact) <= cudatimer.ALPHA * exact + 1e-12, (q, got, exact)
    assert h.count == len(values) and h.total == pytest.approx(sum(values))
    assert (h.min, h.max) == (min(values), max(values))


def test_histogram_merge_is_exact() -> None:
    """Merging two histograms equals the histogram of all their values."""
    rng = random.Random(5)
    a = [rng.expovariate(1.0) for _ in range(1000)]
    b = [rng.expovariate(0.1) for _ in range(700)]
    merged = Histogram.of(a).merge(Histogram.of(b))
    whole = Histogram.of(a + b)
    assert merged.buckets == whole.buckets
    assert (merged.count, merged.min, merged.max) == (whole.count, whole.min, whole.max)
    assert merged.total == pytest.approx(whole.total)


def test_histogram_memory_is_bounded() -> None:
    """A million samples of steady durations occupy a handful of buckets."""
    b = Histogram.of(1.0 + 0.001 * (i % 7) for i in range(1_000_000))
    assert b.count == 1_000_000
    assert len(b.buckets) <= 3


def test_region_stats_fields() -> None:
    """Calls, totals, means, min/max and percentiles agree with the recorded host times."""
    for delay in (0.001, 0.003, 0.005):
        with cudatimer.cuda_region("s"):
            time.sleep(delay)
    r = cudatimer.summary()["s"]
    assert r.calls == 3
    assert r.cpu_total_ms == pytest.approx(r.cpu.total)
    assert r.cpu_mean_ms == pytest.approx(r.cpu_total_ms / 3)
    assert r.cpu_min_ms >= 1.0 and r.cpu_max_ms >= 5.0
    assert r.gpu_total_ms is None and r.gpu_p50_ms is None  # host clock: no GPU columns
    # Host percentiles are fields too, within the histogram's stated error of the samples.
    assert (r.cpu_p50_ms, r.cpu_p90_ms, r.cpu_p99_ms) == tuple(
        r.cpu.quantile(q) for q in (0.5, 0.9, 0.99)
    )
    assert r.cpu_min_ms <= r.cpu_p50_ms <= r.cpu_p90_ms <= r.cpu_p99_ms <= r.cpu_max_ms
    assert r.cpu_p50_ms >= 3.0 * (1 - cudatimer.ALPHA)  # the middle sleep of 1, 3 and 5 ms


# -- report -------------------------------------------------------------------------------------


def test_report_prints_and_returns_table(capsys: pytest.CaptureFixture[str]) -> None:
    """report() prints the table and returns the same text, naming clock and regions."""
    with cudatimer.cuda_region("alpha"), cudatimer.cuda_region("beta"):
        pass
    text = cudatimer.report()
    assert capsys.readouterr().out.strip() == text.strip()
    assert "alpha/beta" in text and "host" in text and "calls" in text


def test_report_when_empty() -> None:
    """A report with nothing recorded says so instead of printing an empty table."""
    assert "no regions" in cudatimer.report()


# -- bad input -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "exc", "word"),
    [
        (lambda: cudatimer.cuda_region(3), TypeError, "name"),  # type: ignore[arg-type]
        (lambda: cudatimer.cuda_region(""), ValueError, "name"),
        (lambda: cudatimer.cuda_region("a/b"), ValueError, "'/'"),
        (lambda: cudatimer.cuda_region("a", mode="fast"), ValueError, "mode"),
        (lambda: cudatimer.cuda_region("a", clock="gpu"), ValueError, "clock"),
        (lambda: cudatimer.cuda_region("a", color="chartreuse"), ValueError, "color"),
        (lambda: cudatimer.cuda_region("a", color=0x1000000), ValueError, "color"),
        (lambda: cudatimer.cuda_region("a", color=1.5), TypeError, "color"),
        (lambda: cudatimer.cuda_region("a", category=2.5), TypeError, "category"),
        (lambda: cudatimer.cuda_region("a", payload="x"), TypeError, "payload"),
        (lambda: cudatimer.cuda_region("a", colour="red"), TypeError, "colour"),
        (lambda: cudatimer.cuda_timed(42), TypeError, "cuda_timed"),
        (lambda: cudatimer.cuda_timed(name=5), TypeError, "name"),
        (lambda: cudatimer.cuda_timed(mode="x"), ValueError, "mode"),
        (lambda: Timer(mode="x"), ValueError, "mode"),
        (lambda: Timer(enabled="yes"), TypeError, "enabled"),  # type: ignore[arg-type]
        (lambda: Timer(keep_steps=-1), ValueError, "keep_steps"),
        (lambda: cudatimer.summary(timeout_s="1"), TypeError, "timeout_s"),  # type: ignore[arg-type]
        (lambda: cudatimer.summary(timeout_s=-1), ValueError, "timeout_s"),
    ],
)
def test_bad_input_is_named(call: object, exc: type[Exception], word: str) -> None:
    """Bad arguments raise TypeError/ValueError naming the argument."""
    with pytest.raises(exc, match=word):
        call()  # type: ignore[operator]


def test_wraps_keeps_signature() -> None:
    """Decorated functions keep __wrapped__, so inspect.signature sees the original."""
    import inspect

    def f(a: int, *, b: str = "x") -> str:
        return b * a

    timed = cudatimer.cuda_timed(f)
    assert timed is not f
    assert inspect.signature(timed) == inspect.signature(f)
    assert timed(2, b="y") == "yy"
