"""NVTX ranges, proven: every test runs a fresh process under a logging NVTX tool
(tests/helpers/nvtx_inject/inject.c) and asserts exactly which ranges were pushed, popped, started,
ended and marked. Every run is also checked for per-thread push/pop balance at exit."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from tests.helpers.nvtx_harness import (
    REPO_ROOT,
    HarnessUnavailable,
    Record,
    assert_balanced,
    compile_shared,
    injection_library,
    ranges,
    run_with_injection,
    trace,
)


@pytest.fixture(scope="session")
def nvtx_tool() -> Path:
    """The injection library, built once per session; skip only if gcc/headers are missing."""
    try:
        return injection_library()
    except HarnessUnavailable as exc:
        pytest.skip(str(exc))


def by_msg(records: list[Record], msg: str, domain: str = "cudatimer") -> list[Record]:
    return [r for r in ranges(records, domain) if r.msg == msg]


# ---------------------------------------------------------------------------------------------
# The harness itself
# ---------------------------------------------------------------------------------------------


def test_raw_nvtx_package_calls_are_logged(nvtx_tool: Path) -> None:
    """The tool sees the nvtx package's domain calls with message, color, category, payload."""
    recs = run_with_injection(
        """
        import nvtx
        d = nvtx.Domain("raw")
        d.push_range(message="outer", color=0x102030, category=7, payload=11)
        d.push_range(message="inner", payload=2.5)
        d.mark(message="here")
        d.pop_range()
        rid = d.start_range(message="span")
        d.pop_range()
        d.end_range(rid)
        """
    )
    assert trace(recs, "raw") == ["+outer", "+inner", "!here", "-inner", "[span", "-outer", "]span"]
    outer, inner = by_msg(recs, "outer", "raw")[0], by_msg(recs, "inner", "raw")[0]
    assert (outer.rgb, outer.category, outer.payload_type, outer.payload) == (
        0x102030,
        7,
        "int64",
        11,
    )
    assert (inner.payload_type, inner.payload) == ("double", 2.5)
    assert len({r.tid for r in recs}) == 1


def test_core_api_and_two_nvtx_instances(nvtx_tool: Path, tmp_path: Path) -> None:
    """The domain-less ASCII API (torch.cuda.nvtx's) is logged, from a second NVTX instance."""
    src = tmp_path / "probe.c"
    src.write_text(
        "#include <nvtx3/nvToolsExt.h>\n"
        "void probe(void) {\n"
        '  nvtxRangePushA("c-push");\n'
        '  nvtxMarkA("c-mark");\n'
        '  nvtxRangeId_t id = nvtxRangeStartA("c-start");\n'
        "  nvtxRangeEnd(id);\n"
        "  nvtxRangePop();\n"
        "}\n"
    )
    probe = compile_shared(src, "libprobe.so")
    recs = run_with_injection(
        f"""
        import ctypes, nvtx
        d = nvtx.Domain("py")
        d.push_range(message="py-outer")
        ctypes.CDLL({str(probe)!r}).probe()
        d.pop_range()
        """
    )
    # Each NVTX instance (the nvtx package's, the probe's) initialises the tool once.
    assert len([r for r in recs if r.kind == "init"]) == 2
    assert trace(recs, None) == [
        "+py-outer",
        "+c-push",
        "!c-mark",
        "[c-start",
        "]c-start",
        "-c-push",
        "-py-outer",
    ]
    assert {r.domain for r in ranges(recs, None)} == {"py", ""}


def test_torch_cuda_nvtx_is_logged(nvtx_tool: Path) -> None:
    """torch.cuda.nvtx (torch's own NVTX instance) reaches the tool, where torch has NVTX."""
    import torch

    try:
        torch.cuda.nvtx.range_push("probe")
        torch.cuda.nvtx.range_pop()
    except RuntimeError as exc:  # CPU builds: "NVTX functions not installed"
        pytest.skip(f"this torch build has no NVTX: {exc}")
    recs = run_with_injection(
        """
        import torch
        torch.cuda.nvtx.range_push("t-outer")
        torch.cuda.nvtx.mark("t-mark")
        torch.cuda.nvtx.range_pop()
        """
    )
    assert trace(recs, "") == ["+t-outer", "!t-mark", "-t-outer"]


def test_balance_check_catches_unbalanced_programs(nvtx_tool: Path) -> None:
    """assert_balanced fails on a missing pop, a stray pop, a thread's leak, an unended range."""
    cases = {
        "missing pop": "d.push_range(message='a')",
        "stray pop": "d.pop_range()",
        "thread leak": "t = threading.Thread(target=lambda: d.push_range(message='t'));"
        " t.start(); t.join()",
        "unended range": "d.start_range(message='s')",
    }
    for what, body in cases.items():
        recs = run_with_injection(
            f"import nvtx, threading\nd = nvtx.Domain('x')\n{body}\n", check_balance=False
        )
        with pytest.raises(AssertionError, match="unbalanced"):
            assert_balanced(recs)
        assert recs, what
    # The same calls, balanced, pass.
    assert_balanced(
        run_with_injection(
            "import nvtx\nd = nvtx.Domain('x')\nd.push_range(message='a')\nd.pop_range()\n"
            "d.end_range(d.start_range(message='s'))\n"
        )
    )


def test_log_lines_survive_many_threads(nvtx_tool: Path) -> None:
    """The tool's log stays one intact line per call with 8 threads pushing concurrently."""
    recs = run_with_injection(
        """
        import nvtx, threading
        d = nvtx.Domain("mt")
        go = threading.Barrier(8)
        def work(i):
            go.wait()
            for _ in range(300):
                d.push_range(message=f"w{i}")
                d.pop_range()
        ts = [threading.Thread(target=work, args=(i,)) for i in range(8)]
        [t.start() for t in ts]
        [t.join() for t in ts]
        """
    )
    pushes = [r for r in recs if r.kind == "push"]
    assert len(pushes) == 8 * 300
    assert len({r.tid for r in pushes}) == 8
    assert [r.seq for r in recs] == list(range(len(recs)))  # no line lost or torn


# ---------------------------------------------------------------------------------------------
# cudatimer's ranges
# ---------------------------------------------------------------------------------------------


def test_nested_regions_exact_sequence(nvtx_tool: Path) -> None:
    """Nested regions push/pop in order, in domain cudatimer, named by their own name."""
    recs = run_with_injection(
        """
        import cudatimer
        with cudatimer.cuda_region("outer"):
            with cudatimer.cuda_region("a"):
                pass
            with cudatimer.cuda_region("b"):
                with cudatimer.cuda_region("leaf"):
                    pass
        with cudatimer.cuda_region("outer"):
            pass
        """
    )
    assert trace(recs) == [
        "+outer",
        "+a",
        "-a",
        "+b",
        "+leaf",
        "-leaf",
        "-b",
        "-outer",
        "+outer",
        "-outer",
    ]
    assert [r for r in recs if r.kind in ("push", "pop") and r.domain != "cudatimer"] == []


def test_regions_inside_compiled_code_push_and_pop(nvtx_tool: Path) -> None:
    """Regions inside torch.compile'd code (inductor) push and pop their ranges on every call,
    nested under the eager region around the compiled call."""
    recs = run_with_injection(
        """
        import torch, cudatimer
        @cudatimer.cuda_timed(name="inner")
        def inner(x):
            return x.sin()
        def fn(x):
            with cudatimer.cuda_region("block"):
                x = x * 2
            return inner(x)
        compiled = torch.compile(fn, backend="inductor", fullgraph=True)
        for _ in range(2):
            with cudatimer.cuda_region("step"):
                compiled(torch.ones(4))
        """
    )
    assert trace(recs) == ["+step", "+block", "-block", "+inner", "-inner", "-step"] * 2
    assert_balanced(recs)


def test_timer_domain_option(nvtx_tool: Path) -> None:
    """Timer(domain=...) puts its ranges in that domain, not in cudatimer's."""
    recs = run_with_injection(
        """
        import cudatimer
        t = cudatimer.Timer(domain="mylib")
        with t.region("x"):
            with cudatimer.cuda_region("y"):
                pass
        """
    )
    assert trace(recs, "mylib") == ["+x", "-x"]
    assert trace(recs, "cudatimer") == ["+y", "-y"]


def test_recursion(nvtx_tool: Path) -> None:
    """A recursive decorated function nests one range per level."""
    recs = run_with_injection(
        """
        import cudatimer
        @cudatimer.cuda_timed("fact")
        def fact(n):
            return 1 if n <= 1 else n * fact(n - 1)
        assert fact(4) == 24
        """
    )
    assert trace(recs) == ["+fact"] * 4 + ["-fact"] * 4


def test_exception_still_pops(nvtx_tool: Path) -> None:
    """A raising body pops its ranges (with-block and decorator), and later ranges are clean."""
    recs = run_with_injection(
        """
        import cudatimer
        class Boom(Exception):
            pass
        @cudatimer.cuda_timed("deco")
        def f():
            raise Boom
        try:
            with cudatimer.cuda_region("outer"):
                with cudatimer.cuda_region("inner"):
                    raise Boom
        except Boom:
            pass
        try:
            f()
        except Boom:
            pass
        with cudatimer.cuda_region("after"):
            pass
        """
    )
    assert trace(recs) == [
        "+outer",
        "+inner",
        "-inner",
        "-outer",
        "+deco",
        "-deco",
        "+after",
        "-after",
    ]


def test_threads_balance_per_thread(nvtx_tool: Path) -> None:
    """Concurrent threads each push and pop their own ranges on their own thread id."""
    recs = run_with_injection(
        """
        import threading, cudatimer
        go = threading.Barrier(4)
        def work():
            go.wait()
            for _ in range(50):
                with cudatimer.cuda_region("worker"):
                    with cudatimer.cuda_region("leaf"):
                        pass
        ts = [threading.Thread(target=work) for _ in range(4)]
        [t.start() for t in ts]
        [t.join() for t in ts]
        with cudatimer.cuda_region("main"):
            pass
        """
    )
    tids = {r.tid for r in ranges(recs)}
    assert len(tids) == 5
    per_thread = sorted(trace(recs, tid=t) for t in tids)
    assert per_thread == sorted(
        [["+main", "-main"]] + [["+worker", "+leaf", "-leaf", "-worker"] * 50] * 4
    )
    # Pops happen on the pushing thread (trace keys its stacks by thread): counts per tid match.
    for t in tids:
        mine = [r for r in recs if r.tid == t and r.domain == "cudatimer"]
        assert sum(r.kind == "push" for r in mine) == sum(r.kind == "pop" for r in mine)


def test_decorated_methods(nvtx_tool: Path) -> None:
    """Methods, class methods and static methods decorated with cuda_timed all emit ranges."""
    recs = run_with_injection(
        """
        import cudatimer
        class Net:
            @cudatimer.cuda_timed
            def forward(self, x):
                return self.helper(x)
            @cudatimer.cuda_timed("helper")
            def helper(self, x):
                return Net.cm(x)
            @cudatimer.cuda_timed(name="cm", payload=7)
            @classmethod
            def cm(cls, x):
                return cls.sm(x)
            @cudatimer.cuda_timed
            @staticmethod
            def sm(x):
                return x + 1
        assert Net().forward(1) == 2
        assert Net.sm(1) == 2
        """
    )
    assert trace(recs) == [
        "+Net.forward",
        "+helper",
        "+cm",
        "+Net.sm",
        "-Net.sm",
        "-cm",
        "-helper",
        "-Net.forward",
        "+Net.sm",
        "-Net.sm",
    ]
    assert {(r.payload_type, r.payload) for r in by_msg(recs, "cm")} == {("int64", 7)}


def test_async_functions_use_start_end(nvtx_tool: Path) -> None:
    """Interleaved coroutines get start/end ranges (not push/pop), each ended by its own id."""
    recs = run_with_injection(
        """
        import asyncio, cudatimer
        @cudatimer.cuda_timed("a")
        async def a():
            await asyncio.sleep(0)
            await asyncio.sleep(0)
        @cudatimer.cuda_timed("b")
        async def b():
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            await asyncio.sleep(0)
        async def main():
            await asyncio.gather(a(), b())
        asyncio.run(main())
        """
    )
    # They overlap: a push/pop stack could not represent this.
    assert trace(recs) == ["[a", "[b", "]a", "]b"]
    starts = {r.msg: r.id for r in recs if r.kind == "start" and r.domain == "cudatimer"}
    ends = [r.id for r in recs if r.kind == "end" and r.domain == "cudatimer"]
    assert ends == [starts["a"], starts["b"]]


def test_disable_emits_nothing_until_enable(nvtx_tool: Path) -> None:
    """disable() and Timer(enabled=False) emit no NVTX; enable() brings ranges back."""
    recs = run_with_injection(
        """
        import cudatimer
        cudatimer.disable()
        with cudatimer.cuda_region("off"):
            pass
        @cudatimer.cuda_timed("off_fn")
        def f():
            pass
        f()
        with cudatimer.Timer(enabled=False).region("timer_off"):
            pass
        cudatimer.enable()
        with cudatimer.cuda_region("on"):
            f()
        """
    )
    assert trace(recs, None) == ["+on", "+off_fn", "-off_fn", "-on"]


def test_env_disable_emits_nothing(nvtx_tool: Path) -> None:
    """CUDATIMER_DISABLE=1 at import: regions, decorators and enable() emit no NVTX at all."""
    recs = run_with_injection(
        """
        import warnings, cudatimer
        @cudatimer.cuda_timed
        def f():
            pass
        with cudatimer.cuda_region("r"):
            f()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cudatimer.enable()
        with cudatimer.cuda_region("r2"):
            f()
        assert not cudatimer.is_enabled()
        """,
        env={"CUDATIMER_DISABLE": "1"},
    )
    assert trace(recs, None) == []


@pytest.mark.parametrize("env", [{"CUDATIMER_NVTX": "0"}, {"NVTX_DISABLE": "1"}])
def test_nvtx_switched_off_timing_continues(nvtx_tool: Path, env: dict[str, str]) -> None:
    """CUDATIMER_NVTX=0 or NVTX_DISABLE: no ranges, while regions are still timed."""
    recs = run_with_injection(
        """
        import cudatimer
        for _ in range(2):
            with cudatimer.cuda_region("a"):
                pass
        assert cudatimer.summary()["a"].calls == 2
        """,
        env=env,
    )
    assert trace(recs, None) == []


def test_nvtx_only_mode(nvtx_tool: Path) -> None:
    """mode="nvtx" (per region and per Timer) still emits its ranges."""
    recs = run_with_injection(
        """
        import cudatimer
        with cudatimer.cuda_region("n", mode="nvtx"):
            with cudatimer.Timer(mode="nvtx").region("tn"):
                pass
        """
    )
    assert trace(recs) == ["+n", "+tn", "-tn", "-n"]


def test_events_only_mode(nvtx_tool: Path) -> None:
    """mode="events" (per region and per Timer) emits no NVTX, while the region is timed."""
    recs = run_with_injection(
        """
        import cudatimer
        with cudatimer.cuda_region("full"):
            with cudatimer.cuda_region("ev", mode="events"):
                pass
        t = cudatimer.Timer(mode="events")
        with t.region("tev"):
            pass
        assert cudatimer.summary()["full/ev"].calls == 1
        assert t.summary()["tev"].calls == 1
        """
    )
    assert trace(recs, None) == ["+full", "-full"]


def test_options_reach_nvtx(nvtx_tool: Path) -> None:
    """color, category (int or named) and payload (int or float) appear on the range."""
    recs = run_with_injection(
        """
        import cudatimer
        with cudatimer.cuda_region("c_int", color=0x123456, category=5, payload=42):
            pass
        with cudatimer.cuda_region("c_named", color="red", category="io", payload=2.5):
            pass
        for step in range(3):
            with cudatimer.cuda_region("step", payload=step):
                pass
        """
    )
    (c_int,) = by_msg(recs, "c_int")
    assert (c_int.rgb, c_int.category, c_int.payload_type, c_int.payload) == (
        0x123456,
        5,
        "int64",
        42,
    )
    (c_named,) = by_msg(recs, "c_named")
    assert c_named.rgb is not None
    r, g, b = c_named.rgb >> 16, (c_named.rgb >> 8) & 0xFF, c_named.rgb & 0xFF
    assert r > 2 * max(g, b), f"'red' came out as {c_named.rgb:#08x}"
    names = {
        x.msg: x.category for x in recs if x.kind == "name_category" and x.domain == "cudatimer"
    }
    assert names.get("io") == c_named.category != 0
    assert (c_named.payload_type, c_named.payload) == ("double", 2.5)
    assert [(x.msg, x.payload) for x in by_msg(recs, "step")] == [("step", i) for i in range(3)]


def test_default_colors_stable_across_processes(nvtx_tool: Path) -> None:
    """Default colors depend only on the name: equal in two processes (different hash seeds),
    constant per name, and not all the same."""
    code = """
        import cudatimer
        for name in ["forward", "backward", "optimizer", "data", "loss", "eval", "forward"]:
            with cudatimer.cuda_region(name):
                pass
        """

    def colors(seed: str) -> dict[str, int | None]:
        recs = run_with_injection(code, env={"PYTHONHASHSEED": seed})
        seen: dict[str, set[int | None]] = {}
        for r in ranges(recs):
            seen.setdefault(r.msg, set()).add(r.rgb)
        assert all(len(v) == 1 for v in seen.values()), seen  # same name, same color
        return {k: next(iter(v)) for k, v in seen.items()}

    first, second = colors("1"), colors("2")
    assert first == second
    assert None not in first.values()
    assert len(set(first.values())) >= 3


def test_mark(nvtx_tool: Path) -> None:
    """cudatimer.mark and Timer.mark emit an instant marker in their domain."""
    recs = run_with_injection(
        """
        import cudatimer
        with cudatimer.cuda_region("outer"):
            cudatimer.mark("ckpt")
        cudatimer.Timer(domain="other").mark("t-mark")
        """
    )
    assert trace(recs) == ["+outer", "!ckpt", "-outer"]
    assert trace(recs, "other") == ["!t-mark"]


def test_mixed_program_balanced_per_thread(nvtx_tool: Path) -> None:
    """A program mixing threads, exceptions, decorators and generators leaves no range open."""
    recs = run_with_injection(
        """
        import threading, cudatimer
        @cudatimer.cuda_timed("gen")
        def gen():
            for i in range(3):
                yield i
        def work(k):
            for i in range(20):
                try:
                    with cudatimer.cuda_region("w"):
                        list(gen())
                        if i % 3 == k % 3:
                            raise ValueError
                except ValueError:
                    pass
        ts = [threading.Thread(target=work, args=(k,)) for k in range(3)]
        [t.start() for t in ts]
        [t.join() for t in ts]
        """
    )
    assert len({r.tid for r in ranges(recs)}) == 3
    assert sum(r.kind == "push" for r in recs) == 3 * 20 * (1 + 4)  # w + 4 generator resumes


# ---------------------------------------------------------------------------------------------
# nsight_capture
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def profiler_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    import torch

    calls: list[str] = []
    monkeypatch.setattr(torch.cuda.profiler, "start", lambda: calls.append("start"))
    monkeypatch.setattr(torch.cuda.profiler, "stop", lambda: calls.append("stop"))
    yield calls


def test_nsight_capture_is_a_noop_without_cuda(
    profiler_calls: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without CUDA, nsight_capture neither calls the profiler nor raises."""
    import torch

    from cudatimer.features._nsight import nsight_capture

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with nsight_capture():
        pass
    assert profiler_calls == []


def test_nsight_capture_starts_and_stops_even_on_error(
    profiler_calls: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With CUDA, start/stop bracket the body, stop runs on error, nesting toggles once."""
    import torch

    from cudatimer.features._nsight import nsight_capture

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "_is_in_bad_fork", lambda: False)
    with pytest.raises(KeyError), nsight_capture():
        profiler_calls.append("body")
        raise KeyError
    assert profiler_calls == ["start", "body", "stop"]

    profiler_calls.clear()
    with nsight_capture():
        with nsight_capture():
            profiler_calls.append("inner")
        profiler_calls.append("outer")
    assert profiler_calls == ["start", "inner", "outer", "stop"]

    profiler_calls.clear()

    @nsight_capture()
    def step() -> None:
        profiler_calls.append("step")

    step()
    step()
    assert profiler_calls == ["start", "step", "stop"] * 2


def test_nsight_capture_exported() -> None:
    """cudatimer.nsight_capture is the public name."""
    import cudatimer
    from cudatimer.features._nsight import nsight_capture

    assert getattr(cudatimer, "nsight_capture", None) is nsight_capture


# ---------------------------------------------------------------------------------------------
# benchmarks/nsys_check.py
# ---------------------------------------------------------------------------------------------


def _load_nsys_check() -> ModuleType:
    path = REPO_ROOT / "benchmarks" / "nsys_check.py"
    spec = importlib.util.spec_from_file_location("nsys_check", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["nsys_check"] = mod  # dataclasses resolve their module by name
    spec.loader.exec_module(mod)
    return mod


def test_nsys_check_selftest() -> None:
    """nsys_check.py --selftest parses its embedded nsys CSV and judges it (exit 0)."""
    proc = subprocess.run(
        [sys.executable, str(REPO_ROOT / "benchmarks" / "nsys_check.py"), "--selftest"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_nsys_check_flags_mismatches() -> None:
    """The checker fails on a wrong call count, a >3% GPU disagreement, and a missing range."""
    nc = _load_nsys_check()
    stats = nc.parse_stats_csv(nc.SAMPLE_CSV)
    good = nc.check(stats, nc.SAMPLE_SUMMARY, domain="cudatimer")
    assert good.ok, good.problems
    for mutate in (
        lambda r: {**r, "calls": r["calls"] + 1},
        lambda r: {**r, "gpu_total_ms": r["gpu_total_ms"] * 1.05},
    ):
        regions = [
            mutate(r) if r["name"].endswith("matmuls") else r for r in nc.SAMPLE_SUMMARY["regions"]
        ]
        bad = nc.check(stats, {**nc.SAMPLE_SUMMARY, "regions": regions}, domain="cudatimer")
        assert not bad.ok
    extra = [
        *nc.SAMPLE_SUMMARY["regions"],
        {"name": "ghost", "calls": 1, "gpu_total_ms": 5.0, "nvtx": True},
    ]
    assert not nc.check(stats, {**nc.SAMPLE_SUMMARY, "regions": extra}, domain="cudatimer").ok


def test_nsys_workload_ranges_match_its_summary(nvtx_tool: Path, tmp_path: Path) -> None:
    """The workload (CPU smoke size) pushes one range per recorded call, none for events-only
    regions: what --check will demand from nsys on the GPU."""
    nc = _load_nsys_check()
    out = tmp_path / "ct.json"
    recs = run_with_injection(
        f"""
        import runpy, sys
        sys.argv = ["nsys_check.py", "--workload", "--steps", "3", "--summary", {str(out)!r}]
        try:
            runpy.run_path("benchmarks/nsys_check.py", run_name="__main__")
        except SystemExit as e:
            assert not e.code, e.code
        """
    )
    counts: dict[str, int] = {}
    for r in ranges(recs):
        counts[f"cudatimer:{r.msg}"] = counts.get(f"cudatimer:{r.msg}", 0) + 1
    stats = nc.Stats(cpu={k: nc.RangeRow(n, 0.0) for k, n in counts.items()})
    summary = json.loads(out.read_text())
    res = nc.check(stats, summary, min_ms=float("inf"))
    assert res.ok, res.table
    assert {r["name"].rsplit("/", 1)[-1] for r in summary["regions"]} == {
        *(k.split(":", 1)[1] for k in counts),
        nc.EVENTS_ONLY,
    }
