"""Fixed records for report, export and CLI tests: a GPU-looking run built by hand, so the
CPU suite can check GPU rendering exactly, plus the snapshot helper."""

from __future__ import annotations

import dataclasses
import difflib
import os
from pathlib import Path

from cudatimer import Histogram, RegionStats, StepStats, Summary, SyncSite, TraceSample

SNAPSHOTS = Path(__file__).resolve().parent / "snapshots"


def _h(values: list[float]) -> Histogram:
    return Histogram.of(values)


def gpu_run() -> Summary:
    """Ten steps of a training loop on cuda:0, a host-side data loader and one sync site.

    train_step (100 ms of GPU per 10 calls) holds forward, backward and optimizer; forward
    holds attention (with 3 syncs) and mlp. optimizer is host-bound (host 3 ms per 1 ms of
    GPU). Everything below is exact arithmetic on short decimal lists.
    """
    regions = (
        RegionStats("train_step", "cuda:0", 10, _h([10.0] * 9 + [12.0]), _h([4.0] * 10)),
        RegionStats("train_step/forward", "cuda:0", 10, _h([4.0] * 10), _h([1.0] * 10), depth=1),
        RegionStats(
            "train_step/forward/attention",
            "cuda:0",
            40,
            _h([0.5] * 39 + [2.5]),
            _h([0.1] * 40),
            depth=2,
            syncs=3,
        ),
        RegionStats(
            "train_step/forward/mlp", "cuda:0", 40, _h([0.25] * 40), _h([0.1] * 40), depth=2
        ),
        RegionStats("train_step/backward", "cuda:0", 10, _h([5.0] * 10), _h([0.5] * 10), depth=1),
        RegionStats("train_step/optimizer", "cuda:0", 10, _h([0.5] * 10), _h([1.5] * 10), depth=1),
        RegionStats("data", "host", 10, None, _h([2.0] * 8 + [3.0, 5.0])),
    )
    sites = (
        SyncSite("train.py:42", "item", "train_step/forward/attention", 3),
        SyncSite("train.py:57", "cpu", "train_step", 1),
    )
    step_stats = (
        *(
            StepStats(step, name, "cuda:0", 1, gpu, cpu)
            for step in (0, 1)
            for name, gpu, cpu in (
                ("train_step", 10.0 + 2 * step, 4.0),
                ("train_step/forward", 4.0, 1.0),
            )
        ),
        StepStats(1, "data", "host", 1, None, 2.0),
    )
    trace = (
        TraceSample("data", "host", 0, 11, "MainThread", 0.0, 2.0),
        TraceSample("train_step", "cuda:0", 0, 11, "MainThread", 2.0, 4.0, 7, 2.5, 10.0),
        TraceSample("train_step/forward", "cuda:0", 0, 11, "MainThread", 2.25, 1.0, 7, 3.0, 4.0),
        TraceSample(
            "train_step/forward/attention", "cuda:0", 0, 11, "MainThread", 2.5, 0.1, 7, 3.5, 0.5
        ),
        TraceSample("train_step/backward", "cuda:0", 0, 11, "MainThread", 3.5, 0.5, 7, 7.0, 5.0),
        TraceSample("loader", "host", 0, 12, "worker-1", 0.5, 1.0),
    )
    return Summary(
        regions=regions,
        steps=10,
        meta=(("timer", "default"), ("torch", "2.11.0")),
        sync_sites=sites,
        step_stats=step_stats,
        trace=trace,
    )


def gpu_run_after() -> Summary:
    """``gpu_run`` after a change: attention 2x faster, mlp 1.5x slower, the data loader gone,
    a new rope region; the rest within 1%."""
    base = {r.name: r for r in gpu_run().regions}
    attention = dataclasses.replace(
        base["train_step/forward/attention"], gpu=_h([0.25] * 39 + [1.25])
    )
    mlp = dataclasses.replace(base["train_step/forward/mlp"], gpu=_h([0.375] * 40))
    step = dataclasses.replace(base["train_step"], gpu=_h([10.05] * 9 + [12.05]))
    rope = RegionStats("train_step/forward/rope", "cuda:0", 10, _h([0.1] * 10), _h([0.05] * 10))
    regions = (
        step,
        base["train_step/forward"],
        attention,
        mlp,
        rope,
        base["train_step/backward"],
        base["train_step/optimizer"],
    )
    return dataclasses.replace(gpu_run(), regions=regions, sync_sites=(), step_stats=(), trace=())


def host_run(scale: float = 1.0) -> Summary:
    """A CPU-only run: every region on the host clock (times multiplied by ``scale``)."""
    return Summary(
        regions=(
            RegionStats("epoch", "host", 2, None, _h([50.0 * scale, 50.0 * scale])),
            RegionStats("epoch/load", "host", 20, None, _h([1.0 * scale] * 20), depth=1),
            RegionStats("epoch/compute", "host", 20, None, _h([4.0 * scale] * 20), depth=1),
        ),
        steps=2,
        meta=(("timer", "default"),),
    )


def normalise(text: str) -> str:
    """Snapshot form: no trailing spaces, one final newline."""
    return "\n".join(line.rstrip() for line in text.strip("\n").splitlines()) + "\n"


def assert_snapshot(name: str, text: str) -> None:
    """Compare with tests/helpers/snapshots/<name>; CUDATIMER_UPDATE_SNAPSHOTS=1 rewrites it."""
    path = SNAPSHOTS / name
    got = normalise(text)
    if os.environ.get("CUDATIMER_UPDATE_SNAPSHOTS") == "1":
        SNAPSHOTS.mkdir(exist_ok=True)
        path.write_text(got, encoding="utf-8")
        return
    assert path.exists(), f"no snapshot {path}; run with CUDATIMER_UPDATE_SNAPSHOTS=1 and review"
    want = path.read_text(encoding="utf-8")
    if got != want:
        diff = "".join(
            difflib.unified_diff(
                want.splitlines(True), got.splitlines(True), "snapshot", "rendered"
            )
        )
        raise AssertionError(f"{name} differs from its snapshot:\n{diff}")
