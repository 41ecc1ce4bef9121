"""memory_every: one episode in N measured (an episode: from an outermost memory region's call
until no memory call is open), through the fake GPU's allocator history. The measured calls
read exactly as with every call measured; the episodes between mark nothing and, after a long
measured episode, record nothing (the history is turned off); the rows and the report say how
many calls were measured; an out-of-memory error in an episode not measured still names the
open regions."""

from __future__ import annotations

import io
import sys
import threading
from collections.abc import Iterator

import pytest
import torch

import cudatimer
from cudatimer import Timer
from cudatimer.records._values import Tally
from cudatimer.render._report import render
from cudatimer.sources import _memory
from tests.helpers.fake_cuda import FakeGPU, install
from tests.helpers.memory_net import Keep, KeepNet

MiB = 1 << 20
N = _memory.MEMORY_EVERY


@pytest.fixture
def gpu() -> Iterator[FakeGPU]:
    with install() as fake:
        yield fake


@pytest.fixture
def pause_always(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every measured episode counts as long: its end reads and turns the history off."""
    monkeypatch.setattr(_memory, "PAUSE_AFTER_S", 0.0)


@pytest.fixture
def pause_never(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_memory, "PAUSE_AFTER_S", 1e9)


def _tallies(t: Timer, name: str) -> tuple[Tally, Tally]:
    row = t.summary()[name]
    return row.values["mem_delta"], row.values["mem_peak"]


def test_the_default_measures_one_outermost_call_in_n_with_its_children(gpu: FakeGPU) -> None:
    """2N calls of an outer region with a child: calls 0 and N are measured, outer and child
    alike, with exactly their own bytes; the others carry nothing and mark nothing."""
    assert N > 1
    t = Timer(name="default")
    mem = gpu.memory
    kept = []
    for i in range(2 * N):
        with t.region("outer", memory=True):
            kept.append(mem.alloc((i + 1) * MiB))
            with t.region("inner", memory=True):
                mem.temp(2 * (i + 1) * MiB)
    outer, outer_peak = _tallies(t, "outer")
    inner, inner_peak = _tallies(t, "outer/inner")
    assert outer == Tally(2, (1 + N + 1) * float(MiB), 1.0 * MiB, (N + 1.0) * MiB)
    assert outer_peak == Tally(2, 3.0 * (N + 2) * MiB, 3.0 * MiB, 3.0 * (N + 1) * MiB)
    assert inner == Tally(2, 0.0, 0.0, 0.0)
    assert inner_peak.max == 2.0 * (N + 1) * MiB
    assert mem.tags == 2 * 2 * 2  # two boundaries a call, two calls, two episodes
    s = t.summary()
    assert s["outer"].calls == 2 * N
    note = dict(s.meta)["memory_note"]
    assert f"memory_every={N}" in note and f"{2 * (2 * N - 2)} call(s) were not" in note
    table = render(s, fmt="plain").splitlines()
    assert table[0].split()[-2:] == ["mem", "calls"]
    assert table[1].split()[-1] == "2"


def test_memory_every_1_measures_every_call(gpu: FakeGPU) -> None:
    """memory_every=1: every call measured, no sampling note, no 'mem calls' column."""
    t = Timer(name="all")
    for _ in range(2 * N):
        with t.region("r", memory=True, memory_every=1):
            gpu.memory.alloc(MiB)
    s = t.summary()
    assert s["r"].values["mem_delta"].count == 2 * N
    assert "memory_note" not in dict(s.meta)
    assert "mem calls" not in render(s)


def test_each_outermost_region_counts_its_own_episodes(gpu: FakeGPU) -> None:
    """Two regions called in turn (a forward and a backward, say): each is measured at its
    own calls 0 and 3 with memory_every=3, so both in the same iterations."""
    t = Timer(name="two-roots")
    for i in range(6):
        with t.region("a", memory=True, memory_every=3):
            gpu.memory.alloc((i + 1) * MiB)
        with t.region("b", memory=True, memory_every=3):
            gpu.memory.alloc(10 * (i + 1) * MiB)
    assert _tallies(t, "a")[0] == Tally(2, 5.0 * MiB, 1.0 * MiB, 4.0 * MiB)
    assert _tallies(t, "b")[0] == Tally(2, 50.0 * MiB, 10.0 * MiB, 40.0 * MiB)


def test_a_long_measured_episode_turns_the_history_off_until_the_next(
    gpu: FakeGPU, pause_always: None
) -> None:
    """After a measured episode the history is read and turned off: the episodes between
    record no event; the next measured one turns it on again and reads exactly its own bytes,
    though the ones between left memory allocated."""
    t = Timer(name="pause")
    mem = gpu.memory
    kept = []
    for i in range(N + 1):
        with t.region("step", memory=True):
            kept.append(mem.alloc(MiB))
            mem.temp(4 * MiB)
        if i == 0:
            assert (mem.pauses, mem.recording) == (1, False)
            recorded = mem.recorded
        elif i < N:
            assert mem.recorded == recorded  # nothing recorded between measured episodes
    assert (mem.pauses, mem.resumes) == (2, 1)
    assert _tallies(t, "step") == (Tally.of([MiB, MiB]), Tally.of([5 * MiB, 5 * MiB]))


def test_short_episodes_leave_the_history_on_and_read_right(
    gpu: FakeGPU, pause_never: None
) -> None:
    """Short measured episodes: the history stays on (never turned off); the events of the
    episodes between are read too and counted in no call."""
    t = Timer(name="no-pause")
    mem = gpu.memory
    kept = []
    for _ in range(2 * N):
        with t.region("step", memory=True):
            kept.append(mem.alloc(3 * MiB))
    assert mem.pauses == 0
    assert _tallies(t, "step")[0] == Tally.of([3 * MiB, 3 * MiB])


def test_the_program_s_own_history_is_never_turned_off(gpu: FakeGPU, pause_always: None) -> None:
    """A history the program records itself: sampled episodes are read from it, nothing is
    paused, and the measured calls read right."""
    mem = gpu.memory
    mem.owned = False
    t = Timer(name="theirs")
    for i in range(N + 1):
        with t.region("step", memory=True):
            mem.alloc((i + 1) * MiB)
    assert mem.pauses == 0
    assert _tallies(t, "step")[0] == Tally.of([MiB, (N + 1) * MiB])


@pytest.mark.parametrize("pause", [False, True])
def test_instrument_samples_forward_and_backward_of_the_same_steps(
    gpu: FakeGPU, monkeypatch: pytest.MonkeyPatch, pause: bool
) -> None:
    """2N training steps with the default: every forward and backward row measured twice
    (steps 0 and N), with the values of a step measured alone; the rows count every call."""
    monkeypatch.setattr(_memory, "PAUSE_AFTER_S", 0.0 if pause else 1e9)
    Keep.mem = gpu.memory
    t = Timer(name="train")
    net = KeepNet()
    with cudatimer.instrument(net, backward=True, memory=True, timer=t):
        for _ in range(2 * N):
            net(torch.ones(2)).sum().backward()
            t.step()
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
    assert all(r.values["mem_delta"].count == 2 and r.calls == 2 * N for r in s.regions)
    assert t.summary(steps=[N])["KeepNet.backward/a"].values["mem_delta"].count == 1
    assert not t.summary(steps=[1])["KeepNet"].values
    assert (gpu.memory.pauses > 0) == pause


def test_another_thread_s_calls_follow_the_episode_they_open_in(
    gpu: FakeGPU, pause_always: None
) -> None:
    """A call opened on another thread while an episode is open belongs to it: measured in a
    measured episode, not in one that is not."""
    t = Timer(name="threads")
    mem = gpu.memory

    def worker() -> None:
        with t.region("worker", memory=True):
            mem.alloc(7 * MiB)

    for _ in range(2):
        with t.region("main", memory=True, memory_every=2):
            th = threading.Thread(target=worker)
            th.start()
            th.join()
    assert _tallies(t, "worker")[0] == Tally.of([7 * MiB])
    assert t.summary()["worker"].calls == 2


def test_reset_counts_episodes_anew(gpu: FakeGPU) -> None:
    """After reset() the next call of a region is measured again (its first episode)."""
    t = Timer(name="reset")
    for _ in range(2):
        with t.region("r", memory=True):
            gpu.memory.alloc(MiB)
    t.reset()
    with t.region("r", memory=True):
        gpu.memory.alloc(2 * MiB)
    assert _tallies(t, "r")[0] == Tally.of([2 * MiB])


def test_out_of_memory_in_an_episode_not_measured_names_the_open_regions(
    gpu: FakeGPU, pause_always: None
) -> None:
    """The error's note and the next report name the regions open, saying they were not
    measured in this call, with the device's allocated bytes."""
    t = Timer(name="oom")
    mem = gpu.memory
    mem.capacity = 1024 * MiB
    with t.region("outer", memory=True):
        pass
    with pytest.raises(torch.OutOfMemoryError) as info, t.region("outer", memory=True):
        held = mem.alloc(600 * MiB)
        with t.region("inner", memory=True):
            mem.alloc(600 * MiB)
    mem.free(held)
    expected = (
        f"outer (not measured in this call: memory_every={N}); "
        f"outer/inner (not measured in this call: memory_every={N})"
    )
    if sys.version_info >= (3, 11):
        notes = info.value.__notes__
        assert len(notes) == 1 and expected in notes[0]
        assert "cuda:0 had 600.0 MiB allocated" in notes[0]
    assert expected in t.report(file=io.StringIO())


def test_bad_memory_every_names_the_argument() -> None:
    """memory_every: an int >= 1 (TypeError, ValueError naming it), and only with memory=True."""
    t = Timer(name="bad-every")
    with pytest.raises(TypeError, match=r"memory_every must be an int N >= 1 .* got str"):
        t.region("r", memory=True, memory_every="2")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"memory_every must be an int N >= 1 .* got bool"):
        t.region("r", memory=True, memory_every=True)
    with pytest.raises(ValueError, match=r"memory_every must be >= 1 .* got 0"):
        cudatimer.cuda_region("r", memory=True, memory_every=0)
    with pytest.raises(ValueError, match="memory_every=4 needs memory=True"):
        t.region("r", memory_every=4)
    with pytest.raises(ValueError, match=r"memory_every must be >= 1 .* got -1"):
        cudatimer.instrument(torch.nn.Linear(2, 2), memory=True, memory_every=-1, timer=t)
    with pytest.raises(ValueError, match="memory_every=2 needs memory=True"):
        cudatimer.instrument(torch.nn.Linear(2, 2), memory_every=2, timer=t)


def test_a_region_run_inside_a_read_neither_hangs_nor_loses_a_call(
    gpu: FakeGPU, pause_always: None
) -> None:
    """A memory region entered and left while the history is read at an episode's end (as a
    finalizer the garbage collector runs there can): no deadlock, both calls measured."""
    t = Timer(name="reentrant")
    mem = gpu.memory
    real = mem.read
    fired: list[bool] = []

    def read() -> tuple[dict[int, list[tuple[str, int]]], set[int]]:
        if not fired:
            fired.append(True)
            with t.region("nested", memory=True):
                mem.alloc(MiB)
        return real()

    mem.read = read  # type: ignore[method-assign]

    def run() -> None:
        with t.region("outer", memory=True):
            mem.alloc(2 * MiB)

    th = threading.Thread(target=run, daemon=True)
    th.start()
    th.join(10.0)
    assert not th.is_alive() and fired
    assert _tallies(t, "outer")[0] == Tally.of([2 * MiB])
    assert _tallies(t, "outer/nested")[0] == Tally.of([MiB])  # entered before outer left
