"""Benchmark cudatimer against the timers people use today, on real models.

    python benchmarks/run.py --out results/            # the full suite (~5 min on an H200)
    python benchmarks/run.py --smoke --out /tmp/smoke  # tiny sizes, CPU is fine, seconds

Writes results.md (tables), results.json (every raw number) and overhead.png into --out and
prints progress and the tables. A timer that fails on a workload is recorded and the suite
goes on; timers that cannot run here (no CUDA, a package missing) are listed as skipped.
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _measure
import _report
import _timers
import _workloads
import torch
from _measure import WorkloadRun, error_text
from _timers import BY_KEY, TIMERS, TimerAdapter, TimerSpec

ROOT = Path(__file__).resolve().parent.parent
CHECKS = ("syncs", "memory", "report", "accuracy")
_RECORD_NOTHING = ("cudatimer-nvtx", "cudatimer-off")  # by design: no samples to count

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
        help="seconds after which a competitor's memory test stops early (4; cudatimer: none)",
    )
    p.add_argument(
        "--report-samples", type=int, default=None, help="pending samples before a report (1e5)"
    )
    p.add_argument(
        "--time-limit-s",
        type=float,
        default=None,
        help="wall-clock budget (360; 0: none): workloads share 60%% of it and stop adding "
        "rounds past their share (3 at least); checks not started by then are skipped",
    )
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    p.add_argument("--list", action="store_true", help="list workloads and timers, then exit")
    args = p.parse_args(argv)
    all_keys = tuple(s.key for s in TIMERS)
    try:
        args.workload_list = _csv(args.workloads, _workloads.WORKLOADS, "workload")
        args.timer_list = _csv(args.timers, all_keys, "timer")
        args.check_list = _csv(args.checks, CHECKS, "check")
    except argparse.ArgumentTypeError as exc:
        p.error(str(exc))
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
    """Runs the phases and rewrites the outputs after each, so a crash keeps what was done."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
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
        self.meta = _meta(args, self.device)
        args.out.mkdir(parents=True, exist_ok=True)

    # -- outputs --------------------------------------------------------------------------------
    def write(self) -> str:
        self.meta["seconds"] = time.perf_counter() - _T0
        descriptions = {s.key: s.description for s in self.specs}
        md = _report.render_markdown(self.meta, self.runs, descriptions, self.checks, self.notes)
        (self.args.out / "results.md").write_text(md)
        data = _report.to_json(self.meta, self.runs, descriptions, self.checks, self.notes)
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
        if "proton" in self.args.timer_list and "proton" not in self.skips:
            log("probing Proton next to torch.profiler in a child process")
            reason = _timers.proton_probe()
            if reason is not None:
                self.skips["proton"] = reason
                self.notes.append(f"proton skipped: {reason}")
            log(f"  proton: {'ok' if reason is None else reason}")
        for key, why in self.skips.items():
            log(f"skip {key}: {why}")

    def _limit(self) -> float | None:
        limit = self.args.time_limit_s
        if limit is None:
            limit = 0.0 if self.args.smoke else 360.0
        return limit if limit > 0 else None

    def _over_time(self) -> bool:
        limit = self._limit()
        return limit is not None and time.perf_counter() - _T0 > limit

    def workloads(self) -> None:
        names = list(self.args.workload_list)
        limit = self._limit()
        for i, name in enumerate(names):
            deadline = None
            if limit is not None:
                # An equal share of what is left of the workloads' 60% for each one to come.
                left = 0.6 * limit - (time.perf_counter() - _T0)
                deadline = time.perf_counter() + max(0.0, left) / (len(names) - i)
            log(f"workload {name}: building")
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
                if self.args.iters is not None:
                    wl.iters = self.args.iters
                wl.regions_per_iter = _measure.count_regions(wl)
                for _ in range(2):  # allocator, cuBLAS/cuDNN autotuning, clocks
                    wl.step()
                _measure.sync()
                log(
                    f"  {wl.regions_per_iter} regions/iter, {wl.rounds} rounds x "
                    f"{len(self.specs)} timers x ({wl.warmup}+{wl.iters}) iterations"
                )
                run = _measure.run_interleaved(
                    wl, self.specs, self.build_adapter, self.skips, log, deadline=deadline
                )
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

    def _each_timer(
        self,
        check: str,
        fn: Callable[[TimerSpec, TimerAdapter], dict[str, Any]],
        exclude: Callable[[TimerSpec], str | None] = lambda s: None,
    ) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for spec in self.specs:
            why = self.skips.get(spec.key) or spec.no_checks or exclude(spec)
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
        cap = self.args.mem_cap_s or (2.0 if self.args.smoke else 4.0)
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
            f"timers: {', '.join(s.key for s in self.specs)}"
        )
        self.prepare()
        self.workloads()
        steps = {
            "syncs": self.check_syncs,
            "memory": self.check_memory,
            "report": self.check_report,
            "accuracy": self.check_accuracy,
        }
        gc.collect()
        gc.freeze()  # per-timer gc.collect() calls below then cost microseconds, not ~0.1 s
        # Memory last: the competitors that hold every sample are the likeliest to fail.
        for check in ("syncs", "accuracy", "report", "memory"):
            if check not in self.args.check_list:
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
        from _chart import plot

        why = plot(self.runs, self.args.out / "overhead.png")
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
    print()
    print(md)
    log(f"wrote {args.out / 'results.md'}, results.json, overhead.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
