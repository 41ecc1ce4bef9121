"""The benchmarks' one runner: the standing suites by feature, each run into a dated folder.

    python3 benchmarks/run.py --list                  # the suites: area, needs, what each measures
    python3 benchmarks/run.py all                     # every suite this machine can run, full size
    python3 benchmarks/run.py all --smoke             # the same at smoke size (seconds to minutes)
    python3 benchmarks/run.py eager compile --out DIR # some suites, into one folder
    python3 benchmarks/run.py all --dry-run           # the commands, not run

A suite is a script of this folder run with its standard arguments (those that made the
figures of RESULTS.md); ``--list`` prints them. Each suite's output goes to ``OUT/<suite>.txt``
and its figures, where it writes any, beside it (``OUT/<suite>.json``, ``OUT/compare/``).
``OUT`` defaults to ``benchmarks/results/<date>-<device>/`` (``-2``, ``-3`` for the day's later
runs on that device; with ``--smoke``, a new temporary folder). ``OUT/run.json`` records the
date, device, torch, Python, the recorder core, the commit, and each suite's commands, exit
status, seconds and files. A suite whose needs this machine lacks (CUDA, two GPUs, Nsight
Systems) is recorded as skipped, with the reason.

Every script also runs on its own, with any of its arguments (``python3 benchmarks/<script>
--help``); the runner only fixes which arguments a recorded run uses.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
#: What a suite may need from the machine (``needs``), and how each is checked.
NEEDS = ("cuda", "2 gpus", "nsys")
#: A results folder: its date, its device ("h200", "h200x2", "cpu") and the day's run number.
RUN_DIR = re.compile(r"^(\d{4}-\d{2}-\d{2})-([a-z0-9]+)(?:-(\d+))?$")

#: A command line, split as a shell would; ``{py}`` is this Python, ``{out}`` the run's
#: folder, ``{tmp}`` a scratch folder of the suite's (large files that are no figures), ``{pin}``
#: a CPU core to pin to (the last this process may use).
Command = str

# torch.profiler's Kineto writes two "USDT:" lines to stderr for every profiling session (a
# level above its errors), 22 lines in a smoke run among the suite's own output. Kineto reads
# the level when a session starts; 6 is past USDT (5). A failed profiler still shows: the sync
# count check then reports the missing events itself. A level the caller set is kept.
os.environ.setdefault("KINETO_LOG_LEVEL", "6")


@dataclasses.dataclass(frozen=True)
class Suite:
    """One standing suite: its commands at full size (the figures of RESULTS.md) and at smoke
    size, what each needs of the machine, and its section of RESULTS.md."""

    name: str
    area: str
    what: str
    full: tuple[Command, ...]
    smoke: tuple[Command, ...]
    needs: tuple[str, ...] = ()  # of NEEDS, for the full commands
    smoke_needs: tuple[str, ...] = ()
    smoke_env: tuple[tuple[str, str], ...] = ()

    def scripts(self) -> list[str]:
        """The benchmark scripts its commands run (paths from the project root)."""
        words = [w for cmd in (*self.full, *self.smoke) for w in shlex.split(cmd)]
        return sorted({w for w in words if w.startswith("benchmarks/")})


_NSYS = "nsys profile -t cuda,nvtx -s none --cpuctxsw=none -f true"
_LIGHTNING = "none,cudatimer,lightning-simple,lightning-pytorch,lightning-cudatimer"
_TORCHRUN = "{py} -m torch.distributed.run --nproc-per-node 2 benchmarks/dist_check.py"

#: The standing suites, in RESULTS.md's reading order. A new suite is one more entry: its
#: script in benchmarks/, its standard and its smoke commands.
SUITES: tuple[Suite, ...] = (
    Suite(
        "hotpath",
        "E",
        "the hot path per region against two bare event records, paired rounds with intervals "
        "(the launch-bound and the compute-bound loop)",
        full=(
            "{py} benchmarks/hotpath.py --rounds 400 --iters 3 --pin {pin}",
            "{py} benchmarks/hotpath.py --workload compute --rounds 200 --iters 1 --pin {pin}",
        ),
        smoke=("{py} benchmarks/hotpath.py --rounds 3 --iters 1",),
        needs=("cuda",),
    ),
    Suite(
        "eager",
        "E",
        "eager-mode targets: the launch loop against torch and raw event floors, the GPT-2 "
        "decode with instrument() and its floors, memory over 10^6 regions, the Python core",
        full=("{py} benchmarks/eager_targets.py --out {out}",),
        smoke=("{py} benchmarks/eager_targets.py --smoke --out {out}",),
        needs=("cuda",),
    ),
    Suite(
        "gate",
        "Q",
        "the per-region performance gate: A/A false alarms and 5% / 10% slowdowns caught over "
        "40 pairs of runs, and the comparison's own time",
        full=("{py} benchmarks/gate.py --out {out}/gate_cpu.json",),
        smoke=("{py} benchmarks/gate.py --smoke",),
    ),
    Suite(
        "compare",
        "E",
        "cudatimer against the timers in use today on four workloads, with the per-timer "
        "checks (syncs, memory, report time, accuracy, resolution)",
        full=("{py} benchmarks/compare.py --out {out}/compare",),
        smoke=("{py} benchmarks/compare.py --smoke --out {out}/compare",),
        needs=("cuda",),
    ),
    Suite(
        "disabled",
        "E",
        "a decorated function and a region under CUDATIMER_DISABLE and disable(), per call",
        full=("{py} benchmarks/disabled_cost.py",),
        smoke=("{py} benchmarks/disabled_cost.py",),
        smoke_env=(("CUDATIMER_BENCH_N", "2000"),),
    ),
    Suite(
        "syncs",
        "E",
        "sync detection's cost on the launch-bound loop (trace and debug-mode sources)",
        full=("{py} benchmarks/sync_overhead.py",),
        smoke=("{py} benchmarks/sync_overhead.py --processes 1 --rounds 2",),
        needs=("cuda",),
        smoke_needs=("cuda",),
    ),
    Suite(
        "compile",
        "C",
        "the compiled GPT-2-small step with every module timed (forward, and backward marks), "
        "and one region's host cost inside compiled code",
        full=("{py} benchmarks/compile_targets.py --rounds 12 --json {out}/compile.json",),
        smoke=(
            "{py} benchmarks/compile_targets.py --smoke --rounds 2 --steps 1"
            " --json {out}/compile.json",
        ),
        needs=("cuda",),
    ),
    Suite(
        "floors",
        "C",
        "the mechanism's own cost beside cudatimer's: compiled marks and backward hooks that "
        "do nothing, or record one event",
        full=("{py} benchmarks/floors.py --rounds 24 --json {out}/floors.json",),
        smoke=("{py} benchmarks/floors.py --smoke --json {out}/floors.json",),
        needs=("cuda",),
    ),
    Suite(
        "graphs",
        "G",
        "regions inside CUDA graphs: GPU time per timestamp, the decode graph, accuracy, "
        "10^5 replays without a report",
        full=("{py} benchmarks/graph_targets.py --json {out}/graphs.json",),
        smoke=("{py} benchmarks/graph_targets.py --smoke --json {out}/graphs.json",),
        needs=("cuda",),
        smoke_needs=("cuda",),
    ),
    Suite(
        "backward",
        "B",
        "backward rows: host time per backward row against per forward row, the GPT-2 step "
        "ratios, coverage and the growth over 1000 steps (GPU); the same per row on the CPU",
        full=(
            "{py} benchmarks/backward_cost.py --device cuda --rounds 9 --steps 1000 "
            "--out {out}/backward.json",
        ),
        smoke=("{py} benchmarks/backward_cost.py --smoke --out {out}/backward.json",),
        needs=("cuda",),
    ),
    Suite(
        "sinks",
        "S",
        "per-step sinks (StepFeed, the TensorBoard adapter) on the GPT-2-small step",
        full=("{py} benchmarks/sink_overhead.py --out {out}/sinks.json",),
        smoke=("{py} benchmarks/sink_overhead.py --smoke --out {out}/sinks.json",),
        needs=("cuda",),
    ),
    Suite(
        "lightning",
        "S",
        "the Lightning profiler per action, beside Lightning's own profilers",
        full=(
            "{py} benchmarks/compare.py --workloads launch,gpt2 --timers "
            + _LIGHTNING
            + " --checks none --rounds 7 --out {out}/lightning",
        ),
        smoke=(
            "{py} benchmarks/compare.py --smoke --workloads launch,gpt2 --timers "
            + _LIGHTNING
            + " --checks none --out {out}/lightning",
        ),
        needs=("cuda",),
    ),
    Suite(
        "html",
        "H",
        "the HTML report of a 10^4-step run of 200 regions: page size and render time",
        full=("{py} benchmarks/html_report.py --repeat 5",),
        smoke=("{py} benchmarks/html_report.py --steps 30 --regions 12 --repeat 1",),
    ),
    Suite(
        "nsight",
        "N",
        "cudatimer's GPU times against Nsight Systems' projection of its NVTX ranges (eager, "
        "and a region inside compiled code)",
        full=(
            _NSYS + " -o {tmp}/eager {py} benchmarks/nsys_check.py --workload"
            " --summary {out}/nsight_eager.json",
            "{py} benchmarks/nsys_check.py --check {tmp}/eager.nsys-rep"
            " --summary {out}/nsight_eager.json",
            _NSYS + " -o {tmp}/compiled {py} benchmarks/nsys_check.py --workload --compiled"
            " --summary {out}/nsight_compiled.json",
            "{py} benchmarks/nsys_check.py --check {tmp}/compiled.nsys-rep"
            " --summary {out}/nsight_compiled.json",
        ),
        smoke=("{py} benchmarks/nsys_check.py --selftest",),
        needs=("cuda", "nsys"),
    ),
    Suite(
        "distributed",
        "D",
        "cross-rank reports on a real two-rank job (NCCL on two GPUs; gloo on a CPU)",
        full=(_TORCHRUN,),
        smoke=(_TORCHRUN,),
        needs=("2 gpus",),
    ),
)
BY_NAME = {s.name: s for s in SUITES}


def _machine(smoke: bool) -> dict[str, Any]:
    """This machine as the suites see it, read in a child process (the runner imports
    neither torch nor cudatimer, so it holds no CUDA context while the suites run)."""
    probe = (
        "import json, platform, torch, cudatimer\n"
        "n = torch.cuda.device_count() if torch.cuda.is_available() else 0\n"
        "print(json.dumps({'gpus': n, 'device': torch.cuda.get_device_name(0) if n else "
        "'cpu (' + (platform.processor() or platform.machine()) + ')', 'torch': torch.__version__,"
        " 'cuda': torch.version.cuda, 'python': platform.python_version(),"
        " 'core': 'C' if cudatimer.compiled() else 'Python'}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, env=_env(())
    )
    if done.returncode != 0:
        raise SystemExit(f"run.py: could not read this machine's torch:\n{done.stderr[-2000:]}")
    info: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    info["nsys"] = shutil.which("nsys") is not None
    info["smoke"] = smoke
    return info


def _env(extra: tuple[tuple[str, str], ...]) -> dict[str, str]:
    """The suites import this checkout's cudatimer, not an installed one."""
    path = os.environ.get("PYTHONPATH", "")
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), path) if p),
        **dict(extra),
    }


def missing(needs: tuple[str, ...], machine: dict[str, Any]) -> str | None:
    """Why this machine cannot run a suite that needs ``needs`` (None: it can)."""
    if "2 gpus" in needs and machine["gpus"] < 2:
        return f"needs two GPUs (this machine has {machine['gpus']})"
    if "cuda" in needs and machine["gpus"] < 1:
        return "needs CUDA (this machine has no GPU)"
    if "nsys" in needs and not machine["nsys"]:
        return "needs Nsight Systems (nsys is not on PATH)"
    return None


def device_slug(machine: dict[str, Any]) -> str:
    """``h200`` for one NVIDIA H200, ``h200x2`` for two, ``cpu`` without a GPU."""
    if machine["gpus"] == 0:
        return "cpu"
    name = re.sub(r"[^a-z0-9]+", "", machine["device"].lower().replace("nvidia", ""))
    return f"{name or 'gpu'}x{machine['gpus']}" if machine["gpus"] > 1 else name or "gpu"


def next_run_dir(results: Path, date: str, slug: str) -> Path:
    """``results/<date>-<slug>`` for the day's first run on that device, then ``-2``, ``-3``."""
    first = results / f"{date}-{slug}"
    if not first.exists():
        return first
    n = 2
    while (results / f"{first.name}-{n}").exists():
        n += 1
    return results / f"{first.name}-{n}"


def _pin() -> str:
    return str(max(os.sched_getaffinity(0)))


def expand(cmd: Command, out: Path, tmp: Path) -> list[str]:
    """``cmd``'s argv with its placeholders filled in."""
    values = {"{py}": sys.executable, "{out}": str(out), "{tmp}": str(tmp), "{pin}": _pin()}
    expanded = []
    for arg in shlex.split(cmd):
        for key, value in values.items():
            arg = arg.replace(key, value)
        expanded.append(arg)
    return expanded


def _files(out: Path) -> set[str]:
    return {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()} - {"run.json"}


def run_suite(suite: Suite, out: Path, smoke: bool, record: dict[str, Any]) -> bool:
    """Runs one suite's commands in turn into ``out/<name>.txt``; True when all exited 0."""
    commands = suite.smoke if smoke else suite.full
    env = _env(suite.smoke_env if smoke else ())
    log = out / f"{suite.name}.txt"
    before = _files(out)
    entry: dict[str, Any] = {"commands": [], "seconds": 0.0}
    ok = True
    t0 = time.perf_counter()
    with log.open("w") as f, tempfile.TemporaryDirectory(prefix=f"{suite.name}-") as tmp:
        for cmd in commands:
            argv = expand(cmd, out, Path(tmp))
            shown = shlex.join(a.replace(sys.executable, "python3") for a in argv)
            f.write(f"$ {shown}\n")
            f.flush()
            rc = subprocess.run(
                argv, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT
            ).returncode
            entry["commands"].append({"argv": shown, "rc": rc})
            f.write(f"[exit {rc}]\n\n")
            f.flush()
            if rc != 0:
                ok = False
                break
    entry["seconds"] = round(time.perf_counter() - t0, 1)
    entry["files"] = sorted(_files(out) - before)
    record["suites"][suite.name] = entry
    for name in entry["files"]:
        record["files"][name] = f"{suite.name}: {entry['commands'][0]['argv']}"
    return ok


def _commit() -> dict[str, Any]:
    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""

    return {"commit": git("rev-parse", "HEAD") or None, "dirty": bool(git("status", "--porcelain"))}


def print_list() -> None:
    print("suite, its RESULTS.md section, what it needs, what it measures, its full-size commands")
    print("({out}: the run's folder; {tmp}: a scratch folder; {pin}: a CPU core)\n")
    width = max(len(s.name) for s in SUITES)
    for s in SUITES:
        needs = ", ".join(s.needs) or "-"
        print(f"{s.name:{width}}  {s.area}  needs: {needs}")
        for line in textwrap.wrap(s.what, 90):
            print(f"{'':{width}}     {line}")
        for cmd in s.full:
            print(f"{'':{width}}     $ {cmd.replace('{py}', 'python3')}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("suites", nargs="*", help=f"'all' or suite names: {', '.join(BY_NAME)}")
    p.add_argument("--list", action="store_true", help="the suites and their commands, then exit")
    p.add_argument("--smoke", action="store_true", help="each suite at its smoke size")
    p.add_argument("--out", type=Path, default=None, help="the run's folder (default: dated)")
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = p.parse_args(argv)
    if args.list:
        return args
    if not args.suites:
        p.error("name the suites to run ('all', or see --list)")
    names = list(BY_NAME) if args.suites == ["all"] else args.suites
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        p.error(f"unknown suite: {', '.join(unknown)} (choose from all, {', '.join(BY_NAME)})")
    args.chosen = [BY_NAME[n] for n in dict.fromkeys(names)]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list:
        print_list()
        return 0
    machine = _machine(args.smoke)
    date = datetime.date.today().isoformat()
    commit = _commit()  # before the run's folder exists: a run inside results/ is no change
    if args.out is not None:
        out: Path = args.out
    elif args.smoke and args.dry_run:
        out = Path(tempfile.gettempdir()) / "cudatimer-smoke-XXXX"
    elif args.smoke:  # smoke sizes give no figures: nothing for results/
        out = Path(tempfile.mkdtemp(prefix="cudatimer-smoke-"))
    else:
        out = next_run_dir(RESULTS, date, device_slug(machine))
    plan = []
    for suite in args.chosen:
        why = missing(suite.smoke_needs if args.smoke else suite.needs, machine)
        plan.append((suite, why))
    if args.dry_run:
        for suite, why in plan:
            if why is not None:
                print(f"# {suite.name}: skipped, {why}")
                continue
            env = "".join(f"{k}={v} " for k, v in (suite.smoke_env if args.smoke else ()))
            for cmd in suite.smoke if args.smoke else suite.full:
                argv = expand(cmd, out, Path(tempfile.gettempdir()) / f"{suite.name}-XXXX")
                print(env + shlex.join(argv).replace(sys.executable, "python3"))
        return 0
    out.mkdir(parents=True, exist_ok=True)
    record: dict[str, Any] = {"date": date, **machine, **commit, "suites": {}, "files": {}}
    path = out / "run.json"
    failed = []
    for suite, why in plan:
        if why is not None:
            record["suites"][suite.name] = {"skipped": why}
            print(f"[{suite.name}] skipped: {why}", flush=True)
            continue
        print(f"[{suite.name}] running, output in {out / (suite.name + '.txt')}", flush=True)
        ok = run_suite(suite, out, args.smoke, record)
        entry = record["suites"][suite.name]
        print(f"[{suite.name}] {'ok' if ok else 'FAILED'} in {entry['seconds']} s", flush=True)
        if not ok:
            failed.append(suite.name)
            tail = (out / f"{suite.name}.txt").read_text()[-3000:]
            print(tail, file=sys.stderr)
        path.write_text(json.dumps(record, indent=1) + "\n")  # a crash keeps what was done
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {out}" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
