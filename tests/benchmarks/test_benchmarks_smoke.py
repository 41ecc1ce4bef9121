"""The benchmarks: the runner and its suites, the comparison suite's smoke mode end to end, the
standing scripts at smoke size, and the shape of RESULTS.md and results/."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers.extras import needs

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
COMPARE = BENCH / "compare.py"  # the comparison with other timers
RUNNER = BENCH / "run.py"
WORKLOADS = ("launch", "compute", "gpt2")  # resnet50 needs torchvision: may be skipped
TIMERS = (
    "none",
    "wrap-only",
    "floor",
    "cudatimer",
    "cudatimer-py",
    "cudatimer-timed",
    "cudatimer-nvtx",
    "cudatimer-off",
    "nvtx-annotate",
    "torch-profiler",
    "record-function",
    "sync-timer",
    "event-pair",
    "lightning-simple",
    "torchtnt",
    "proton",
)
CUDA_ONLY = ("floor", "sync-timer", "event-pair", "proton")
MAIN_COLUMNS = [
    "workload",
    "timer",
    "ms/iter (median)",
    "ms/iter [min, max]",
    "slowdown vs none (median [IQR])",
    "added us/region (median [IQR])",
    "vs floor",
    "rounds",
    "status",
]


def _table(md: str, first_header: str, second: str = "") -> tuple[list[str], list[list[str]]]:
    """The Markdown table whose header row starts with ``first_header`` (then ``second``)."""
    lines = md.splitlines()
    start = next(
        i
        for i, ln in enumerate(lines)
        if ln.startswith(f"| {first_header} ")
        and (not second or ln.split("|")[2].strip().startswith(second))
    )
    cells = [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in lines[start:]]
    header, body = cells[0], []
    for ln, row in zip(lines[start + 2 :], cells[2:], strict=False):
        if not ln.startswith("|"):
            break
        body.append(row)
    return header, body


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("bench")
    proc = subprocess.run(
        [sys.executable, str(COMPARE), "--smoke", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
    )
    return {"proc": proc, "out": out}


def test_smoke_run_succeeds(smoke: dict[str, Any]) -> None:
    """`compare.py --smoke` exits 0 and prints the table."""
    proc = smoke["proc"]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "| workload " in proc.stdout


def test_smoke_run_prints_no_profiler_log_lines(smoke: dict[str, Any]) -> None:
    """torch.profiler's Kineto "USDT:" lines (two per session) stay out of the output."""
    proc = smoke["proc"]
    printed = proc.stdout.splitlines() + proc.stderr.splitlines()
    assert [line for line in printed if line.startswith("USDT:")] == []


def test_outputs_exist(smoke: dict[str, Any]) -> None:
    """results.md and results.json are written (the chart too where matplotlib exists)."""
    out: Path = smoke["out"]
    assert (out / "results.md").stat().st_size > 0
    assert (out / "results.json").stat().st_size > 0
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return
    assert (out / "overhead.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_main_table_has_expected_columns_and_rows(smoke: dict[str, Any]) -> None:
    """The overhead table has its columns and one row per (workload, timer)."""
    md = (smoke["out"] / "results.md").read_text()
    header, rows = _table(md, "workload")
    assert header == MAIN_COLUMNS
    assert all(len(r) == len(MAIN_COLUMNS) for r in rows)
    pairs = {(r[0], r[1]) for r in rows}
    for w in WORKLOADS:
        for t in TIMERS:
            assert (w, t) in pairs, f"missing row {w} / {t}"


def test_baseline_and_cudatimer_rows_are_measured(smoke: dict[str, Any]) -> None:
    """The baseline and cudatimer rows carry numbers, not a skip."""
    md = (smoke["out"] / "results.md").read_text()
    _, rows = _table(md, "workload")
    for r in rows:
        if r[1] in ("none", "cudatimer", "cudatimer-off"):
            assert r[-1] == "ok", r
            assert float(r[2]) > 0
            assert r[7] == "2"


def test_cuda_only_timers_are_skipped_with_a_reason(smoke: dict[str, Any]) -> None:
    """Without CUDA, the floor, synchronizing and event timers are skipped and say why."""
    if torch.cuda.is_available():
        pytest.skip("CUDA is available: these timers run")
    md = (smoke["out"] / "results.md").read_text()
    _, rows = _table(md, "workload")
    for r in rows:
        if r[1] in CUDA_ONLY:
            assert r[-1].startswith("skipped: needs CUDA"), r


def test_per_timer_table_lists_every_timer(smoke: dict[str, Any]) -> None:
    """The per-timer table (syncs, memory, report time) has a row per timer."""
    md = (smoke["out"] / "results.md").read_text()
    header, rows = _table(md, "timer", "what it is")
    assert header[0] == "timer"
    assert "RSS growth (bytes/region)" in header
    assert {r[0] for r in rows} == set(TIMERS)


def test_json_holds_raw_rounds(smoke: dict[str, Any]) -> None:
    """results.json holds every round's per-iteration times and the table rows."""
    data = json.loads((smoke["out"] / "results.json").read_text())
    assert data["schema"] == 1
    assert data["table_columns"] == MAIN_COLUMNS
    for w in WORKLOADS:
        run = data["workloads"][w]
        assert run["regions_per_iter"] > 0
        assert len(run["rounds"]) == 2
        for row in run["rounds"]:
            assert row["none"] > 0
            assert all(isinstance(v, float) for v in row.values())
        assert set(run["timers"]) == set(TIMERS)
        assert run["stats"]["none"]["rounds"] == 2
    assert set(data["checks"]) >= {"syncs", "memory", "report", "accuracy", "resolution"}


def test_resolution_check_pairs_cudatimer_with_the_baseline(smoke: dict[str, Any]) -> None:
    """The resolution check times N regions + summary() and reports it next to the loop."""
    data = json.loads((smoke["out"] / "results.json").read_text())
    res = data["checks"]["resolution"]
    assert res["workload"] == "launch"
    assert res["regions"] == res["iters"] * res["regions_per_iter"] >= 480
    assert len(res["reps"]) == 2
    for rep in res["reps"]:
        assert {"none", "cudatimer"} <= set(rep)
        assert all(v["loop_s"] > 0 and v["resolve_s"] >= 0 for v in rep.values())
    assert data["resolution_stats"]["cudatimer"]["reps"] == 2
    md = (smoke["out"] / "results.md").read_text()
    header, rows = _table(md, "timer", "loop ms")
    assert "added us/region incl. resolution (median [IQR])" in header
    assert "cudatimer" in {r[0] for r in rows}


def test_same_recorder_cells_are_short(smoke: dict[str, Any]) -> None:
    """cudatimer-timed's memory and report cells say only "same recorder as cudatimer"."""
    md = (smoke["out"] / "results.md").read_text()
    header, rows = _table(md, "timer", "what it is")
    row = next(r for r in rows if r[0] == "cudatimer-timed")
    for column in ("RSS growth (bytes/region)", "report time (ms)"):
        assert row[header.index(column)] == "same recorder as cudatimer"


def test_child_mode_writes_its_json() -> None:
    """`compare.py --child proton` runs as the separate process and writes proton_process.json."""
    import tempfile

    with tempfile.TemporaryDirectory() as out:
        argv = [sys.executable, str(COMPARE), "--child", "proton", "--smoke", "--device", "cpu"]
        proc = subprocess.run(
            [*argv, "--workloads", "launch", "--out", out],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        data = json.loads((Path(out) / "proton_process.json").read_text())
        assert not (Path(out) / "results.md").exists()
    assert data["process"] == "proton"
    assert data["runs"] == []  # no CUDA here: Proton cannot run, so nothing is measured
    assert set(data["checks"]) <= {"report", "memory"}


def _bench(name: str) -> Any:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        return __import__(name)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def _run(m: Any, name: str, rounds: list[dict[str, float]], skipped: str = "") -> Any:
    timers = {k: m.TimerRun(k) for k in rounds[0]}
    if skipped:
        timers[skipped] = m.TimerRun(skipped, status="skipped", reason="measured elsewhere")
    return m.WorkloadRun(name, "d", 10, 4, 1, len(rounds), timers=timers, rounds=rounds)


def test_separate_process_rows_replace_the_timer_row_with_their_own_baseline() -> None:
    """Proton's rows come from its process and read against that process's none and floor."""
    m, r = _bench("_measure"), _bench("_report")
    main = _run(m, "launch", [{"none": 2.0, "cudatimer": 2.1}] * 3, skipped="proton")
    # Its own process: 1 ms baseline, floor +0.05 ms, proton +0.2 ms per iteration (10 regions).
    child = _run(m, "launch", [{"none": 1.0, "floor": 1.05, "cudatimer": 1.06, "proton": 1.2}] * 3)
    sp = m.SeparateProcess(key="proton", why="one CUPTI subscriber", runs={"launch": child})
    rows = {row[1]: row for row in r.main_rows([main], [sp])}
    proton = rows["proton"]
    assert proton[-1] == r.SEPARATE_STATUS
    assert proton[4].startswith("1.20x")  # vs its own none (1.0), not the main one (2.0)
    assert proton[5].startswith("20.00 ")  # (1.2 - 1.0) ms / 10 regions
    assert proton[6] == "4.00x"  # vs its own floor: 20 us / 5 us
    assert rows["cudatimer (proton's process)"][-1] == r.SEPARATE_STATUS
    assert rows["cudatimer"][-1] == "ok"
    alone = {row[1]: row for row in r.main_rows([main])}
    assert alone["proton"][-1] == "skipped: measured elsewhere"


def test_separate_process_checks_are_merged_and_marked() -> None:
    """The per-timer table shows the report/memory its process measured, marked as such."""
    m, r = _bench("_measure"), _bench("_report")
    checks = {"report": {"proton": {"skipped": "measured in a separate process"}}}
    own = {"samples": 10, "seconds": 0.002, "has_report": True, "report_chars": 5}
    sp = m.SeparateProcess(key="proton", why="x", checks={"report": {"proton": own}})
    rows = r.timer_rows({"proton": "Proton"}, r.merged_checks(checks, [sp]))
    assert rows[0][-1] == "2.0 (10 pending) [own process]"


def test_run_from_dict_round_trips() -> None:
    """A child process's JSON rebuilds the same WorkloadRun."""
    import dataclasses

    m = _bench("_measure")
    run = _run(m, "gpt2", [{"none": 1.0, "proton": 1.5}], skipped="floor")
    run.peak_mem_gb = 12.5
    back = m.run_from_dict(json.loads(json.dumps(dataclasses.asdict(run))))
    assert back == run


def test_calibrate_iters_fills_the_block(monkeypatch: pytest.MonkeyPatch) -> None:
    """Iterations per block follow the measured step time, within the workload's bounds."""
    m, w = _bench("_measure"), _bench("_workloads")
    clock = [0.0]

    def step() -> None:
        clock[0] += 0.010  # a 10 ms step on a fake clock

    monkeypatch.setattr(m.time, "perf_counter", lambda: clock[0])
    wl = w.Workload("x", "d", step, [], iters=2, warmup=1, rounds=1, block_ms=200.0)
    assert m.calibrate_iters(wl) == pytest.approx(10.0)
    assert wl.iters == 20
    wl = w.Workload("x", "d", step, [], iters=2, warmup=1, rounds=1, block_ms=200.0, max_iters=8)
    m.calibrate_iters(wl)
    assert wl.iters == 8


def test_resolution_stats_count_the_summary() -> None:
    """Added time incl. resolution = (loop + summary - baseline loop) / regions, per rep."""
    r = _bench("_report")
    res = {
        "regions": 1000,
        "keys": ["none", "cudatimer"],
        "reps": [
            {
                "none": {"loop_s": 1.0, "resolve_s": 0.0},
                "cudatimer": {"loop_s": 1.01, "resolve_s": 0.002},
            },
        ],
    }
    s = r.resolution_stats(res)["cudatimer"]
    assert s["added_us_in_loop_median"] == pytest.approx(10.0)
    assert s["added_us_incl_resolution_median"] == pytest.approx(12.0)


def test_unknown_timer_is_rejected() -> None:
    """An unknown --timers name is a usage error, not a silent skip."""
    proc = subprocess.run(
        [sys.executable, str(COMPARE), "--smoke", "--timers", "nope", "--out", "unused"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 2
    assert "unknown timer" in proc.stderr


def test_kernel_spans_matches_launches_to_kernels_by_correlation() -> None:
    """The accuracy check's trace parser spans first kernel start to last kernel end."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from _measure import kernel_spans
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    trace = {
        "traceEvents": [
            {"cat": "user_annotation", "name": "acc0", "ts": 100.0, "dur": 50.0},
            {
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "ts": 110.0,
                "args": {"correlation": 1},
            },
            {
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "ts": 140.0,
                "args": {"correlation": 2},
            },
            {
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "ts": 200.0,
                "args": {"correlation": 3},
            },
            {
                "cat": "kernel",
                "name": "gemm",
                "ts": 1000.0,
                "dur": 400.0,
                "args": {"correlation": 1},
            },
            {
                "cat": "kernel",
                "name": "gemm",
                "ts": 1400.0,
                "dur": 600.0,
                "args": {"correlation": 2},
            },
            {
                "cat": "kernel",
                "name": "gemm",
                "ts": 2000.0,
                "dur": 900.0,
                "args": {"correlation": 3},
            },
        ]
    }
    spans = kernel_spans(trace, ["acc0"])
    assert spans["acc0"] == pytest.approx(1.0)  # 1000 -> 2000 us, the third kernel is outside
    assert spans["acc0#kernels"] == 2


def test_hotpath_runs_on_the_cpu() -> None:
    """hotpath.py runs its paired rounds on the CPU and prints a row per variant."""
    script = ROOT / "benchmarks" / "hotpath.py"
    out = subprocess.run(
        [sys.executable, str(script), "--rounds", "3", "--iters", "1"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    rows = {line.split()[0] for line in out.stdout.splitlines()[3:] if line.strip()}
    assert {"cudatimer", "cudatimer-py", "cudatimer-held", "nvtx-only", "disabled"} <= rows


def _script(name: str, bench_n: int) -> subprocess.CompletedProcess[str]:
    """``benchmarks/<name>`` run with CUDATIMER_BENCH_N (its loop count) set; it must succeed."""
    env = {**os.environ, "CUDATIMER_BENCH_N": str(bench_n)}
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / name)],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out


def test_disabled_cost_measures_both_switches() -> None:
    """disabled_cost.py measures CUDATIMER_DISABLE, the enabled case and disable() at run time."""
    out = _script("disabled_cost.py", 2000)
    labels = [line.split("  ")[0] for line in out.stdout.splitlines()]
    assert labels == [
        "CUDATIMER_DISABLE=1",
        "enabled (for comparison)",
        "cudatimer.disable() at run time",
    ]


def test_backward_cost_smoke_gives_host_time_per_row_and_the_growth_check(tmp_path: Path) -> None:
    """backward_cost.py --smoke: per round host time per forward row and per backward row
    (in loss.backward() and its forward side), the three steps' ratios, and the growth check."""
    path = tmp_path / "backward.json"
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "backward_cost.py"),
            "--smoke",
            "--steps",
            "60",
            "--out",
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    r = json.loads(path.read_text())["cpu"]
    assert r["rounds"] == 3 and r["forward_rows_per_step"] == r["backward_rows_per_step"] == 17
    for key in ("forward_row_us", "backward_row_in_backward_us", "backward_row_us"):
        assert len(r[f"{key}_rounds"]) == 3 and r[key]["min"] <= r[key]["median"] <= r[key]["max"]
    assert set(r["ratio"]) == {"forward", "backward"}
    g = json.loads(path.read_text())["cpu_growth"]
    assert g["steps"] == 60 and g["window"] == 12 and g["last_over_first"] > 0
    assert "backward row / forward row" in out.stdout and "growth (cpu" in out.stdout


def test_compile_targets_runs_on_the_cpu(tmp_path: Path) -> None:
    """compile_targets.py --smoke compiles a tiny GPT-2 three ways, times every module, and
    gives one region's cost inside compiled code."""
    script = ROOT / "benchmarks" / "compile_targets.py"
    path = tmp_path / "compile.json"
    out = subprocess.run(
        [
            sys.executable,
            str(script),
            "--smoke",
            "--rounds",
            "2",
            "--steps",
            "1",
            "--json",
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr
    got = json.loads(path.read_text())
    assert got["modules"] > 0 and got["regions_with_gpu_time"] == got["modules"]
    assert got["calls_per_module"] == [2]
    assert got["ratio"] > 0
    # The per-region slope: differences of timings (finite, any sign on a loaded CPU), beside
    # direct timings of the marks' ops and the eager region (each a positive time).
    assert all(math.isfinite(got[k]) for k in ("compiled_region_us", "decorated_region_us"))
    pairs = ("op_pair_with_dep_us", "op_pair_no_dep_us", "op_pair_dep_list_us", "eager_region_us")
    assert all(got[k] > 0 for k in pairs)
    assert got["backward_rows"] > 0 and got["backward_calls_per_row"] == [2]
    assert got["backward_ratio"] > 0 and got["compile_s_backward"] > 0


def test_html_report_benchmark_runs_small() -> None:
    """html_report.py builds a run of N regions and steps, writes its page, prints size and time."""
    script = ROOT / "benchmarks" / "html_report.py"
    args = ["--steps", "30", "--regions", "12", "--repeat", "1"]
    out = subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    first = out.stdout.splitlines()[0]
    assert first.startswith("html report: 12 regions, 30 steps (360 step rows"), first
    assert " MB in " in first and out.stdout.splitlines()[1] == "targets met"


def test_floors_runs_on_the_cpu_and_leaves_the_marks_and_hooks_as_they_were(
    tmp_path: Path,
) -> None:
    """floors.py --smoke swaps the compiled marks' and backward hooks' bodies per variant, gives
    every variant's ratio, and a compiled region still times after it (the swap was undone)."""
    path = tmp_path / "floors.json"
    script = ROOT / "benchmarks" / "floors.py"
    out = subprocess.run(
        [sys.executable, str(script), "--smoke", "--json", str(path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr
    got = json.loads(path.read_text())
    assert set(got["compiled"]["ratio_median"]) == {"cudatimer", "records", "calls"}
    assert got["compiled"]["rows_after"] == got["compiled"]["modules"] > 0
    assert set(got["backward"]["ratio_median"]) == {
        "hook_floor",
        "forward",
        "backward",
        "backward_records",
        "backward_calls",
    }
    assert all(len(v) == 2 for v in got["backward"]["ratios"].values())


def test_eager_targets_runs_on_the_cpu(tmp_path: Path) -> None:
    """eager_targets.py --smoke measures the launch loop, the decode, memory and the Python
    core's process, and writes eager_targets.json."""
    cmd = [sys.executable, str(BENCH / "eager_targets.py"), "--smoke", "--out", str(tmp_path)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads((tmp_path / "eager_targets.json").read_text())
    # Three rounds of one iteration on a shared CPU: a paired difference of any sign.
    assert [set(r) for r in got["launch"]["runs"]] == [{"cudatimer"}]
    assert math.isfinite(got["launch"]["cudatimer_us"]) and got["pure"]["compiled"] is False
    assert got["decode"]["regions_recorded"] == got["decode"]["modules"] > 0
    assert got["memory"]["calls"] == got["memory"]["regions"] * 11 // 10  # warm-up + measured


# -- the runner ------------------------------------------------------------------------------
def _runner(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(RUNNER), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


def test_runner_lists_every_suite_with_scripts_that_exist() -> None:
    """run.py --list names every suite and its commands; each command's script exists."""
    runner = _bench("run")
    listed = _runner("--list")
    assert listed.returncode == 0, listed.stderr
    for suite in runner.SUITES:
        assert re.search(rf"^{suite.name}\s+{suite.area}\s+needs:", listed.stdout, re.M), suite
        assert suite.scripts(), f"{suite.name} runs no benchmark script"
        for script in suite.scripts():
            assert (ROOT / script).is_file(), f"{suite.name}: {script} is missing"
        assert set(suite.needs) | set(suite.smoke_needs) <= set(runner.NEEDS)
    assert len({s.name for s in runner.SUITES}) == len(runner.SUITES)


def test_runner_rejects_an_unknown_suite() -> None:
    """An unknown suite name is a usage error that lists the known ones."""
    done = _runner("hotpath", "nope", "--dry-run")
    assert done.returncode == 2
    assert "unknown suite: nope" in done.stderr and "hotpath" in done.stderr


def test_runner_dry_run_prints_commands_and_skips_what_the_machine_lacks(tmp_path: Path) -> None:
    """--dry-run prints each runnable suite's commands into the run's folder and, without CUDA,
    marks the suites that need it as skipped, running nothing."""
    if torch.cuda.is_available():
        pytest.skip("CUDA is here: no suite is skipped for the lack of it")
    done = _runner("all", "--smoke", "--dry-run", "--out", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "# graphs: skipped, needs CUDA (this machine has no GPU)" in lines
    assert "# syncs: skipped, needs CUDA (this machine has no GPU)" in lines
    assert f"python3 benchmarks/floors.py --smoke --json {tmp_path}/run/floors.json" in lines
    assert "CUDATIMER_BENCH_N=2000 python3 benchmarks/disabled_cost.py" in lines
    assert not (tmp_path / "run").exists()


def test_runner_records_a_run(tmp_path: Path) -> None:
    """A run writes each suite's output and a run.json: date, device, torch, commit, and per
    suite its commands with their exit status and the files it wrote."""
    out = tmp_path / "run"
    done = _runner("disabled", "html", "--smoke", "--out", str(out), timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    record = json.loads((out / "run.json").read_text())
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", record["date"])
    assert record["torch"] == torch.__version__ and record["device"] and record["smoke"] is True
    assert set(record["suites"]) == {"disabled", "html"}
    for name, entry in record["suites"].items():
        assert [c["rc"] for c in entry["commands"]] == [0], entry
        assert f"{name}.txt" in entry["files"] and record["files"][f"{name}.txt"].startswith(name)
    assert "CUDATIMER_DISABLE=1" in (out / "disabled.txt").read_text()
    assert "targets met" in (out / "html.txt").read_text()


def test_runner_names_one_folder_per_run(tmp_path: Path) -> None:
    """The day's first run on a device gets <date>-<device>, later ones -2, -3; the device is
    the GPU's name without its vendor, with the count past one, or cpu."""
    runner = _bench("run")
    assert runner.next_run_dir(tmp_path, "2026-12-03", "h200") == tmp_path / "2026-12-03-h200"
    (tmp_path / "2026-12-03-h200").mkdir()
    assert runner.next_run_dir(tmp_path, "2026-12-03", "h200").name == "2026-12-03-h200-2"
    (tmp_path / "2026-12-03-h200-2").mkdir()
    assert runner.next_run_dir(tmp_path, "2026-12-03", "h200").name == "2026-12-03-h200-3"
    assert runner.next_run_dir(tmp_path, "2026-12-03", "cpu").name == "2026-12-03-cpu"
    assert runner.device_slug({"gpus": 1, "device": "NVIDIA H200"}) == "h200"
    assert runner.device_slug({"gpus": 2, "device": "NVIDIA H200"}) == "h200x2"
    assert runner.device_slug({"gpus": 0, "device": "cpu (x86_64)"}) == "cpu"
    for name in ("2026-12-03-h200", "2026-12-03-h200-3", "2026-12-03-cpu"):
        assert runner.RUN_DIR.match(name)


# -- RESULTS.md and results/ -----------------------------------------------------------------
RESULTS_MD = BENCH / "RESULTS.md"
MEASURED = re.compile(
    r"^Measured: (\d{4}-\d{2}-\d{2}), (?:2 x )?(NVIDIA H200|CPU machine)\b.*?\btorch \d+\.\d+", re.S
)


def test_results_md_is_short_and_every_section_is_dated() -> None:
    """RESULTS.md is at most 300 lines, and each section opens with its date, device and torch."""
    text = RESULTS_MD.read_text()
    assert len(text.splitlines()) <= 300
    sections = re.split(r"^## ", text, flags=re.M)[1:]
    assert len(sections) >= 8
    for section in sections:
        title, _, body = section.partition("\n")
        first = body.strip().split("\n\n")[0]
        assert MEASURED.match(first), f"section {title!r} opens without date, device and torch"


def test_benchmark_scripts_named_in_the_docs_exist() -> None:
    """Every benchmark script the README, docs/ and RESULTS.md name exists (RESULTS.md names
    scripts by their file name too), and every raw file RESULTS.md cites is in results/."""
    named: set[str] = set()
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), RESULTS_MD]:
        named |= set(re.findall(r"\bbenchmarks/[\w/.-]*?\.(?:py|sh)\b", path.read_text()))
    text = RESULTS_MD.read_text()
    bare = set(re.findall(r"(?<![\w/.-])([a-z_]+\.(?:py|sh))\b", text))
    named |= {f"benchmarks/{name}" for name in bare}
    assert {"benchmarks/hotpath.py", "benchmarks/floors.py", "benchmarks/run.py"} <= named
    missing = sorted(n for n in named if not (ROOT / n).is_file())
    assert not missing, f"named but missing: {missing}"
    cited = re.findall(r"\b(\d{4}-\d{2}-\d{2}-[a-z0-9]+(?:-\d+)?/[\w./-]*\w)", text)
    cited += re.findall(r"`(\d{4}-\d{2}-\d{2}-[a-z0-9]+(?:-\d+)?)[`/]", text)  # whole runs
    assert len(cited) >= 10
    gone = sorted(c for c in cited if not (BENCH / "results" / c).exists())
    assert not gone, f"RESULTS.md cites raw files that are not in results/: {gone}"


def test_results_hold_one_dated_folder_per_run() -> None:
    """results/ holds only run folders named <date>-<device>[-N], each with a run.json whose
    date, device and torch match it and which says what made every file in the folder."""
    runner = _bench("run")
    runs = sorted((BENCH / "results").iterdir())
    assert runs
    for run in runs:
        m = runner.RUN_DIR.match(run.name)
        assert run.is_dir() and m, f"results/{run.name} is not a dated run folder"
        record = json.loads((run / "run.json").read_text())
        assert record["date"] == m.group(1) and record["torch"], run.name
        assert runner.device_slug(record) == m.group(2), run.name
        files = {str(p.relative_to(run)) for p in run.rglob("*") if p.is_file()} - {"run.json"}
        assert files and files <= set(record["files"]), (
            f"{run.name}: {files - set(record['files'])}"
        )


def test_memory_cost_runs_its_smoke_mode_on_the_cpu(tmp_path: Path) -> None:
    """memory_cost.py --smoke measures the readers, a region and the training step through the
    fake GPU's allocator, and writes the figures."""
    env = {**os.environ, "CUDATIMER_BENCH_N": "1"}
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "memory_cost.py"), "--smoke", "--rounds", "2",
         "--calls", "20", "--events", "200", "--out", str(tmp_path / "m.json")],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    doc = json.loads((tmp_path / "m.json").read_text())
    assert doc["readers"]["history_read_us_per_event"] > 0
    assert doc["region"]["memory_us_per_region"] > 0
    assert doc["region"]["skipped_us_per_region"] > 0  # a call in an episode not measured
    train = doc["train"]
    assert train["rows_with_memory"] == 2 * train["modules"]  # forward + backward
    assert train["memory_every"] >= 1 and train["memory_all_over_timed_median"] > 0
    # steps + 1 = 2 steps: the first measured, the second not (memory_every > 1)
    assert (train["measured_calls_per_row"], train["calls_per_row"]) == (1, 2)
    assert "memory / timed" in out.stdout


def test_flops_cost_runs_its_smoke_mode_on_the_cpu(tmp_path: Path) -> None:
    """flops_cost.py --smoke counts a tiny GPT-2 step (within 2% of 6ND + 12Lbs^2d), times
    plain / timed / flops rounds, and writes the figures and the per-layer table."""
    needs("transformers")
    env = {**os.environ, "CUDATIMER_BENCH_N": "1"}
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "flops_cost.py"), "--smoke",
         "--out", str(tmp_path / "f.json"), "--table", str(tmp_path / "f.md")],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    doc = json.loads((tmp_path / "f.json").read_text())
    assert abs(doc["total"]["counted_over_analytic"] - 1.0) < 0.02
    assert doc["train"]["flops_over_timed_median"] > 0 and doc["signature_us"] > 0
    assert doc["sums"]["children_over_parent_max"] <= 1e-9
    table = (tmp_path / "f.md").read_text()
    assert "| GPT2LMHeadModel/transformer/h.0/attn |" in table
    assert "flops / timed" in out.stdout and "one-time counting cost" in out.stdout
