"""Cross-rank reports: records, rendering, offline merge, and real gloo jobs of 2 and 4 processes.

The multi-process tests start one job per world size (``torch.multiprocessing`` spawn, gloo on
127.0.0.1), run every scenario in it once, pickle what each rank saw, and the tests check those
results; a job that does not finish within 120 s fails instead of hanging the suite.
"""

from __future__ import annotations

import contextlib
import glob
import io
import math
import os
import pickle
import random
import socket
import time
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import cudatimer
import cudatimer.distributed as cd
from cudatimer import ALPHA, Histogram, RegionStats, Summary, Timer
from cudatimer.render._export import save as save_summary
from cudatimer.render._report import render_ranks

JOB_TIMEOUT_S = 120.0
LATE_S = 3.0  # how late the other ranks arrive in the timeout scenario
WAIT_S = 0.75  # rank 0's rank_timeout_s there: it must give up well before they arrive


def _stats(name: str, clock: str, values: list[float]) -> RegionStats:
    h = Histogram.of(values)
    return RegionStats(name, clock, len(values), h if clock != "host" else None, h)


def _samples(rank: int) -> list[float]:
    """Rank-specific durations (ms), spread over three decades so buckets differ per rank."""
    rng = random.Random(1234 + rank)
    return [rng.lognormvariate(0.0, 1.0) * (rank + 1) for _ in range(400 + 50 * rank)]


def _nearest_rank(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


class _DDPNet(torch.nn.Module):
    """Four layers, so DDP's small buckets all-reduce while the backward still runs."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(16, 64)
        self.act = torch.nn.GELU()
        self.b = torch.nn.Linear(64, 64)
        self.head = torch.nn.Linear(64, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.b(self.act(self.a(x))))
        return out


def _ddp_backward_rows(rank: int) -> dict[str, Any]:
    """Three steps of gradient accumulation under DDP (buckets of ~16 KB, so the all-reduce
    runs beside the backward), plain and with ``instrument(backward=True)`` on the inner
    model: the backward rows per module and whether the gradients are bitwise the plain run's."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    plain = _DDPNet()
    inner = _DDPNet()
    inner.load_state_dict(plain.state_dict())
    t = Timer(name="ddp-backward")
    handle = cudatimer.instrument(inner, backward=True, timer=t)
    models = [DDP(m, bucket_cap_mb=0.016) for m in (plain, inner)]
    gen = torch.Generator().manual_seed(100 + rank)
    xs = [torch.randn(8, 16, generator=gen) for _ in range(3)]
    for model in models:
        for x in xs:
            model(x).square().mean().backward()
    handle.remove()
    equal = all(
        p.grad is not None and q.grad is not None and torch.equal(p.grad, q.grad)
        for p, q in zip(plain.parameters(), inner.parameters(), strict=True)
    )
    s = t.summary()
    rows = {name: s.get(name, clock="host") for name in handle.backward_regions.values()}
    return {
        "grads_equal": equal,
        "rows": {name: r.calls if r is not None else 0 for name, r in rows.items()},
        "names": s.names,
    }


# -- the job every rank runs ------------------------------------------------------------------
def _worker(rank: int, world: int, port: int, out: str) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=JOB_TIMEOUT_S),
    )
    res: dict[str, Any] = {}
    try:
        # Exact counts: rank r runs "step" 3 (r + 1) times, with "fwd" twice inside each.
        t = Timer(name="counts")
        for _ in range(3 * (rank + 1)):
            with t.region("step"):
                for _ in range(2):
                    with t.region("fwd"):
                        pass
        res["counts"] = cd.summary(t)
        res["counts_group"] = cd.summary(t, transport="group")
        res["counts_all"] = cd.summary(t, dst=None)
        res["counts_last"] = cd.summary(t, dst=world - 1, transport="group")
        cd.save(os.path.join(out, "rank{rank}.json"), t)

        # Region names differ per rank: one shared region, one only on this rank.
        t2 = Timer(name="names")
        with t2.region("shared"):
            pass
        with t2.region(f"only{rank}"):
            pass
        res["names"] = cd.summary(t2, dst=None)
        res["names_group"] = cd.summary(t2, dst=None, transport="group")

        # The last rank is slow on purpose.
        t3 = Timer(name="slow")
        for _ in range(3):
            with t3.region("work"):
                time.sleep(0.05 if rank == world - 1 else 0.001)
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            res["report_return"] = cd.report(t3)
        res["report_printed"] = buf.getvalue()
        res["slow"] = cd.summary(t3)

        # Percentiles: known samples, each rank on its own device index (cuda:r).
        local = Summary((_stats("sample", f"cuda:{rank}", _samples(rank)),))
        res["pct"] = cd.summary(local, dst=None)

        # DDP: backward rows beside the bucketed all-reduce, gradients unchanged.
        res["ddp"] = _ddp_backward_rows(rank)

        # A subgroup: non-members take no part in it.
        if world >= 4:
            sub = dist.new_group([1, 3])
            res["sub"] = cd.summary(t2, group=sub, dst=3) if rank in (1, 3) else "not called"

        # A rank that does not arrive: rank 0 gives up, the late ranks do not hang either.
        dist.barrier()
        if rank == 0:
            started = time.monotonic()
            try:
                cd.summary(t, rank_timeout_s=WAIT_S)
            except cd.RankExchangeError as exc:
                res["timeout_error"] = str(exc)
            buf = io.StringIO()
            with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(buf):
                warnings.simplefilter("always")
                res["timeout_report"] = cd.report(t, rank_timeout_s=WAIT_S)
            res["timeout_warnings"] = [str(w.message) for w in caught]
            res["timeout_elapsed_s"] = time.monotonic() - started
        else:
            time.sleep(LATE_S)
            res["late_summary"] = cd.summary(t, rank_timeout_s=WAIT_S)
            res["late_report"] = cd.report(t, rank_timeout_s=WAIT_S)
        # The process group still works (the store exchange left no collective half done), and
        # rank 0, whose process hosts the store, stays until the late ranks have written.
        dist.barrier()
    finally:
        with open(os.path.join(out, f"rank{rank}.pkl"), "wb") as f:
            pickle.dump(res, f)
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_job(world: int, out: Path) -> dict[int, dict[str, Any]]:
    ctx = mp.start_processes(
        _worker,
        args=(world, _free_port(), str(out)),
        nprocs=world,
        join=False,
        start_method="spawn",
    )
    deadline = time.monotonic() + JOB_TIMEOUT_S
    try:
        while not ctx.join(timeout=max(0.1, deadline - time.monotonic())):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the {world}-process job did not finish in {JOB_TIMEOUT_S} s")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
    results = {}
    for rank in range(world):
        with open(out / f"rank{rank}.pkl", "rb") as f:
            results[rank] = pickle.load(f)
    return results


@pytest.fixture(scope="module", params=[2, 4], ids=["2proc", "4proc"])
def job(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[int, Path, dict[int, dict[str, Any]]]:
    world = int(request.param)
    out = tmp_path_factory.mktemp(f"dist{world}")
    return world, out, _run_job(world, out)


# -- multi-process: gloo ----------------------------------------------------------------------
def test_counts_merged_exactly(job: tuple[int, Path, dict[int, dict[str, Any]]]) -> None:
    """Rank 0 receives every rank's exact call counts per region; the other ranks get None."""
    world, _, res = job
    ranked = res[0]["counts"]
    assert ranked.ranks == tuple(range(world))
    assert ranked["step"].calls_per_rank == tuple(3 * (r + 1) for r in range(world))
    assert ranked["step/fwd"].calls_per_rank == tuple(6 * (r + 1) for r in range(world))
    assert ranked["step/fwd"].calls == sum(6 * (r + 1) for r in range(world))
    assert all(res[r]["counts"] is None for r in range(1, world))


def test_group_transport_gives_the_same_result(
    job: tuple[int, Path, dict[int, dict[str, Any]]],
) -> None:
    """Object collectives on the process group give the same RankSummary as the store."""
    world, _, res = job
    assert res[0]["counts_group"] == res[0]["counts"]
    assert res[0]["names_group"] == res[0]["names"]
    assert all(res[r]["counts_group"] is None for r in range(1, world))


def test_dst_none_gives_every_rank_the_result(
    job: tuple[int, Path, dict[int, dict[str, Any]]],
) -> None:
    """dst=None hands the same RankSummary to every rank."""
    world, _, res = job
    assert all(res[r]["counts_all"] == res[0]["counts"] for r in range(world))


def test_dst_is_configurable(job: tuple[int, Path, dict[int, dict[str, Any]]]) -> None:
    """dst=world-1 delivers the result to the last rank only."""
    world, _, res = job
    assert res[world - 1]["counts_last"] == res[0]["counts"]
    assert all(res[r]["counts_last"] is None for r in range(world - 1))


def test_different_region_names_are_shown_absent(
    job: tuple[int, Path, dict[int, dict[str, Any]]],
) -> None:
    """Regions missing on some ranks are rows marked absent there, in data and in the table."""
    world, _, res = job
    ranked = res[0]["names"]
    assert ranked["shared"].absent == ()
    for r in range(world):
        row = ranked[f"only{r}"]
        assert row.absent == tuple(k for k in range(world) if k != r)
        assert row.calls_per_rank == tuple(1 if k == r else 0 for k in range(world))
    text = render_ranks(ranked, sort="order")
    line = next(ln for ln in text.splitlines() if ln.startswith("only0 "))
    assert f"1/{world} (not on 1" in line


def test_slow_rank_is_identified(job: tuple[int, Path, dict[int, dict[str, Any]]]) -> None:
    """The rank that sleeps in its region is the slowest, and the report on rank 0 says so."""
    world, _, res = job
    row = res[0]["slow"]["work"]
    assert row.slowest_rank == world - 1
    assert row.total_max_ms == row.rank(world - 1).cpu_total_ms
    assert row.skew > 1.0
    printed = res[0]["report_printed"]
    assert res[0]["report_return"] + "\n" == printed
    work = next(ln for ln in printed.splitlines() if ln.startswith("work "))
    assert work.split()[8] == str(world - 1)  # the "slowest" column
    assert all(res[r]["report_return"] == "" == res[r]["report_printed"] for r in range(1, world))


def test_merged_percentiles_match_all_samples(
    job: tuple[int, Path, dict[int, dict[str, Any]]],
) -> None:
    """Percentiles merged from the ranks' buckets are those of all samples, within ALPHA."""
    world, _, res = job
    every = [v for r in range(world) for v in _samples(r)]
    ranked = res[0]["pct"]
    assert [r.clock for r in ranked.regions] == ["cuda"]  # cuda:0, cuda:1... are one row
    row = ranked["sample"]
    assert row.gpu is not None and row.gpu.count == len(every)
    for q, got in ((0.5, row.p50_ms), (0.9, row.p90_ms), (0.99, row.p99_ms)):
        exact = _nearest_rank(every, q)
        assert abs(got - exact) <= ALPHA * exact + 1e-12, (q, got, exact)


def test_saved_rank_files_merge_offline(job: tuple[int, Path, dict[int, dict[str, Any]]]) -> None:
    """Per-rank files merge into the same view as the live exchange, ranks read from the files."""
    world, out, res = job
    paths = sorted(glob.glob(str(out / "rank*.json")), reverse=True)
    assert len(paths) == world
    merged = cd.merge_files(paths)
    live = res[0]["counts"]
    assert merged.ranks == live.ranks
    assert [s.regions for s in merged.summaries] == [s.regions for s in live.summaries]
    # Files keep the trace samples; the exchange leaves them out (they can weigh megabytes).
    assert merged.summaries[0].trace and live.summaries[0].trace == ()


def test_missing_rank_times_out_without_hanging(
    job: tuple[int, Path, dict[int, dict[str, Any]]],
) -> None:
    """A rank that does not arrive makes dst raise (naming it) and report fall back; no hang."""
    world, _, res = job
    late = list(range(1, world))
    assert f"rank(s) {late} did not reach" in res[0]["timeout_error"]
    assert res[0]["timeout_elapsed_s"] < LATE_S  # gave up before the late ranks arrived
    assert any("did not reach" in w for w in res[0]["timeout_warnings"])
    report = res[0]["timeout_report"]
    assert "note: rank 0 only" in report and report.splitlines()[0].startswith("region")
    assert all(res[r]["late_summary"] is None for r in late)
    assert all(res[r]["late_report"] == "" for r in late)


def test_ddp_backward_rows_leave_gradients_bitwise_unchanged(
    job: tuple[int, Path, dict[int, dict[str, Any]]],
) -> None:
    """Under DDP (gloo, small buckets all-reducing during the backward, three accumulated
    backward passes) every module has its backward row once per pass, nested under the model's
    root, and the all-reduced gradients are bitwise those of the plain DDP model."""
    world, _, results = job
    for rank in range(world):
        ddp = results[rank]["ddp"]
        assert ddp["grads_equal"], f"rank {rank}: gradients changed"
        assert ddp["rows"] == {
            "_DDPNet.backward": 3,
            "_DDPNet.backward/a": 3,
            "_DDPNet.backward/act": 3,
            "_DDPNet.backward/b": 3,
            "_DDPNet.backward/head": 3,
        }, f"rank {rank}: {ddp['rows']}"
        assert {"_DDPNet", "_DDPNet/a", "_DDPNet/head"} <= set(ddp["names"])


def test_subgroup_members_only(job: tuple[int, Path, dict[int, dict[str, Any]]]) -> None:
    """With group=, only its members exchange; dst is a global rank of the group."""
    world, _, res = job
    if world < 4:
        pytest.skip("needs 4 ranks")
    ranked = res[3]["sub"]
    assert ranked.ranks == (1, 3)
    assert ranked["only1"].absent == (3,) and ranked["only3"].absent == (1,)
    assert res[1]["sub"] is None
    assert res[0]["sub"] == res[2]["sub"] == "not called"


# -- one process: records, rendering, files ---------------------------------------------------
def test_no_process_group_falls_back_to_local(capsys: pytest.CaptureFixture[str]) -> None:
    """Without init_process_group: summary is one rank, report prints the local table."""
    assert not dist.is_initialized()
    with cudatimer.cuda_region("solo"):
        pass
    ranked = cd.summary()
    assert ranked is not None and ranked.ranks == (0,)
    assert ranked["solo"].calls_per_rank == (1,)
    text = cd.report()
    assert capsys.readouterr().out == text + "\n"
    assert text == cudatimer.report()


def test_module_functions_take_all_ranks(capsys: pytest.CaptureFixture[str]) -> None:
    """cudatimer.summary/report(all_ranks=True) delegate to cudatimer.distributed."""
    with cudatimer.cuda_region("solo"):
        pass
    ranked = cudatimer.summary(all_ranks=True, dst=None)
    assert isinstance(ranked, cd.RankSummary) and ranked["solo"].calls == 1
    assert cudatimer.report(all_ranks=True) == cd.report()
    given = Summary((_stats("given", "host", [1.0]),))
    assert "given" in cudatimer.report(all_ranks=True, summary=given)
    with pytest.raises(TypeError, match="dst"):
        cudatimer.summary(dst=0)  # type: ignore[call-overload]


def test_window_options_reach_the_timer(capsys: pytest.CaptureFixture[str]) -> None:
    """last=/steps=/warmup= pick steps of the Timer; they make no sense for a Summary source."""
    t = Timer(name="window")
    for _ in range(3):
        with t.region("it"):
            pass
        t.step()
    ranked = cd.summary(t, last=1)
    assert ranked is not None and ranked["it"].calls_per_rank == (1,)
    out = io.StringIO()
    text = cd.report(t, warmup=1, sort="skew", file=out)  # no group: local table, its own sort
    assert out.getvalue() == text + "\n" and capsys.readouterr().out == ""
    assert text.splitlines()[2].split()[:3] == ["it", "host", "2"]
    with pytest.raises(TypeError, match="already a Summary"):
        cd.summary(Summary(()), last=1)
    with pytest.raises(TypeError, match="colour"):
        cd.summary(t, colour=1)


def test_report_and_save_refuse_an_empty_window_as_every_output_does(tmp_path: Path) -> None:
    """distributed.report and save take the Timer's output path: an empty window names the
    steps there were, before any exchange and without writing a file."""
    t = Timer(name="empty-window")
    with t.region("it"):
        pass
    t.step()
    with pytest.raises(ValueError) as info:
        cd.report(t, warmup=5, file=io.StringIO())
    assert str(info.value).startswith(
        "distributed.report(warmup=5): the window holds no step: it asks for the finished "
        "steps from step 5 on, but 1 step finished (step 0; step 1 is in progress)."
    )
    with pytest.raises(ValueError, match=r"^distributed\.save\(last=2, warmup=3\): the window"):
        cd.save(tmp_path / "rank{rank}.json", t, last=2, warmup=3)
    assert not list(tmp_path.iterdir())
    with pytest.raises(TypeError, match="file must be a text stream"):
        cd.report(t, file=3)


def test_cross_rank_statistics() -> None:
    """Totals and means are min/median/max over ranks; skew = max/median; absent not zero."""
    per_rank = {
        0: Summary((_stats("step", "cuda:0", [1.0, 1.0]), _stats("io", "host", [4.0]))),
        1: Summary((_stats("step", "cuda:1", [2.0, 2.0]),)),
        2: Summary((_stats("step", "cuda:2", [6.0, 6.0]), _stats("io", "host", [8.0, 8.0]))),
    }
    ranked = cd.RankSummary(tuple(per_rank), tuple(per_rank.values()))
    step = ranked["step"]
    assert (step.total_min_ms, step.total_median_ms, step.total_max_ms) == (2.0, 4.0, 12.0)
    assert (step.mean_min_ms, step.mean_median_ms, step.mean_max_ms) == (1.0, 2.0, 6.0)
    assert step.slowest_rank == 2 and step.skew == 3.0
    io_row = ranked["io"]
    assert io_row.clock == "host" and io_row.absent == (1,)
    assert io_row.calls_per_rank == (1, 0, 2)
    assert (io_row.total_min_ms, io_row.total_median_ms, io_row.total_max_ms) == (4.0, 10.0, 16.0)
    assert io_row.rank(1) is None and io_row.rank(2) is not None


def test_ranks_are_sorted_and_validated() -> None:
    """Rank ids come out ascending with their summaries; duplicates and mismatches raise."""
    a = Summary((_stats("x", "host", [1.0]),))
    b = Summary((_stats("x", "host", [2.0, 2.0]),))
    ranked = cd.RankSummary((5, 2), (a, b))
    assert ranked.ranks == (2, 5) and ranked["x"].calls_per_rank == (2, 1)
    assert ranked.rank(5) is a
    with pytest.raises(ValueError, match="unique"):
        cd.RankSummary((1, 1), (a, b))
    with pytest.raises(ValueError, match="one rank id per summary"):
        cd.RankSummary((0,), (a, b))
    with pytest.raises(TypeError, match="summaries"):
        cd.RankSummary((0,), ("x",))  # type: ignore[arg-type]


def test_two_devices_in_one_rank_fold_into_one_row() -> None:
    """A rank that timed a region on cuda:0 and cuda:1 contributes one record to the row."""
    s = Summary((_stats("x", "cuda:0", [1.0]), _stats("x", "cuda:1", [3.0])))
    row = cd.RankSummary((0,), (s,))["x"]
    assert row.calls_per_rank == (2,)
    folded = row.rank(0)
    assert folded is not None and folded.clock == "cuda:0+cuda:1" and folded.gpu_total_ms == 4.0


def test_host_and_cuda_rows_stay_apart() -> None:
    """One path timed on the host on one rank and on a GPU on another gives two rows."""
    ranked = cd.RankSummary(
        (0, 1),
        (Summary((_stats("x", "cuda:0", [1.0]),)), Summary((_stats("x", "host", [2.0]),))),
    )
    assert [(r.name, r.clock, r.absent) for r in ranked.regions] == [
        ("x", "cuda", (1,)),
        ("x", "host", (0,)),
    ]
    with pytest.raises(KeyError, match="several clocks"):
        ranked["x"]
    row = ranked.get("x", clock="cuda:3")
    assert row is not None and row.clock == "cuda"


def test_merged_flat_summary_round_trips(tmp_path: Path) -> None:
    """RankSummary.merged() folds all ranks into one Summary that cudatimer.save/load keep."""
    ranked = cd.RankSummary(
        (0, 1),
        (
            Summary((_stats("x", "cuda:0", [1.0, 2.0]),), steps=3),
            Summary((_stats("x", "cuda:1", [4.0]),), steps=5),
        ),
    )
    flat = ranked.merged()
    assert flat["x"].calls == 3 and flat["x"].gpu_total_ms == 7.0 and flat.steps == 5
    path = tmp_path / "flat.json"
    save_summary(flat, path)
    assert cudatimer.load(path)["x"].gpu == flat["x"].gpu


def test_render_ranks_table_and_errors() -> None:
    """The table has one row per region with per-rank spread; bad sort/fmt are errors."""
    ranked = cd.RankSummary(
        (0, 1, 2, 3),
        tuple(Summary((_stats("x", "host", [1.0] * (r + 1)),)) for r in range(4)),
    )
    text = render_ranks(ranked)
    row = next(ln for ln in text.splitlines() if ln.startswith("x "))
    assert row.split()[:5] == ["x", "host", "4/4", "10", "1-4"]
    assert "note: 4 rank(s): 0-3" in text
    with pytest.raises(ValueError, match="sort"):
        render_ranks(ranked, sort="fastest")
    with pytest.raises(TypeError, match="fmt"):
        render_ranks(ranked, fmt=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="RankSummary"):
        render_ranks(Summary(()))  # type: ignore[arg-type]


def test_save_puts_rank_in_path_and_meta(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """distributed.save writes rank{rank} with the rank recorded, so merging needs no order."""
    monkeypatch.setenv("RANK", "7")
    monkeypatch.setenv("WORLD_SIZE", "8")
    with cudatimer.cuda_region("x"):
        pass
    cd.save(tmp_path / "rank{rank}.json")
    plain = tmp_path / "plain.json"
    cudatimer.save(str(plain))
    ranked = cd.merge_files([plain, tmp_path / "rank7.json"])
    assert ranked.ranks == (0, 7)  # plain file: its position; saved file: its recorded rank
    assert dict(ranked.rank(7).meta)["world_size"] == "8"


def test_merge_files_errors(tmp_path: Path) -> None:
    """merge_files refuses a bare path, an empty list, a rank given twice and foreign JSON."""
    with pytest.raises(TypeError, match="list of file paths"):
        cd.merge_files(str(tmp_path / "a.json"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="empty"):
        cd.merge_files([])
    a = tmp_path / "a.json"
    cd.save(a, Summary((_stats("x", "host", [1.0]),)))
    with pytest.raises(ValueError, match="rank 0 appears in both"):
        cd.merge_files([a, a])
    other = tmp_path / "other.json"
    other.write_text('{"format": "something else"}')
    with pytest.raises(ValueError, match=r"other\.json: not a cudatimer file"):
        cd.merge_files([other])


def test_cli_merge_then_show(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`merge` writes a cross-rank file `show` reads back; `--flat` writes a loadable Summary."""
    files = []
    for r in range(3):
        path = tmp_path / f"r{r}.json"
        one = Summary((_stats("x", "host", [float(r + 1)] * (r + 1)),), meta=(("rank", str(r)),))
        save_summary(one, path)
        files.append(str(path))
    merged = tmp_path / "merged.json"
    assert cd.main(["merge", *files, "-o", str(merged)]) == 0
    assert cd.load_ranks(merged) == cd.merge_files(files)
    capsys.readouterr()
    assert cd.main(["show", str(merged), "--sort", "skew"]) == 0
    shown = capsys.readouterr().out
    assert next(ln for ln in shown.splitlines() if ln.startswith("x ")).split()[2:4] == [
        "3/3",
        "6",
    ]
    flat = tmp_path / "flat.json"
    assert cd.main(["merge", *files, "-o", str(flat), "--flat"]) == 0
    assert cudatimer.load(flat)["x"].calls == 6
    assert cd.main(["show", str(tmp_path / "missing.json")]) == 2
    assert "missing.json" in capsys.readouterr().err


def test_bad_arguments_are_named() -> None:
    """Bad dst, transport, rank_timeout_s and source raise errors that name them."""
    with pytest.raises(TypeError, match="dst"):
        cd.summary(dst="0")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="transport"):
        cd.summary(transport="mpi")
    with pytest.raises(ValueError, match="rank_timeout_s"):
        cd.summary(rank_timeout_s=0)
    with pytest.raises(TypeError, match="source"):
        cd.summary("timer")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="rank_timeout_s"):
        cd.report(rank_timeout_s="5")  # type: ignore[arg-type]
