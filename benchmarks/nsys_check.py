"""Check cudatimer against Nsight Systems on a real GPU.

1. Workload, under nsys (writes cudatimer's summary as JSON)::

     nsys profile -t cuda,nvtx -s none --cpuctxsw=none -o /tmp/r \\
         python3 benchmarks/nsys_check.py --workload --summary /tmp/ct.json

2. Check: every region appears in ``nvtx_sum`` with cudatimer's call count, events-only
   regions do not appear, and regions of >= --min-ms GPU time per call agree with
   ``nvtx_gpu_proj_sum`` within --tol::

     python3 benchmarks/nsys_check.py --check /tmp/r.nsys-rep --summary /tmp/ct.json

   Prints a Markdown table; exits 1 on any failure. ``--check`` also takes the CSV text nsys
   printed (a path ending in .csv). ``--selftest`` runs the parser and the judge on an embedded
   sample (no GPU, no nsys).

Why per call, not total: an event span starts before the first kernel's launch latency
(measured on an H200: a small MLP forward read 0.668 ms by events, 0.325 ms projected), so a
region of many short calls can total milliseconds and still differ by 2x. Only long calls
compare well.
Why by leaf name: NVTX messages are the region's own name, so nsys sums "a/x" and "b/x" as "x".
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DOMAIN = "cudatimer"
EVENTS_ONLY = "host_metrics"  # the workload's events-only region: must be absent from nsys


# ---------------------------------------------------------------------------------------------
# Workload
# ---------------------------------------------------------------------------------------------


def run_workload(summary_path: Path, steps: int, compiled: bool = False) -> None:
    import torch
    from torch import nn

    import cudatimer

    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    # Off the GPU (a smoke run of this script) everything shrinks; nsys is not involved then.
    width, batch, mat, n_mm = (1024, 256, 4096, 60) if cuda else (64, 8, 64, 4)
    dtype = torch.bfloat16 if cuda else torch.float32

    class MLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(
                nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
            )

        @cudatimer.cuda_timed("mlp_forward")
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = self.net(x)
            return out

    model = MLP().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(batch, width, device=device)
    a = torch.randn(mat, mat, device=device, dtype=dtype)
    b = torch.randn(mat, mat, device=device, dtype=dtype)

    chain: Any = None
    if compiled:
        # A decorated function inside torch.compile'd code: its region is the two marks
        # Inductor's code calls (docs/compile.md), and must show in Nsight like any other.
        @cudatimer.cuda_timed(name="compiled_matmuls")
        def matmul_chain(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            c = a
            for _ in range(n_mm // 2):
                c = torch.mm(c, b)  # chained: Inductor cannot fold repeats into one
            return c

        chain = torch.compile(lambda a, b: matmul_chain(a, b) + 1, fullgraph=True)

    def step(i: int) -> None:
        if chain is not None:
            with cudatimer.cuda_region("compiled"):
                chain(a, b)
        with cudatimer.cuda_region("train_step", payload=i):
            loss = model(x).square().mean()
            with cudatimer.cuda_region("backward"):
                loss.backward()
            with cudatimer.cuda_region("optimizer"):
                opt.step()
                opt.zero_grad(set_to_none=True)
            # ~10 ms of bf16 4096^3 matmuls on an H200 (0.17 ms each): long enough that the
            # launch latency at the start of an event span is well under 1%.
            with cudatimer.cuda_region("matmuls", color="red"):
                c = a
                for _ in range(n_mm):
                    c = torch.mm(a, b)
            with cudatimer.cuda_region(EVENTS_ONLY, mode="events"):
                _ = c.float().norm()

    # Warm-up (cuBLAS handles, allocator, lazy CUDA init) with cudatimer off: no events and no
    # NVTX, so nsys and cudatimer count the same calls afterwards.
    cudatimer.disable()
    for i in range(3):
        step(i)
    if cuda:
        torch.cuda.synchronize()
    cudatimer.enable()
    for i in range(steps):
        step(i)
    if cuda:
        torch.cuda.synchronize()

    summ = cudatimer.summary()
    regions = [
        {
            "name": r.name,
            "clock": r.clock,
            "calls": r.calls,
            "gpu_total_ms": r.gpu_total_ms,
            "cpu_total_ms": r.cpu_total_ms,
            "nvtx": r.name.rsplit("/", 1)[-1] != EVENTS_ONLY,
        }
        for r in summ.regions
    ]
    out = {"domain": DOMAIN, "device": device, "steps": steps, "regions": regions}
    summary_path.write_text(json.dumps(out, indent=2))
    cudatimer.report()
    print(f"wrote {summary_path} ({len(regions)} regions, device {device})")


# ---------------------------------------------------------------------------------------------
# Parsing nsys stats CSV
# ---------------------------------------------------------------------------------------------


@dataclass
class RangeRow:
    instances: int
    total_ns: float


@dataclass
class Stats:
    """Per raw range name (as nsys prints it, e.g. ``cudatimer:matmuls``)."""

    cpu: dict[str, RangeRow] = field(default_factory=dict)  # nvtx_sum
    proj: dict[str, RangeRow] = field(default_factory=dict)  # nvtx_gpu_proj_sum


def _num(text: str) -> float:
    return float(text.replace(",", "").strip() or "nan")


def parse_stats_csv(text: str) -> Stats:
    """Parse what ``nsys stats --report nvtx_sum,nvtx_gpu_proj_sum --format csv`` printed.

    Reports are recognised by their header row, not by position: nsys prints notices, blank
    lines and, in some versions, titles between them; anything else is skipped.
    """
    stats = Stats()
    target: dict[str, RangeRow] | None = None
    header: list[str] = []
    for row in csv.reader(io.StringIO(text)):
        cells = [c.strip() for c in row]
        if not any(cells):
            target = None
            continue
        name_col = "Range" if "Range" in cells else "Name" if "Name" in cells else None
        if name_col and any(c.startswith("Total Proj Time") for c in cells):
            target, header = stats.proj, cells
            continue
        if name_col and "Instances" in cells and any(c.startswith("Total Time") for c in cells):
            target, header = stats.cpu, cells
            continue
        if target is None or len(cells) != len(header):
            continue
        rec = dict(zip(header, cells, strict=True))
        name = rec.get("Range", rec.get("Name", ""))
        if target is stats.proj:
            inst, total = rec.get("Range Instances", "0"), _first(rec, "Total Proj Time")
        else:
            inst, total = rec.get("Instances", "0"), _first(rec, "Total Time")
        prev = target.get(name)
        row_ = RangeRow(int(_num(inst)), _num(total))
        # The same message may come in several rows (e.g. per style): add them up.
        target[name] = (
            row_
            if prev is None
            else RangeRow(prev.instances + row_.instances, prev.total_ns + row_.total_ns)
        )
    return stats


def _first(rec: dict[str, str], prefix: str) -> str:
    return next(v for k, v in rec.items() if k.startswith(prefix))


def leaf_of(range_name: str, domain: str) -> str | None:
    """Region name of an nsys range: ``cudatimer:name`` or, from tools that print messages
    without their domain, a bare ``name``. None for another domain's range."""
    name = range_name.strip().strip('"')
    if name.startswith(domain + ":"):
        return name[len(domain) + 1 :]
    if ":" in name:  # "other:x" or ":x" (default domain): not ours
        return None
    return name


# ---------------------------------------------------------------------------------------------
# Judging
# ---------------------------------------------------------------------------------------------


@dataclass
class Result:
    ok: bool
    problems: list[str]
    table: str


def check(
    stats: Stats,
    summary: dict[str, Any],
    *,
    domain: str = DOMAIN,
    tol: float = 0.03,
    min_ms: float = 1.0,
) -> Result:
    """Compare cudatimer's summary (the JSON the workload wrote) with the nsys statistics."""
    # cudatimer paths -> leaves (the NVTX message), summed like nsys sums them.
    mine: dict[str, dict[str, Any]] = {}
    for r in summary["regions"]:
        leaf = r["name"].rsplit("/", 1)[-1]
        agg = mine.setdefault(leaf, {"calls": 0, "gpu": 0.0, "timed": True, "nvtx": True})
        agg["calls"] += r["calls"]
        if r.get("gpu_total_ms") is None:
            agg["timed"] = False
        else:
            agg["gpu"] += r["gpu_total_ms"]
        agg["nvtx"] = agg["nvtx"] and r.get("nvtx", True)
    cpu = _by_leaf(stats.cpu, domain)
    proj = _by_leaf(stats.proj, domain)

    problems: list[str] = []
    lines = [
        "| region | calls | nsys instances | GPU ms (events) | GPU ms (nsys projection) "
        "| diff | verdict |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for leaf, m in mine.items():
        c, p = cpu.get(leaf), proj.get(leaf)
        verdict: list[str] = []
        if not m["nvtx"]:
            if c is not None:
                verdict.append("FAIL: events-only region has an NVTX range")
            else:
                verdict.append("ok (no NVTX, as asked)")
        elif c is None:
            verdict.append("FAIL: missing from nvtx_sum")
        elif c.instances != m["calls"]:
            verdict.append(f"FAIL: {c.instances} ranges for {m['calls']} calls")
        diff = ""
        per_call = m["gpu"] / m["calls"] if m["timed"] and m["calls"] else 0.0
        if m["nvtx"] and m["timed"] and per_call >= min_ms:
            if p is None or p.total_ns <= 0:
                verdict.append("FAIL: no GPU projection")
            else:
                rel = m["gpu"] / (p.total_ns / 1e6) - 1.0
                diff = f"{rel:+.2%}"
                if abs(rel) > tol:
                    verdict.append(f"FAIL: differs by more than {tol:.0%}")
        elif m["nvtx"] and c is not None:
            diff = f"n/a (< {min_ms:g} ms/call)" if m["timed"] else "n/a (not GPU-timed)"
        fails = [v for v in verdict if v.startswith("FAIL")]
        problems += [f"{leaf}: {v}" for v in fails]
        lines.append(
            f"| {leaf} | {m['calls']} | {c.instances if c else '-'} | "
            f"{m['gpu']:.3f} | {(p.total_ns / 1e6) if p else float('nan'):.3f} | {diff} | "
            f"{'; '.join(fails) or (verdict[0] if verdict else 'ok')} |"
        )
    for leaf in sorted(set(cpu) - set(mine)):
        problems.append(f"{leaf}: nsys has a {domain} range that cudatimer did not report")
        lines.append(f"| {leaf} | - | {cpu[leaf].instances} | - | - | | FAIL: unknown range |")
    return Result(not problems, problems, "\n".join(lines))


def _by_leaf(rows: dict[str, RangeRow], domain: str) -> dict[str, RangeRow]:
    out: dict[str, RangeRow] = {}
    for raw, row in rows.items():
        leaf = leaf_of(raw, domain)
        if leaf is not None:
            prev = out.get(leaf)
            out[leaf] = (
                row
                if prev is None
                else RangeRow(prev.instances + row.instances, prev.total_ns + row.total_ns)
            )
    return out


def nsys_stats(report: Path) -> str:
    cmd = [
        "nsys",
        "stats",
        "-q",
        "--force-export=true",
        "--report",
        "nvtx_sum,nvtx_gpu_proj_sum",
        "--format",
        "csv",
        str(report),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr}")
    return proc.stdout


# ---------------------------------------------------------------------------------------------
# Self-test data: the shape nsys 2024-2025 prints (values made up, consistent with each other)
# ---------------------------------------------------------------------------------------------

SAMPLE_CSV = """\
NOTICE: Existing SQLite export found: /tmp/r.sqlite

Time (%),Total Time (ns),Instances,Avg (ns),Med (ns),Min (ns),Max (ns),StdDev (ns),Style,Range
61.2,55000000,5,11000000.0,11000000.0,10900000,11100000,50000.0,PushPop,cudatimer:train_step
31.1,28000000,5,5600000.0,5600000.0,5500000,5700000,40000.0,PushPop,cudatimer:matmuls
4.4,4000000,5,800000.0,800000.0,790000,810000,5000.0,PushPop,cudatimer:mlp_forward
2.2,2000000,5,400000.0,400000.0,390000,410000,5000.0,PushPop,cudatimer:backward
1.1,1000000,5,200000.0,200000.0,190000,210000,5000.0,PushPop,cudatimer:optimizer
0.0,1000,1,1000.0,1000.0,1000,1000,0.0,PushPop,:unrelated

Range,Style,Total Proj Time (ns),Total Range Time (ns),Range Instances,Proj Avg (ns),\
Proj Med (ns),Proj Min (ns),Proj Max (ns),Proj StdDev (ns),Total GPU Ops,Avg GPU Ops,\
Avg Range Lvl,Avg Num Child
cudatimer:train_step,PushPop,51500000,55000000,5,10300000.0,10300000.0,10200000,10400000,\
50000.0,700,140.0,0.0,4.0
cudatimer:matmuls,PushPop,50500000,28000000,5,10100000.0,10100000.0,10000000,10200000,\
50000.0,300,60.0,1.0,0.0
cudatimer:mlp_forward,PushPop,1500000,4000000,5,300000.0,300000.0,290000,310000,5000.0,\
25,5.0,1.0,0.0
cudatimer:optimizer,PushPop,500000,1000000,5,100000.0,100000.0,90000,110000,5000.0,50,10.0,\
1.0,0.0
"""

SAMPLE_SUMMARY: dict[str, Any] = {
    "domain": DOMAIN,
    "regions": [
        {"name": "train_step", "calls": 5, "gpu_total_ms": 52.0, "nvtx": True},
        {"name": "train_step/mlp_forward", "calls": 5, "gpu_total_ms": 3.3, "nvtx": True},
        {"name": "train_step/backward", "calls": 5, "gpu_total_ms": 1.1, "nvtx": True},
        {"name": "train_step/optimizer", "calls": 5, "gpu_total_ms": 0.6, "nvtx": True},
        {"name": "train_step/matmuls", "calls": 5, "gpu_total_ms": 51.0, "nvtx": True},
        {"name": f"train_step/{EVENTS_ONLY}", "calls": 5, "gpu_total_ms": 0.2, "nvtx": False},
    ],
}


def selftest() -> int:
    # The sample wraps long lines with a backslash-newline inside the string literal.
    stats = parse_stats_csv(SAMPLE_CSV)
    assert stats.cpu["cudatimer:matmuls"] == RangeRow(5, 28000000.0), stats.cpu
    assert stats.proj["cudatimer:matmuls"] == RangeRow(5, 50500000.0), stats.proj
    assert ":unrelated" in stats.cpu and "cudatimer:backward" not in stats.proj
    assert leaf_of("cudatimer:a:b", DOMAIN) == "a:b"
    assert leaf_of("plain", DOMAIN) == "plain" and leaf_of(":plain", DOMAIN) is None
    good = check(stats, SAMPLE_SUMMARY)
    assert good.ok, good.problems
    assert "+0.99%" in good.table and "n/a (< 1 ms/call)" in good.table, good.table
    # Bare names (no domain prefix) parse the same.
    bare = parse_stats_csv(SAMPLE_CSV.replace("cudatimer:", ""))
    assert check(bare, SAMPLE_SUMMARY).ok
    # Failures are caught: a wrong count, a wrong time, an NVTX range on an events-only region.
    wrong = json.loads(json.dumps(SAMPLE_SUMMARY))
    wrong["regions"][1]["calls"] = 6
    wrong["regions"][4]["gpu_total_ms"] = 53.0
    wrong["regions"][3]["nvtx"] = False
    bad = check(stats, wrong)
    assert len(bad.problems) == 3, bad.problems
    print(good.table)
    print("selftest ok")
    return 0


# ---------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--workload", action="store_true", help="run the workload (under nsys)")
    mode.add_argument(
        "--check",
        type=Path,
        metavar="REPORT",
        help=".nsys-rep (or the CSV nsys stats printed) to check",
    )
    mode.add_argument("--selftest", action="store_true", help="check the parser, no GPU")
    ap.add_argument(
        "--summary",
        type=Path,
        default=Path("/tmp/ct.json"),
        help="cudatimer's summary JSON (written by --workload, read by --check)",
    )
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument(
        "--compiled", action="store_true", help="add a region inside torch.compile'd code"
    )
    ap.add_argument("--domain", default=DOMAIN)
    ap.add_argument("--tol", type=float, default=0.03, help="relative tolerance (0.03 = 3%%)")
    ap.add_argument(
        "--min-ms",
        type=float,
        default=1.0,
        help="compare GPU times only for regions of at least this many ms per call",
    )
    args = ap.parse_args(argv)

    if args.selftest:
        return selftest()
    if args.workload:
        run_workload(args.summary, args.steps, args.compiled)
        return 0
    report: Path = args.check
    text = report.read_text() if report.suffix == ".csv" else nsys_stats(report)
    summary = json.loads(args.summary.read_text())
    res = check(
        parse_stats_csv(text), summary, domain=args.domain, tol=args.tol, min_ms=args.min_ms
    )
    print(res.table)
    print()
    if res.ok:
        print(f"OK: {len(summary['regions'])} regions match nsys")
        return 0
    print("FAILED:\n" + "\n".join(f"- {p}" for p in res.problems))
    if not parse_stats_csv(text).cpu:
        print("(no NVTX ranges parsed; nsys printed:)\n" + text[:4000])
    return 1


if __name__ == "__main__":
    sys.exit(main())
