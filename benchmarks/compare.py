"""Benchmark cudatimer against the timers people use today, on real models.

    python benchmarks/compare.py --out OUT                # the full suite (~5 min on an H200)
    python benchmarks/compare.py --smoke --out /tmp/smoke # tiny sizes, CPU is fine, seconds

Writes results.md (tables), results.json (every raw number) and overhead.png into --out and
prints progress and the tables. A timer that fails on a workload is recorded and the suite
goes on; timers that cannot run here (no CUDA, a package missing) are listed as skipped.

Proton is measured in a child process of its own (``compare.py --child proton ...``, started by
the suite): CUPTI takes one subscriber per process, so Proton cannot run where torch.profiler
runs (the torch-profiler timer, the sync count, the accuracy check). The child never uses
torch.profiler and interleaves its own none, floor, cudatimer and proton blocks; its rows are
merged into the tables with ratios against its own none and floor. cudatimer's pure-Python
core (``cudatimer-py``) is measured the same way, in a child started with
``CUDATIMER_PURE_PYTHON=1`` (cudatimer chooses its core once, at import), next to that
process's none and floor. GPU clocks are never locked or changed.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _measure
import _report
import _timers
import _workloads
import torch
from _measure import SeparateProcess, WorkloadRun, error_text
from _timers import BY_KEY, TIMERS, TimerAdapter, TimerSpec

# torch.profiler's Kineto prints two "USDT:" lines a session (see run.py): keep them out.
os.environ.setdefault("KINETO_LOG_LEVEL", "6")

ROOT = Path(__file__).resolve().parent.parent
CHECKS = ("syncs", "memory", "report", "accuracy", "resolution")
_RECORD_NOTHING = ("cudatimer-nvtx", "cudatimer-off")  # by design: no samples to count
#: Timers measured in a process of their own (spec.own_process says why).
CHILD_KINDS = tuple(s.key for s in TIMERS if s.own_process)
#: What a child process measures besides its own timer (``spec.peers``: a baseline, the floor
#: and cudatimer by default), so its rows read against that process's own numbers.
#: The per-timer checks a child runs for its timer (the sync count needs torch.profiler).
CHILD_CHECKS = ("report", "memory")
#: Shares of --time-limit-s: the main process's workloads stop adding rounds past the first,
#: a child process gets the second (its own workloads 80% of it), the checks get the rest.
WORKLOAD_SHARE, CHILD_SHARE, CHILD_WORKLOAD_SHARE = 0.45, 0.2, 0.8
#: The resolution check: regions on the launch workload, then one summary().
RESOLUTION_KEYS = ("none", "floor", "cudatimer")

_T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - _T0:7.1f}s] {msg}", flush=True)


def _csv(value: str, allowed: tuple[str, ...], what: str) -> list[str]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    if items == ["all"]:
        return list(allowed)
    if items == ["none"]:
        return []
    bad = [v for v in items if v not in allowed]
    if bad:
        raise argparse.ArgumentTypeError(
            f"unknown {what}: {', '.join(bad)} (choose from {', '.join(allowed)})"
        )
    return items


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("results"), help="output folder")
    p.add_argument(
        "--smoke", action="store_true", help="tiny sizes, 2 rounds: runs on a CPU in seconds"
    )
    p.add_argument(
        "--workloads",
        default=",".join(_workloads.WORKLOADS),
        help=f"comma list or 'all' ({', '.join(_workloads.WORKLOADS)})",
    )
    default_timers = ",".join(s.key for s in TIMERS if s.default)
    p.add_argument(
        "--timers",
        default=default_timers,
        help=f"comma list or 'all' (default: {default_timers}; also: "
        + ", ".join(s.key for s in TIMERS if not s.default)
        + ")",
    )
    p.add_argument("--rounds", type=int, default=None, help="rounds per workload (override)")
    p.add_argument("--iters", type=int, default=None, help="timed iterations per block (override)")
    p.add_argument(
        "--checks",
        default=",".join(CHECKS),
        help=f"per-timer checks, comma list, 'all' or 'none' ({', '.join(CHECKS)})",
    )
    p.add_argument("--mem-regions", type=int, default=None, help="regions in the memory test (1e6)")
    p.add_argument(
        "--mem-cap-s",
        type=float,
        default=None,
        help="seconds after which a competitor's memory test stops early (2.5; cudatimer: none)",
    )
    p.add_argument(
        "--report-samples", type=int, default=None, help="pending samples before a report (1e5)"
    )
    p.add_argument(
        "--time-limit-s",
        type=float,
        default=None,
        help="wall-clock budget (300; 0: none): the workloads stop adding rounds past 45%% "
        "of it (3 rounds at least), a separate process (Proton) gets 20%%, the checks the "
        "rest; checks not started by then are skipped",
    )
    p.add_argument(
        "--resolution-regions",
        type=int,
        default=None,
        help="regions before the summary() in the resolution check (20000)",
    )
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    p.add_argument(
        "--pin-cpu",
        type=int,
        default=None,
        help="pin the process to this CPU core (fewer migrations: the launch-bound loop's "
        "block-to-block spread drops; the profiler-based timers' own threads then share it)",
    )
    p.add_argument("--list", action="store_true", help="list workloads and timers, then exit")
    p.add_argument(
        "--child",
        choices=CHILD_KINDS,
        default=None,
        help="internal: measure this timer in this process with its peers ("
        + "; ".join(f"{k}: {', '.join(BY_KEY[k].peers)}" for k in CHILD_KINDS)
        + "); writes <out>/<timer>_process.json (the suite starts it)",
    )
    args = p.parse_args(argv)
    if args.pin_cpu is not None:
        os.sched_setaffinity(0, {args.pin_cpu})
    all_keys = tuple(s.key for s in TIMERS)
    try:
        args.workload_list = _csv(args.workloads, _workloads.WORKLOADS, "workload")
        args.timer_list = _csv(args.timers, all_keys, "timer")
        args.check_list = _csv(args.checks, CHECKS, "check")
    except argparse.ArgumentTypeError as exc:
        p.error(str(exc))
    if args.child is not None:
        args.timer_list = [*BY_KEY[args.child].peers, args.child]
        args.check_list = [c for c in args.check_list if c in CHILD_CHECKS]
    if "none" not in args.timer_list:
        args.timer_list.insert(0, "none")  # every ratio is against it
    return args


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _meta(args: argparse.Namespace, device: str) -> dict[str, Any]:
    try:
        commit = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        commit = ""
    meta: dict[str, Any] = {
        "argv": sys.argv[1:],
        "smoke": args.smoke,
        "device": device,
        "device_name": torch.cuda.get_device_name()
        if device == "cuda"
        else platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "git_commit": commit or None,
        "TEARDOWN_CUPTI": os.environ.get("TEARDOWN_CUPTI"),
        "pinned_cpu": args.pin_cpu,
        "versions": {
            d: _version(d)
            for d in (
                "cudatimer",
                "nvtx",
                "lightning",
                "pytorch-lightning",
                "torchtnt",
                "triton",
                "torchvision",
                "tabulate",
                "matplotlib",
            )
        },
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    return meta


class Suite:
    """Runs the phases and rewrites the outputs after each, so a crash keeps what was done.

    With ``args.child`` set it is the child process of one timer (Proton): its peers and that
    timer on every workload, that timer's report and memory checks, and a JSON file for the
    parent instead of the tables."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.child: str | None = args.child
        want_cuda = args.device in ("auto", "cuda")
        if args.device == "cuda" and not torch.cuda.is_available():
            raise SystemExit("--device cuda: CUDA is not available here")
        self.cuda = want_cuda and torch.cuda.is_available()
        self.device = "cuda" if self.cuda else "cpu"
        self.specs = [BY_KEY[k] for k in args.timer_list]
        self.skips: dict[str, str] = {}
        self.runs: list[WorkloadRun] = []
        self.checks: dict[str, dict[str, Any]] = {}
        self.notes: list[str] = []
        self.separate: list[SeparateProcess] = []
        self.check_error: str | None = None  # the child's quick check of its timer
        self.meta = _meta(args, self.device)
        args.out.mkdir(parents=True, exist_ok=True)

    # -- outputs --------------------------------------------------------------------------------
    def child_json(self) -> Path:
        out: Path = self.args.out
        return out / f"{self.child}_process.json"

    def write(self) -> str:
        self.meta["seconds"] = time.perf_counter() - _T0
        if self.child is not None:
            data = {
                "process": self.child,
                "check_error": self.check_error,
                "meta": self.meta,
                "runs": [dataclasses.asdict(r) for r in self.runs],
                "checks": self.checks,
                "notes": self.notes,
            }
            self.child_json().write_text(json.dumps(_report.clean(data), indent=1))
            return ""
        descriptions = {s.key: s.description for s in self.specs}
        md = _report.render_markdown(
            self.meta, self.runs, descriptions, self.checks, self.notes, self.separate
        )
        (self.args.out / "results.md").write_text(md)
        data = _report.to_json(
            self.meta, self.runs, descriptions, self.checks, self.notes, self.separate
        )
        (self.args.out / "results.json").write_text(json.dumps(data, indent=1))
        return md

    # -- phases ---------------------------------------------------------------------------------
    def build_adapter(self, spec: TimerSpec) -> TimerAdapter:
        return _timers.make(spec, self.cuda)

    def prepare(self) -> None:
        torch.manual_seed(0)
        if not self.cuda:
            # Tiny CPU ops gain nothing from intra-op threads, and on a shared machine a second
            # thread waiting for a busy core turned 0.06 ms iterations into 64 ms ones.
            torch.set_num_threads(1)
        if self.cuda:
            torch.backends.cudnn.benchmark = True  # ResNet: tune convolutions once, in warm-up
        for spec in self.specs:
            if spec.needs_cuda and not self.cuda:
                self.skips[spec.key] = "needs CUDA (this run has no GPU)"
            elif spec.own_process and self.child is None:
                self.skips[spec.key] = "measured in a separate process"
        check = BY_KEY[self.child].quick_check if self.child is not None else None
        if self.child is not None and check is not None and self.child not in self.skips:
            log(f"quick check: a {self.child} session in this process")
            self.check_error = check(self.device)
            if self.check_error is not None:
                self.skips[self.child] = f"failed its quick check: {self.check_error}"
                self.notes.append(f"{self.child} failed its quick check: {self.check_error}")
            log(f"  {self.child}: {'ok' if self.check_error is None else self.check_error}")
        for key, why in self.skips.items():
            log(f"skip {key}: {why}")

    def _limit(self) -> float | None:
        limit = self.args.time_limit_s
        if limit is None:
            limit = 0.0 if self.args.smoke else 300.0
        return limit if limit > 0 else None

    def _over_time(self) -> bool:
        limit = self._limit()
        return limit is not None and time.perf_counter() - _T0 > limit

    def workloads(self) -> None:
        if self.child is not None and self.child in self.skips:
            return  # its timer cannot run: the peers alone would measure nothing new
        names = list(self.args.workload_list)
        limit = self._limit()
        share = CHILD_WORKLOAD_SHARE if self.child is not None else WORKLOAD_SHARE
        for i, name in enumerate(names):
            deadline = None
            if limit is not None:
                # An equal share of what is left of the workloads' share for each one to come.
                left = share * limit - (time.perf_counter() - _T0)
                deadline = time.perf_counter() + max(0.0, left) / (len(names) - i)
            log(f"workload {name}: building")
            if self.cuda:
                torch.cuda.reset_peak_memory_stats()
            try:
                wl = _workloads.build(name, self.device, self.args.smoke)
            except _workloads.SkipWorkload as exc:
                self.notes.append(f"workload {name} skipped: {exc}")
                log(f"  skipped: {exc}")
                continue
            except Exception as exc:
                self.notes.append(f"workload {name} failed to build: {error_text(exc)}")
                log(f"  failed to build: {error_text(exc)}")
                continue
            try:
                if self.args.rounds is not None:
                    wl.rounds = self.args.rounds
                wl.regions_per_iter = _measure.count_regions(wl)
                for _ in range(2):  # allocator, cuBLAS/cuDNN autotuning, clocks
                    wl.step()
                _measure.sync()
                step_ms = None
                if self.args.iters is not None:
                    wl.iters = self.args.iters
                elif wl.block_ms > 0:
                    step_ms = _measure.calibrate_iters(wl)
                    log(
                        f"  unwrapped step {step_ms:.2f} ms: {wl.iters} timed iterations per "
                        f"block (~{wl.block_ms:.0f} ms wanted)"
                    )
                log(
                    f"  {wl.regions_per_iter} regions/iter, {wl.rounds} rounds x "
                    f"{len(self.specs)} timers x ({wl.warmup}+{wl.iters}) iterations"
                )
                run = _measure.run_interleaved(
                    wl, self.specs, self.build_adapter, self.skips, log, deadline=deadline
                )
                run.calibrated_step_ms = step_ms
                run.process = self.child or "main"
                if self.cuda:
                    run.peak_mem_gb = torch.cuda.max_memory_allocated() / 1e9
                    log(f"  peak GPU memory allocated: {run.peak_mem_gb:.1f} GB")
                if len(run.rounds) < wl.rounds:
                    self.notes.append(
                        f"{name}: {len(run.rounds)} of {wl.rounds} rounds (time limit)"
                    )
                self.runs.append(run)
                self._check_recorded(run)
            except Exception as exc:
                self.notes.append(f"workload {name} failed: {error_text(exc)}")
                log(f"  failed: {error_text(exc)}")
            finally:
                del wl
                gc.collect()
                if self.cuda:
                    torch.cuda.empty_cache()
            self.write()

    def _check_recorded(self, run: WorkloadRun) -> None:
        """A timer that reports how many regions it recorded must have recorded every one: a
        cheap proof that it was really on (cudatimer's nvtx mode and its off switch record none)."""
        per_block = run.regions_per_iter * (run.warmup + run.iters)
        for key, tr in run.timers.items():
            if tr.status != "ok" or not tr.recorded_known or key in _RECORD_NOTHING:
                continue
            expected = per_block * len(run.rounds)
            if tr.recorded_regions != expected:
                msg = (
                    f"{run.name}/{key} recorded {tr.recorded_regions} regions, expected {expected}"
                )
                self.notes.append(msg)
                log(f"  warning: {msg}")

    # -- the separate processes -----------------------------------------------------------------
    def separate_processes(self) -> None:
        """Run each own-process timer (Proton) in a child process and keep what it measured."""
        for spec in self.specs:
            if not spec.own_process or self.skips.get(spec.key) != "measured in a separate process":
                continue
            sp = self._run_child(spec)
            self.separate.append(sp)
            missing = "its separate process did not measure this workload (see Notes)"
            if sp.error is not None:
                missing = f"failed in its own process: {sp.error}"
                self.skips[spec.key] = missing
                self.notes.append(f"{spec.key}: {missing}")
            for run in self.runs:
                tr = run.timers.get(spec.key)
                if tr is not None and run.name not in sp.runs:
                    tr.reason = missing
            for note in sp.notes:
                self.notes.append(f"{spec.key}'s process: {note}")
            self.write()

    def _child_argv(self, key: str, limit: float | None) -> list[str]:
        a = self.args
        argv = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--child",
            key,
            "--out",
            str(a.out),
            "--workloads",
            ",".join(a.workload_list),
            "--checks",
            ",".join(c for c in a.check_list if c in CHILD_CHECKS) or "none",
            "--device",
            self.device,
            "--time-limit-s",
            str(limit or 0),
        ]
        if a.smoke:
            argv.append("--smoke")
        for flag, value in (
            ("--rounds", a.rounds),
            ("--iters", a.iters),
            ("--mem-regions", a.mem_regions),
            ("--mem-cap-s", a.mem_cap_s),
            ("--report-samples", a.report_samples),
        ):
            if value is not None:
                argv += [flag, str(value)]
        return argv

    def _run_child(self, spec: TimerSpec) -> SeparateProcess:
        limit = self._limit()
        child_limit = None if limit is None else max(30.0, CHILD_SHARE * limit)
        # Import, CUDA start, model builds and a hung CUPTI teardown: generous, but bounded.
        timeout_s = 900.0 if child_limit is None else 1.5 * child_limit + 60.0
        sp = SeparateProcess(key=spec.key, why=spec.own_process or "")
        path = self.args.out / f"{spec.key}_process.json"
        path.unlink(missing_ok=True)
        argv = self._child_argv(spec.key, child_limit)
        log(f"{spec.key}: measuring in a separate process ({spec.own_process})")
        log("  " + " ".join([*(f"{k}={v}" for k, v in spec.env), *argv[1:]]))
        tail: list[str] = []
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, **dict(spec.env)},
        )

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                line = line.rstrip()
                tail.append(line)
                del tail[:-40]
                print(f"    [{spec.key}] {line}", flush=True)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            sp.rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            sp.rc = proc.wait()
            sp.error = f"its process ran past {timeout_s:.0f} s and was killed"
        reader.join(timeout=10)
        sp.seconds = time.perf_counter() - t0
        sp.path = path.name
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            if sp.error is None:
                last = " | ".join(ln for ln in tail[-3:] if ln.strip())
                sp.error = f"its process exited with rc {sp.rc} and no results ({exc}): {last}"
            return sp
        sp.check_error = data.get("check_error")
        sp.runs = {r["name"]: _measure.run_from_dict(r) for r in data.get("runs", [])}
        sp.checks = data.get("checks", {})
        sp.notes = [n for n in data.get("notes", []) if not n.startswith(f"{spec.key} failed")]
        if sp.check_error is not None:
            sp.error = f"its quick check failed: {sp.check_error}"
        elif sp.error is None and sp.rc != 0:
            last = " | ".join(ln for ln in tail[-3:] if ln.strip())
            sp.error = f"its process exited with rc {sp.rc}: {last}"
            if sp.runs:
                sp.error += f" (kept the {len(sp.runs)} workloads it finished)"
        log(
            f"{spec.key}: separate process done in {sp.seconds:.0f} s, rc {sp.rc}, "
            f"{len(sp.runs)} workloads" + (f"; {sp.error}" if sp.error else "")
        )
        return sp

    # -- per-timer checks -----------------------------------------------------------------------
    def _each_timer(
        self,
        check: str,
        fn: Callable[[TimerSpec, TimerAdapter], dict[str, Any]],
        exclude: Callable[[TimerSpec], str | None] = lambda s: None,
    ) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for spec in self.specs:
            if self.child is not None and spec.key != self.child:
                continue  # the main process checks the peers
            if spec.no_checks:
                # A short cell of its own (not "skipped: ..."): e.g. the same recorder again.
                out[spec.key] = {"skipped": spec.no_checks, "same_as": True}
                continue
            why = exclude(spec) or self.skips.get(spec.key)
            if not why and self._over_time():
                why = "time limit reached (--time-limit-s)"
            if why:
                out[spec.key] = {"skipped": why}
                continue
            adapter: TimerAdapter | None = None
            try:
                adapter = self.build_adapter(spec)
                out[spec.key] = fn(spec, adapter)
                log(f"  {check} {spec.key}: {_brief(out[spec.key])}")
            except _timers.SkipTimer as exc:
                out[spec.key] = {"skipped": str(exc)}
            except Exception as exc:
                out[spec.key] = {"error": error_text(exc)}
                log(f"  {check} {spec.key}: error: {error_text(exc)}")
            finally:
                if adapter is not None:
                    try:
                        adapter.close()
                    except Exception as exc:
                        log(f"  {spec.key}: close failed: {error_text(exc)}")
                gc.collect()
        return out

    def check_syncs(self) -> None:
        if not self.cuda:
            self.checks["syncs"] = {s.key: {"skipped": "needs CUDA"} for s in self.specs}
            return
        log("syncs: counting CUDA runtime calls under torch.profiler (launch workload)")
        wl = _workloads.build("launch", self.device, self.args.smoke)
        wl.regions_per_iter = _measure.count_regions(wl)
        iters = 3
        base = _measure.count_runtime_calls(wl, _timers.NoTimer(), iters)
        per = iters * wl.regions_per_iter

        def one(spec: TimerSpec, adapter: TimerAdapter) -> dict[str, Any]:
            c = _measure.count_runtime_calls(wl, adapter, iters)
            diff = {k: c[k] - base[k] for k in c}
            syncs = sum(diff[k] for k in _measure.SYNC_NAMES)
            records = diff["cudaEventRecord"] + diff["cudaEventRecordWithFlags"]
            return {
                "counts": c,
                "baseline": base,
                "iters": iters,
                "regions_per_iter": wl.regions_per_iter,
                "syncs_per_region": syncs / per,
                "queries_per_region": diff["cudaEventQuery"] / per,
                "records_per_region": records / per,
            }

        self.checks["syncs"] = self._each_timer(
            "syncs",
            one,
            lambda s: "a profiler itself (owns CUPTI)" if s.profiler_based else None,
        )

    def check_memory(self) -> None:
        n = self.args.mem_regions or (2_000 if self.args.smoke else 1_000_000)
        # 2.5 s: ~1e5 regions even for the slowest timers, enough to see growth per region.
        cap = self.args.mem_cap_s or (2.0 if self.args.smoke else 2.5)
        log(f"memory: RSS growth after {n:,} regions around a tiny op, no report in between")

        def one(spec: TimerSpec, adapter: TimerAdapter) -> dict[str, Any]:
            # A profiler's stop parses every event it holds (seconds per 1e5): a short cap.
            this_cap = None if spec.full_memory_run else cap
            if spec.profiler_based:
                this_cap = min(cap, 1.5)
            return _measure.memory_growth(adapter, self.device, n, this_cap)

        self.checks["memory"] = self._each_timer("memory", one)

    def check_report(self) -> None:
        n = self.args.report_samples or (1_000 if self.args.smoke else 100_000)
        log(f"report: time to produce a report with {n:,} samples pending")

        def one(spec: TimerSpec, adapter: TimerAdapter) -> dict[str, Any]:
            # torch.profiler's key_averages() costs ~0.1-0.4 ms per event (measured here: 7 s
            # for 2e4 regions on the CPU), and a GPU region is 3-4 events: 1e5 regions would
            # take minutes of the suite's budget. Profilers get 1e4, and the row says so.
            samples = min(n, 10_000) if spec.profiler_based else n
            return _measure.report_time(adapter, self.device, samples)

        self.checks["report"] = self._each_timer("report", one)

    def check_resolution(self) -> None:
        """Added time per region with the deferred resolution counted: N regions on the launch
        workload, synchronize, one summary(); against the unwrapped loop of the same rep."""
        n = self.args.resolution_regions or (480 if self.args.smoke else 20_000)
        reps = 2 if self.args.smoke else 4
        log(f"resolution: {n:,} regions on the launch workload, then summary(), {reps} reps")
        wl = _workloads.build("launch", self.device, self.args.smoke)
        wl.regions_per_iter = _measure.count_regions(wl)
        for _ in range(2):
            wl.step()
        _measure.sync()
        adapters: dict[str, TimerAdapter] = {}
        skipped: dict[str, str] = {}
        for key in RESOLUTION_KEYS:
            if key not in self.args.timer_list:
                continue
            if key in self.skips:
                skipped[key] = self.skips[key]
                continue
            try:
                adapters[key] = self.build_adapter(BY_KEY[key])
            except _timers.SkipTimer as exc:
                skipped[key] = str(exc)
        try:
            result = _measure.resolution_cost(wl, adapters, n, reps, log)
        finally:
            for adapter in adapters.values():
                adapter.close()
        result["skipped"] = skipped
        self.checks["resolution"] = result

    def check_accuracy(self) -> None:
        if not self.cuda:
            self.checks["accuracy"] = {"skipped": "needs CUDA"}
            return
        regions, matmuls = (2, 5) if self.args.smoke else (6, 60)
        log(f"accuracy: {regions} regions of {matmuls} bf16 4096^3 matmuls vs CUPTI")
        try:
            self.checks["accuracy"] = _measure.accuracy_vs_cupti(regions, matmuls, log)
        except Exception as exc:
            self.checks["accuracy"] = {"error": error_text(exc)}
            log(f"  accuracy: error: {error_text(exc)}")

    def run(self) -> str:
        log(
            f"device {self.device} ({self.meta['device_name']}), torch {torch.__version__}, "
            + (f"child process for {self.child}, " if self.child else "")
            + f"timers: {', '.join(s.key for s in self.specs)}"
        )
        self.prepare()
        self.workloads()
        if self.child is None:
            self.separate_processes()
        steps = {
            "syncs": self.check_syncs,
            "memory": self.check_memory,
            "report": self.check_report,
            "accuracy": self.check_accuracy,
            "resolution": self.check_resolution,
        }
        gc.collect()
        gc.freeze()  # per-timer gc.collect() calls below then cost microseconds, not ~0.1 s
        # Memory last: the competitors that hold every sample are the likeliest to fail.
        for check in ("syncs", "resolution", "accuracy", "report", "memory"):
            if check not in self.args.check_list:
                continue
            if self.child is not None and self.child in self.skips:
                continue
            if self._over_time():
                self.checks[check] = {"skipped": "time limit reached (--time-limit-s)"}
                self.notes.append(f"check {check} skipped: time limit reached")
                continue
            try:
                steps[check]()
            except Exception as exc:
                self.checks[check] = {"error": error_text(exc)}
                log(f"{check}: error: {error_text(exc)}")
            self.write()
        gc.unfreeze()
        if self.child is not None:
            return self.write()
        from _chart import plot

        why = plot(self.runs, self.args.out / "overhead.png", self.separate)
        if why is not None:
            self.notes.append(f"no chart: {why}")
        return self.write()


def _brief(d: dict[str, Any]) -> str:
    keys = (
        "syncs_per_region",
        "queries_per_region",
        "records_per_region",
        "regions",
        "bytes_per_region",
        "growth_mb",
        "seconds",
    )
    parts = []
    for k in keys:
        if k in d:
            v = d[k]
            parts.append(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}")
    return " ".join(parts)


def main(argv: list[str] | None = None) -> int:
    if str(ROOT) not in sys.path:
        sys.path.insert(1, str(ROOT))  # the cudatimer in this checkout, without installing it
    # kineto reads this when a profiler session stops: 1 detaches CUPTI (cuptiFinalize), so a
    # stopped torch.profiler leaves no callbacks slowing the timers measured after it. No CUDA
    # graphs here (the case that crashed teardown before CUDA 12.6). An explicit value wins.
    os.environ.setdefault("TEARDOWN_CUPTI", "1")
    args = parse_args(argv)
    if args.list:
        for name in _workloads.WORKLOADS:
            print(f"workload {name:10s} {_workloads.DESCRIPTIONS[name]}")
        for spec in TIMERS:
            flag = "" if spec.default else " (not in the default set)"
            print(f"timer    {spec.key:18s} {spec.description}{flag}")
        return 0
    suite = Suite(args)
    md = suite.run()
    if suite.child is not None:
        log(f"wrote {suite.child_json()}")
        return 0
    print()
    print(md)
    log(f"wrote {args.out / 'results.md'}, results.json, overhead.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
