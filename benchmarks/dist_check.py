"""Cross-rank reports on a real job: ``torchrun --nproc-per-node 2 benchmarks/dist_check.py``.

With CUDA it runs NCCL, one GPU per rank (``LOCAL_RANK``), regions timed with CUDA events; without
CUDA, gloo and the host clock (the same checks, for a CPU machine). Every rank runs every
scenario; rank 0 prints the cross-rank tables and one ``PASS``/``FAIL`` line per check; every
rank exits 1 if any check failed on any rank.

Checks: exact call counts merged (store and process-group transports, dst=0 / dst=None), region
names that differ per rank shown absent, a rank slower on purpose identified as the slowest,
merged percentiles against every sample of every rank (within ALPHA), a DDP training step with
per-module regions, a rank that arrives late (rank 0 gives up after ``rank_timeout_s``, nobody
hangs), and per-rank files merged offline (API and ``python -m cudatimer.distributed show``).
"""

from __future__ import annotations

import os

# NVLink SHARP / multicast stay off on the lent machines (KINDS.md): set before NCCL starts.
for _key, _value in (
    ("NCCL_NVLS_ENABLE", "0"),
    ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
    ("NVSHMEM_DISABLE_NVLS", "1"),
):
    os.environ.setdefault(_key, _value)

import contextlib  # noqa: E402
import gc  # noqa: E402
import io  # noqa: E402
import math  # noqa: E402
import random  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from datetime import timedelta  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import cudatimer  # noqa: E402
import cudatimer.distributed as cd  # noqa: E402
from cudatimer import ALPHA, Timer  # noqa: E402

RANK = int(os.environ.get("RANK", "0"))
WORLD = int(os.environ.get("WORLD_SIZE", "1"))
LOCAL_RANK = int(os.environ.get("LOCAL_RANK", "0"))
GPU = torch.cuda.is_available()
DEVICE = torch.device("cuda", LOCAL_RANK) if GPU else torch.device("cpu")
CLOCK = "cuda" if GPU else "host"

_failed: list[str] = []


def say(text: str) -> None:
    if RANK == 0:
        print(text, flush=True)


def check(name: str, ok: bool, detail: str = "", *, every_rank: bool = False) -> None:
    """One PASS/FAIL line: printed by rank 0, or by every rank for rank-local checks."""
    if not ok:
        _failed.append(name)
    if RANK == 0 or every_rank:
        prefix = f"[rank {RANK}] " if every_rank else ""
        print(f"{prefix}{'PASS' if ok else 'FAIL'} {name}" + (f": {detail}" if detail else ""))


def work(n: int, size: int = 1024) -> None:
    """``n`` matmuls on this rank's device (GPU time on CUDA; host time on the CPU)."""
    x = torch.randn(size, size, device=DEVICE, dtype=torch.bfloat16 if GPU else torch.float32)
    for _ in range(n):
        x = torch.tanh(x @ x) if GPU else x @ x * 1e-3


def scenario_counts() -> None:
    t = Timer(name="counts")
    for _ in range(5 * (RANK + 1)):
        with t.region("matmul"):
            for _ in range(2):
                with t.region("inner"):
                    work(1, 256)
    expect = tuple(5 * (r + 1) for r in range(WORLD))
    store = cd.summary(t)
    group = cd.summary(t, transport="group")  # NCCL: object collectives on the current device
    every = cd.summary(t, dst=None)
    if RANK == 0:
        assert store is not None and group is not None
        row = store["matmul"]
        check("counts: calls per rank exact", row.calls_per_rank == expect, f"{row.calls_per_rank}")
        inner = store["matmul/inner"].calls_per_rank
        check("counts: nested calls exact", inner == tuple(2 * c for c in expect), f"{inner}")
        check("counts: clock", row.clock == CLOCK, f"{row.clock} (expected {CLOCK})")
        same = [s.regions for s in group.summaries] == [s.regions for s in store.summaries]
        check("counts: group transport == store transport", same)
    else:
        check("counts: non-dst ranks get None", store is None and group is None, every_rank=True)
    ok = every is not None and every["matmul"].calls_per_rank == expect
    check("counts: dst=None reaches every rank", ok, every_rank=True)


def scenario_names() -> None:
    t = Timer(name="names")
    with t.region("shared"):
        work(1, 256)
    with t.region(f"only{RANK}"):
        work(1, 256)
    say("\n-- regions that differ per rank --")
    text = cd.report(t, sort="order")
    ranked = cd.summary(t)
    if RANK == 0:
        assert ranked is not None
        absent_ok = all(
            ranked[f"only{r}"].absent == tuple(k for k in range(WORLD) if k != r)
            for r in range(WORLD)
        )
        check("names: region missing on a rank is shown absent", absent_ok)
        check("names: shared region on every rank", ranked["shared"].absent == ())
        check("names: table says where absent", f"(not on {1 if WORLD == 2 else '1-'}" in text)


def scenario_slow() -> None:
    t = Timer(name="slow")
    slow = RANK == WORLD - 1
    for _ in range(3):
        with t.region("work"):
            if GPU:
                # A spin kernel (cycles, no host involvement): 20x more GPU time on the slow
                # rank. With two ranks skew = max / median = 2 * 20 / 21 = 1.9.
                khz = torch.cuda.get_device_properties(torch.cuda.current_device()).clock_rate
                torch.cuda._sleep(int((20.0 if slow else 1.0) * (khz or 1_980_000)))
            else:
                time.sleep(0.05 if slow else 0.002)
    say("\n-- one rank slower on purpose --")
    cd.report(t)
    ranked = cd.summary(t)
    if RANK == 0:
        assert ranked is not None
        row = ranked["work"]
        check("slow: slowest rank identified", row.slowest_rank == WORLD - 1, f"{row.slowest_rank}")
        check("slow: skew > 1.5", row.skew > 1.5, f"skew {row.skew:.2f}")


def scenario_percentiles() -> None:
    """Real timings: one call of "sample" per step, so per-step rows are the raw samples."""
    t = Timer(name="pct", keep_steps=1000)
    rng = random.Random(RANK)
    for _ in range(300):
        with t.region("sample"):
            work(rng.randint(1, 8), 512)
        t.step()
    mine = t.summary(step_stats=True)
    raw = [
        (s.gpu_ms if GPU else s.cpu_ms)
        for s in mine.step_stats
        if s.name == "sample" and s.calls == 1
    ]
    gathered: list[Any] = [None] * WORLD
    dist.all_gather_object(gathered, raw)
    ranked = cd.summary(t)
    if RANK == 0:
        assert ranked is not None
        every = sorted(v for part in gathered for v in part)
        row = ranked["sample"]
        hist = row.gpu if GPU else row.cpu
        check("pct: merged count", hist is not None and hist.count == len(every) == 300 * WORLD)
        for q, got in ((0.5, row.p50_ms), (0.9, row.p90_ms), (0.99, row.p99_ms)):
            exact = every[max(1, math.ceil(q * len(every))) - 1]
            err = abs(got - exact) / exact
            check(f"pct: p{round(q * 100)} within ALPHA", err <= ALPHA, f"{got:.4f} vs {exact:.4f}")


def scenario_ddp() -> None:
    t = Timer(name="ddp")
    model = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024)).to(DEVICE)
    t.timed(model[0], name="fc1")
    t.timed(model[1], name="act")
    t.timed(model[2], name="fc2")
    ddp = DDP(model, device_ids=[LOCAL_RANK] if GPU else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    x = torch.randn(64, 1024, device=DEVICE)
    steps = 20
    for _ in range(steps):
        with t.region("train_step"):
            with t.region("forward"):
                loss = ddp(x).square().mean()
            with t.region("backward"):
                loss.backward()
            with t.region("optimizer"):
                opt.step()
                opt.zero_grad(set_to_none=True)
        t.step()
    say("\n-- DDP training step, per-module regions --")
    cd.report(t, sort="order")
    ranked = cd.summary(t)
    if RANK == 0:
        assert ranked is not None
        names = ("train_step", "train_step/forward/fc1", "train_step/forward/fc2")
        found = all(n in ranked for n in names)
        check("ddp: module regions nested under forward", found, f"{ranked.names}")
        full = all(r.calls_per_rank == (steps,) * WORLD for r in ranked.regions)
        check("ddp: every region on every rank, once per step", full)
        check("ddp: clock", all(r.clock == CLOCK for r in ranked.regions))


def scenario_late_rank() -> None:
    t = Timer(name="late")
    with t.region("x"):
        work(1, 256)
    dist.barrier()
    if RANK == 0:
        started = time.monotonic()
        try:
            cd.summary(t, rank_timeout_s=1.0)
            check("late: dst raises when ranks are missing", False, "no error")
        except cd.RankExchangeError as exc:
            named = str(list(range(1, WORLD))) in str(exc)
            check("late: dst raises naming the missing ranks", named, str(exc)[:120])
        with warnings.catch_warnings(record=True), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("always")
            text = cd.report(t, rank_timeout_s=1.0)
        check("late: report falls back to the local table", "note: rank 0 only" in text)
        waited = time.monotonic() - started
        check("late: gave up within the timeouts", waited < 3.0, f"{waited:.1f} s")
    else:
        time.sleep(3.0)
        ok = cd.summary(t, rank_timeout_s=1.0) is None
        check("late: a late non-dst rank returns at once", ok, every_rank=True)
        cd.report(t, rank_timeout_s=1.0)
    dist.barrier()  # the group still works: the store exchange left no collective half done


def scenario_files() -> None:
    t = Timer(name="files")
    for _ in range(RANK + 1):
        with t.region("step"):
            work(1, 256)
    box = [tempfile.mkdtemp(prefix="cudatimer_dist_") if RANK == 0 else None]
    dist.broadcast_object_list(box, src=0)
    folder = Path(str(box[0]))
    cd.save(folder / "rank{rank}.json", t)
    live = cd.summary(t)
    dist.barrier()
    if RANK == 0:
        assert live is not None
        files = sorted(str(p) for p in folder.glob("rank*.json"))
        merged = cd.merge_files(files)
        same = [s.regions for s in merged.summaries] == [s.regions for s in live.summaries]
        check("files: offline merge == live exchange", same and merged.ranks == live.ranks)
        cli = subprocess.run(
            [sys.executable, "-m", "cudatimer.distributed", "show", *files],
            capture_output=True,
            text=True,
            check=False,
        )
        shown = cli.returncode == 0 and f"{WORLD}/{WORLD}" in cli.stdout
        check("files: python -m cudatimer.distributed show", shown, cli.stderr[-200:])


def main() -> int:
    if GPU:
        torch.cuda.set_device(DEVICE)
    backend = "nccl" if GPU else "gloo"
    dist.init_process_group(backend, timeout=timedelta(seconds=120))
    say(
        f"dist_check: {WORLD} ranks, {backend}, torch {torch.__version__}, "
        f"cudatimer {cudatimer.__version__}"
    )
    scenarios = (
        scenario_counts,
        scenario_names,
        scenario_slow,
        scenario_percentiles,
        scenario_ddp,
        scenario_late_rank,
        scenario_files,
    )
    wanted = sys.argv[1:]  # e.g. `dist_check.py ddp late_rank`: only those scenarios
    unknown = [w for w in wanted if f"scenario_{w}" not in {f.__name__ for f in scenarios}]
    if unknown:
        raise SystemExit(
            f"unknown scenario(s) {unknown}; choose from counts, names, slow, "
            "percentiles, ddp, late_rank, files"
        )
    try:
        for scenario in scenarios:
            if wanted and scenario.__name__.removeprefix("scenario_") not in wanted:
                continue
            try:
                scenario()
            except Exception as exc:  # keep going: the other ranks are in the same scenario
                check(f"{scenario.__name__} ran", False, repr(exc), every_rank=True)
        failed = torch.tensor([len(_failed)], device=DEVICE)
        dist.all_reduce(failed)
        total = int(failed.item())
        say(f"\ndist_check: {'PASS' if total == 0 else f'FAIL ({total} failed check(s))'}")
        return 0 if total == 0 else 1
    finally:
        # DDP sits in reference cycles: freed only after destroy_process_group, its reducer
        # aborted the process at exit under gloo ("terminate called without an active
        # exception"). Collect it while the group is alive.
        gc.collect()
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
