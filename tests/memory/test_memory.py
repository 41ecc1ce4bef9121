"""Memory per region (``memory=True``) through the fake GPU's allocator history
(``tests/fake_cuda.FakeAllocator``): deltas and peaks of nested and sibling calls, backward
rows, the decorated forms, the notes without an allocator, at an out-of-memory error and when
events are lost, the option's checks, and the memory columns in every output."""

from __future__ import annotations

import asyncio
import contextlib
import csv
import io
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import cudatimer
import cudatimer.distributed as cd
from cudatimer import Timer
from cudatimer._cli import main
from cudatimer.core import _device
from cudatimer.records._values import Tally
from cudatimer.regions._timer import Region
from cudatimer.render._export import save
from cudatimer.render._html import render_html
from cudatimer.render._report import render, render_compare, render_ranks
from tests.helpers.fake_cuda import FakeGPU, install
from tests.helpers.memory_net import Keep, KeepNet

MiB = 1 << 20
FIELDS = (
    "mem_delta_mean_bytes",
    "mem_delta_max_bytes",
    "mem_peak_mean_bytes",
    "mem_peak_max_bytes",
)


@pytest.fixture
def gpu() -> Iterator[FakeGPU]:
    with install() as fake:
        yield fake


def _mem(t: Timer, name: str, **window: object) -> tuple[Tally, Tally]:
    row = t.summary(**window)[name]  # type: ignore[arg-type]
    return row.values["mem_delta"], row.values["mem_peak"]


def test_delta_is_what_a_call_leaves_signed(gpu: FakeGPU) -> None:
    """A call that keeps 256 MiB reads +256 MiB; one that frees them reads -256 MiB."""
    t = Timer(name="delta")
    mem = gpu.memory
    with t.region("keep", memory=True):
        kept = mem.alloc(256 * MiB)
    with t.region("drop", memory=True):
        mem.free(kept)
    assert _mem(t, "keep") == (Tally.of([256 * MiB]), Tally.of([256 * MiB]))
    assert _mem(t, "drop") == (Tally.of([-256 * MiB]), Tally.of([0]))


def test_a_temporary_shows_in_the_peak_not_the_delta(gpu: FakeGPU) -> None:
    """1 GiB allocated and freed inside: delta 0, peak 1 GiB."""
    t = Timer(name="temp")
    with t.region("temp", memory=True):
        gpu.memory.temp(1024 * MiB)
    delta, peak = _mem(t, "temp")
    assert (delta.max, peak.max) == (0.0, 1024.0 * MiB)


def test_a_child_s_peak_counts_in_its_parent_a_sibling_s_not_in_the_next(gpu: FakeGPU) -> None:
    """Parent peak = its own allocation plus the larger child's peak; each sibling's peak is
    its own, from its own enter level."""
    t = Timer(name="nest")
    mem = gpu.memory
    with t.region("outer", memory=True):
        held = mem.alloc(100 * MiB)
        with t.region("a", memory=True):
            mem.temp(50 * MiB)
            kept = mem.alloc(20 * MiB)
        with t.region("b", memory=True):
            mem.temp(30 * MiB)
            mem.free(kept)
        mem.free(held)
    assert _mem(t, "outer") == (Tally.of([0]), Tally.of([150 * MiB]))
    assert _mem(t, "outer/a") == (Tally.of([20 * MiB]), Tally.of([50 * MiB]))
    assert _mem(t, "outer/b") == (Tally.of([-20 * MiB]), Tally.of([30 * MiB]))


def test_calls_fold_into_mean_and_max(gpu: FakeGPU) -> None:
    """Three calls keeping 1, 2 and 6 MiB: count 3, mean 3 MiB, max 6 MiB."""
    t = Timer(name="fold")
    for n in (1, 2, 6):
        with t.region("step", memory=True, memory_every=1):
            gpu.memory.alloc(n * MiB)
    delta, _ = _mem(t, "step")
    assert (delta.count, delta.mean, delta.max) == (3, 3.0 * MiB, 6.0 * MiB)


def test_a_region_without_memory_is_a_plain_region_and_marks_nothing(gpu: FakeGPU) -> None:
    """memory=None/False: the plain Region class, no probe, no boundary marked, no values."""
    t = Timer(name="plain")
    for region in (t.region("a"), t.region("b", memory=False)):
        assert type(region) is Region and region.probes == ()
        with region:
            gpu.memory.alloc(MiB)
    assert gpu.memory.tags == 0
    assert all(not r.values for r in t.summary().regions)
    measured = t.region("c", memory=True)
    assert type(measured) is not Region and measured.probes


def test_instrument_measures_forward_and_backward_rows(gpu: FakeGPU) -> None:
    """Forward rows keep what the layers save; backward rows free it (negative deltas) and
    peak at their temporaries; the model's rows hold both layers'."""
    Keep.mem = gpu.memory
    t = Timer(name="instrumented")
    net = KeepNet()
    with cudatimer.instrument(net, backward=True, memory=True, memory_every=1, timer=t):
        for _ in range(2):
            net(torch.ones(2)).sum().backward()
    s = t.summary()
    got = {r.name: (r.values["mem_delta"].mean, r.values["mem_peak"].max) for r in s.regions}
    assert got == {
        "KeepNet": (30.0 * MiB, 30.0 * MiB),
        "KeepNet/a": (10.0 * MiB, 10.0 * MiB),
        "KeepNet/b": (20.0 * MiB, 20.0 * MiB),
        "KeepNet.backward": (-30.0 * MiB, 5.0 * MiB),
        "KeepNet.backward/b": (-20.0 * MiB, 5.0 * MiB),
        "KeepNet.backward/a": (-10.0 * MiB, 3.0 * MiB),
    }
    assert all(r.values["mem_delta"].count == 2 for r in s.regions)


def test_a_region_s_backward_row_is_measured_too(gpu: FakeGPU) -> None:
    """cuda_region(backward=True, memory=True): the <name>.backward row gets memory values."""
    Keep.mem = gpu.memory
    t = Timer(name="region-backward")
    x = torch.ones(2, requires_grad=True)
    region = t.region("blk", backward=True, memory=True)
    with region:
        y = Keep.apply(x, 4 * MiB, 1 * MiB)  # type: ignore[no-untyped-call]
        region.backward_from(y)
    y.sum().backward()
    assert _mem(t, "blk") == (Tally.of([4 * MiB]), Tally.of([4 * MiB]))
    assert _mem(t, "blk.backward") == (Tally.of([-4 * MiB]), Tally.of([1 * MiB]))


def test_every_decorated_form_is_measured(gpu: FakeGPU) -> None:
    """Functions, generators (per resume), @contextmanager functions, context manager classes
    and coroutines decorated with memory=True all get values."""
    t = Timer(name="forms")
    mem = gpu.memory

    @t.timed(name="fn", memory=True)
    def fn() -> None:
        mem.alloc(MiB)

    @t.timed(name="gen", memory=True, memory_every=1)
    def gen() -> Iterator[int]:
        mem.alloc(2 * MiB)
        yield 1
        mem.alloc(2 * MiB)

    @t.timed(name="cm", memory=True)
    @contextlib.contextmanager
    def cm() -> Iterator[None]:
        mem.alloc(3 * MiB)
        yield

    @t.timed(name="cls", memory=True)
    class Block:
        def __enter__(self) -> None:
            mem.alloc(4 * MiB)

        def __exit__(self, *exc: object) -> None:
            pass

    @t.timed(name="coro", memory=True)
    async def coro() -> None:
        mem.alloc(5 * MiB)

    fn()
    assert list(gen()) == [1]
    with cm():
        pass
    with Block():
        pass
    asyncio.run(coro())
    s = t.summary()
    assert {r.name: r.values["mem_delta"].total for r in s.regions} == {
        "fn": 1.0 * MiB,
        "gen": 4.0 * MiB,
        "cm": 3.0 * MiB,
        "cls": 4.0 * MiB,
        "coro": 5.0 * MiB,
    }
    assert s["gen"].values["mem_delta"].count == 2  # two resumes


def test_every_call_of_a_sampled_region_is_measured(gpu: FakeGPU) -> None:
    """every=4: one call in four timed, all four measured (memory_every=1)."""
    t = Timer(name="sampled")
    region = t.region("hot", every=4, memory=True, memory_every=1)
    for _ in range(4):
        with region:
            gpu.memory.alloc(MiB)
    assert _mem(t, "hot")[0].count == 4


def test_a_window_keeps_each_call_in_the_step_it_ended_in(gpu: FakeGPU) -> None:
    """Values read from the history after the steps still land in their own steps."""
    t = Timer(name="window")
    for n in (1, 2, 3):
        with t.region("step", memory=True, memory_every=1):
            gpu.memory.temp(n * MiB)
        t.step()
    assert gpu.memory.reads == 0  # nothing read yet: all three are read at the summary
    assert _mem(t, "step", last=1)[1] == Tally.of([3 * MiB])
    assert _mem(t, "step", steps=[0])[1] == Tally.of([1 * MiB])
    assert _mem(t, "step")[1].count == 3


def test_the_history_is_read_while_running_not_only_at_reports(gpu: FakeGPU) -> None:
    """After enough calls the history is read at a region's exit (the ring never fills)."""
    t = Timer(name="periodic")
    region = t.region("r", memory=True, memory_every=1)
    for _ in range(2000):
        with region:
            gpu.memory.temp(512)
    assert gpu.memory.reads >= 1
    assert _mem(t, "r")[1] == Tally(2000, 2000 * 512.0, 512.0, 512.0)


def test_an_event_read_before_its_boundary_waits_for_it(gpu: FakeGPU) -> None:
    """The history read between a boundary's mark and its being kept (another thread's read):
    the event after the mark is held until the boundary comes, and counted inside it."""
    t = Timer(name="race")
    mem = gpu.memory
    fired: list[bool] = []

    def read_in_between() -> None:
        if not fired:
            fired.append(True)
            mem.alloc(7 * MiB)  # tagged with the boundary not kept yet
            t.recorder.memory.drain(0.0)

    mem.on_tag = read_in_between
    with t.region("late", memory=True):
        pass
    assert fired
    assert _mem(t, "late")[0] == Tally.of([7 * MiB])


def test_reset_drops_the_calls_before_it(gpu: FakeGPU) -> None:
    """A call that ended before reset() is not read into the new results."""
    t = Timer(name="reset")
    with t.region("r", memory=True):
        gpu.memory.alloc(MiB)
    t.reset()
    with t.region("r", memory=True):
        gpu.memory.alloc(2 * MiB)
    assert _mem(t, "r")[0] == Tally.of([2 * MiB])


def test_without_an_allocator_the_values_are_none_with_one_note() -> None:
    """No CUDA in the device seam: no memory values, one note naming why, shown once."""
    old = _device.use(None)
    try:
        t = Timer(name="no-cuda")
        for _ in range(3):
            with t.region("r", memory=True):
                pass
        s = t.summary()
    finally:
        _device.use(old)
    assert not s["r"].values
    notes = [v for k, v in s.meta if k == "memory_note"]
    assert len(notes) == 1 and "3 call(s)" in notes[0] and "CUDA is not initialised" in notes[0]
    text = render(s)
    assert text.count("CUDA is not initialised") == 1


def test_an_allocator_that_cannot_be_read_says_why(gpu: FakeGPU) -> None:
    """The allocator's own reason (an old torch, another backend) is the note."""
    gpu.memory.why = "the cudaMallocAsync allocator backend keeps no event history"
    t = Timer(name="refused")
    with t.region("r", memory=True):
        gpu.memory.alloc(MiB)
    s = t.summary()
    assert not s["r"].values
    assert "cudaMallocAsync" in dict(s.meta)["memory_note"]


def test_lost_events_leave_the_calls_without_values_and_say_so(gpu: FakeGPU) -> None:
    """A read that reports lost events: the calls it covers get no values, a note counts them;
    calls after it are measured again."""
    t = Timer(name="lost")
    with t.region("r", memory=True, memory_every=1):
        gpu.memory.alloc(MiB)
    gpu.memory.lose = {0}
    first = t.summary()
    assert not first["r"].values
    assert (
        "1 call(s) have none because the allocator's history lost events"
        in dict(first.meta)["memory_note"]
    )
    with t.region("r", memory=True, memory_every=1):
        gpu.memory.alloc(2 * MiB)
    assert _mem(t, "r")[0] == Tally.of([2 * MiB])


def test_a_failed_read_stops_memory_not_the_program(gpu: FakeGPU) -> None:
    """A read that raises (the program turned the history off): the region's exit does not
    raise, later calls get no values, the note says why."""
    t = Timer(name="broken")

    def refuse() -> tuple[dict[int, list[tuple[str, int]]], set[int]]:
        raise RuntimeError("the program turned the allocator's history off")

    gpu.memory.read = refuse  # type: ignore[method-assign]
    with t.region("r", memory=True):
        gpu.memory.alloc(MiB)
    s = t.summary()
    with t.region("r", memory=True):
        pass
    s = t.summary()
    assert not s["r"].values
    assert "history off" in dict(s.meta)["memory_note"]


def test_out_of_memory_names_the_open_regions_in_the_error_and_the_next_report(
    gpu: FakeGPU,
) -> None:
    """The error gets one note (Python >= 3.11) naming the open memory regions, outermost
    first, with what each held then; the next report has it too."""
    t = Timer(name="oom")
    mem = gpu.memory
    mem.capacity = 1024 * MiB
    with pytest.raises(torch.OutOfMemoryError) as info, t.region("outer", memory=True):
        mem.alloc(600 * MiB)
        with t.region("inner", memory=True):
            mem.alloc(300 * MiB)
            mem.alloc(300 * MiB)
    expected = (
        "outer (cuda:0) +900.0 MiB now, +900.0 MiB at most; "
        "outer/inner (cuda:0) +300.0 MiB now, +300.0 MiB at most"
    )
    if sys.version_info >= (3, 11):
        notes = info.value.__notes__
        assert len(notes) == 1 and expected in notes[0]
        assert "cuda:0 had 900.0 MiB allocated" in notes[0]
    report = t.report(file=io.StringIO())
    assert expected in report and "out-of-memory" in report


def test_bad_values_name_the_argument() -> None:
    """memory must be a bool (TypeError naming it); with mode='nvtx' there is no row for it."""
    t = Timer(name="bad")
    with pytest.raises(TypeError, match="memory must be a bool or None, got str"):
        t.region("r", memory="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="memory must be a bool or None, got int"):
        cudatimer.cuda_timed(lambda: None, name="f", memory=1)
    with pytest.raises(TypeError, match="memory must be a bool, got int"):
        cudatimer.instrument(torch.nn.Linear(2, 2), memory=1, timer=t)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="memory=True needs a row"):
        t.region("r", mode="nvtx", memory=True)


def _measured_run(gpu: FakeGPU, name: str, peak_mib: int) -> cudatimer.Summary:
    t = Timer(name=name)
    with t.region("step", memory=True):
        gpu.memory.temp(peak_mib * MiB)
        with t.region("inner"):
            pass
    return t.summary()


def test_json_csv_dataframe_and_html_carry_the_memory_columns(gpu: FakeGPU, tmp_path: Path) -> None:
    """JSON round trip exact; CSV and DataFrame fields mem_*_bytes (empty for unmeasured
    rows); the HTML page and the report carry the MiB columns."""
    s = _measured_run(gpu, "exports", 8)
    save(s, tmp_path / "run.json")
    assert cudatimer.load(tmp_path / "run.json") == s
    doc = json.loads((tmp_path / "run.json").read_text())
    assert doc["regions"][0]["values"]["mem_peak"]["max"] == 8 * MiB
    buf = io.StringIO()
    cudatimer.to_csv(buf, summary=s)
    rows = list(csv.DictReader(io.StringIO(buf.getvalue())))
    assert tuple(rows[0])[-4:] == FIELDS
    assert [rows[0][f] for f in FIELDS] == ["0.0", "0.0", str(8.0 * MiB), str(8.0 * MiB)]
    assert [rows[1][f] for f in FIELDS] == ["", "", "", ""]
    page = render_html(s)
    assert "mem peak MiB" in page and "mem delta MiB" in page
    table = render(s, columns=["region", "mem_delta", "mem_peak"], fmt="plain")
    assert table.splitlines()[1].split() == ["step", "0.00", "8.00"]
    assert render(s, view="tree").splitlines()[0].split()[-6:] == [
        "mem", "delta", "MiB", "mem", "peak", "MiB"
    ]  # fmt: skip
    pytest.importorskip("pandas")
    df = cudatimer.to_dataframe(summary=s).set_index("name")
    assert df.loc["step", "mem_peak_max_bytes"] == 8 * MiB


def test_compare_by_memory(gpu: FakeGPU) -> None:
    """compare --stat mem_peak: the peaks of both runs in MiB, with more/less verdicts."""
    base = _measured_run(gpu, "base", 8)
    new = _measured_run(gpu, "new", 16)
    text = render_compare(base, new, stat="mem_peak", fmt="plain")
    line = next(row for row in text.splitlines() if row.startswith("step"))
    assert line.split() == ["step", "cuda:0", "8.00", "16.00", "2.000", "2.00x", "more"]
    assert "base mem peak MiB" in text
    assert "2.00x less" in render_compare(new, base, stat="mem_peak")


def test_the_command_line_shows_and_compares_memory(
    gpu: FakeGPU, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """cudatimer show --columns mem_delta,mem_peak and compare --stat mem_delta."""
    save(_measured_run(gpu, "cli-a", 4), tmp_path / "a.json")
    save(_measured_run(gpu, "cli-b", 2), tmp_path / "b.json")
    assert main(["show", str(tmp_path / "a.json"), "--columns", "region,mem_delta,mem_peak"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["region", "mem", "delta", "MiB", "mem", "peak", "MiB"]
    assert out[2].split() == ["step", "0.00", "4.00"]
    args = ["compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--stat", "mem_peak"]
    assert main(args) == 0
    assert "2.00x less" in capsys.readouterr().out


def test_ranks_merge_memory_values(gpu: FakeGPU, tmp_path: Path) -> None:
    """Per-rank files merged: the cross-rank row holds every rank's calls; its table shows
    the most any call held."""
    for rank, peak in enumerate((4, 12)):
        save(_measured_run(gpu, f"rank{rank}", peak), tmp_path / f"rank{rank}.json")
    ranked = cd.merge_files([tmp_path / "rank0.json", tmp_path / "rank1.json"])
    assert ranked["step"].values["mem_peak"] == Tally(2, 16.0 * MiB, 4.0 * MiB, 12.0 * MiB)
    table = render_ranks(ranked)
    assert "mem peak MiB" in table and "12.00" in table
