"""The performance gate: verdicts on runs of known distributions, pooled and per-rank baselines,
the device check, ``compare --max-slowdown`` exit codes and JSON, the HTML verdicts, and the
``cudatimer_gate`` pytest fixture end to end."""

from __future__ import annotations

import json
import math
import os
import random
import re
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import cudatimer
from cudatimer import Histogram, RegionStats, StepStats, Summary
from cudatimer._cli import EXIT_SLOWER, main
from cudatimer.render._export import save
from cudatimer.render._html import render_html

ROOT = Path(__file__).resolve().parents[2]


def run(
    regions: dict[str, list[float]],
    *,
    device: str = "CPU Test 9000",
    host: str = "ci-1",
    steps: bool = True,
) -> Summary:
    """A host-clock run whose region ``name`` took ``values[k]`` ms in step ``k`` (one call a
    step); ``steps=False``: no per-step records (per-call samples only)."""
    records = tuple(
        RegionStats(name, "host", len(v), None, Histogram.of(v)) for name, v in regions.items()
    )
    count = max(len(v) for v in regions.values())
    rows = tuple(
        StepStats(k, name, "host", 1, None, v[k])
        for k in range(count)
        for name, v in regions.items()
        if k < len(v)
    )
    return Summary(
        regions=records,
        steps=count if steps else 0,
        meta=(("device", device), ("host", host)),
        step_stats=rows if steps else (),
    )


def lognormal(seed: int, n: int = 50, ms: float = 5.0, sigma: float = 0.02) -> list[float]:
    rng = random.Random(seed)
    return [ms * rng.lognormvariate(0.0, sigma) for _ in range(n)]


def verdict(c: cudatimer.Comparison, name: str) -> cudatimer.RegionVerdict:
    (item,) = [v for v in c.items if v.name == name]
    return item


# -- verdicts --------------------------------------------------------------------------------
def test_every_verdict_on_known_distributions() -> None:
    """Same, slower, faster, undecided (noisy, too few) and only-in on lognormal runs."""
    base = run(
        {
            "same": lognormal(1),
            "slower": lognormal(2),
            "faster": lognormal(3),
            "noisy": lognormal(4, sigma=0.6),
            "few": lognormal(5, n=3),
            "gone": lognormal(6),
        }
    )
    new = run(
        {
            "same": lognormal(11),
            "slower": [1.25 * x for x in lognormal(12)],
            "faster": [0.75 * x for x in lognormal(13)],
            "noisy": lognormal(14, sigma=0.6),
            "few": lognormal(15, n=3),
            "added": lognormal(16),
        }
    )
    c = cudatimer.compare(base, new, max_slowdown=0.05, absolute=True)
    got = {v.name: v.verdict for v in c.items}
    assert got == {
        "same": "same",
        "slower": "slower",
        "faster": "faster",
        "noisy": "undecided",
        "few": "undecided",
        "gone": "only in base",
        "added": "only in new",
    }
    assert verdict(c, "noisy").reason == "too noisy"
    assert verdict(c, "few").reason.startswith("too few samples")
    assert [v.name for v in c.regressions] == ["slower"]
    assert [v.name for v in c.improvements] == ["faster"]
    assert {v.name for v in c.undecided} == {"noisy", "few"}
    assert {v.name for v in c.missing} == {"gone", "added"}
    assert not c.ok
    slow = verdict(c, "slower")
    assert slow.interval is not None and 1.0 < slow.interval[0] < 1.25 < slow.interval[1]
    assert slow.base == slow.base_ms and slow.new == slow.new_ms
    assert slow.ratio == pytest.approx(slow.new_ms / slow.base_ms)
    assert slow.samples == "steps" and (slow.base_n, slow.new_n) == (50, 50)


# -- the run-wide speed factor -----------------------------------------------------------------
NAMES = [f"r{i}" for i in range(8)]


def machine(seed: int, speed: float = 1.0, slowed: dict[str, float] | None = None) -> Summary:
    """8 regions of 2-9 ms (sigma 1%), all ``speed`` times slower, and ``slowed`` regions
    that much slower again."""
    slowed = slowed or {}
    return run(
        {
            n: [
                speed * slowed.get(n, 1.0) * x
                for x in lognormal(seed * 10 + i, ms=2 + i, sigma=0.01)
            ]
            for i, n in enumerate(NAMES)
        }
    )


def test_a_uniform_speed_drift_is_same_and_reported() -> None:
    """The whole new run 3% slower: every region 'same'; 15% slower: none slower (regions
    may follow a large drift unlike each other: undecided), the factor reported with a
    warning; absolute=True calls every region slower."""
    small = cudatimer.compare(machine(1), machine(2, speed=1.03), max_slowdown=0.05)
    assert {v.verdict for v in small.items} == {"same"} and small.ok
    assert small.speed[0].factor == pytest.approx(1.03, rel=0.01)
    base, new = machine(1), machine(2, speed=1.15)
    c = cudatimer.compare(base, new, max_slowdown=0.05)
    assert c.ok and not c.regressions and {v.verdict for v in c.items} <= {"same", "undecided"}
    (speed,) = c.speed
    assert speed.used and speed.regions == 8 and speed.factor == pytest.approx(1.15, rel=0.01)
    assert not c.absolute
    for v in c.items:
        assert v.factor == pytest.approx(1.15, rel=0.01)
        assert v.raw_ratio == pytest.approx(v.new_ms / v.base_ms)
        assert v.ratio == pytest.approx(v.raw_ratio / v.factor)
    text = cudatimer.compare_report(c)
    assert text.splitlines()[0].startswith(
        "cudatimer: gate passed (max slowdown 5%, speed factor 1.15"
    )
    assert "vs speed" in text.splitlines()[1]
    assert "warning: the whole new run (host) ran 15" in text and "absolute" in text
    raw = cudatimer.compare(base, new, max_slowdown=0.05, absolute=True)
    assert {v.verdict for v in raw.items} == {"slower"} and raw.absolute
    assert [f.used for f in raw.speed] == [False] and all(v.factor == 1.0 for v in raw.items)
    assert "vs speed" not in cudatimer.compare_report(raw)


def test_one_region_slowed_against_the_others_is_caught_under_drift() -> None:
    """The machine 4% faster in new and one region 10% slower than that: it alone is
    slower, at ratio ~1.10 against the others (1.056 raw)."""
    base, new = machine(3), machine(4, speed=0.96, slowed={"r5": 1.10})
    c = cudatimer.compare(base, new, max_slowdown=0.05)
    assert [v.name for v in c.regressions] == ["r5"]
    assert {v.verdict for v in c.items if v.name != "r5"} <= {"same", "undecided"}
    r5 = verdict(c, "r5")
    assert r5.ratio == pytest.approx(1.10, rel=0.02)
    assert r5.raw_ratio == pytest.approx(1.056, rel=0.02)
    assert r5.factor == pytest.approx(0.96, rel=0.01)


def test_a_region_that_does_not_follow_a_large_drift_is_not_called_slower() -> None:
    """The others 1.5x faster, one region (a sleep) unchanged: its ratio against them reads
    1.5, but regions follow the machine unlike each other, so it is undecided, not slower."""
    base = machine(5)
    new = machine(6, speed=1 / 1.5, slowed={"r0": 1.5})
    v = verdict(cudatimer.compare(base, new, max_slowdown=0.05), "r0")
    assert v.ratio == pytest.approx(1.5, rel=0.03)
    assert v.verdict == "undecided" and v.reason == "too noisy"


def test_html_shows_the_speed_factor_column() -> None:
    """The page's gate table has the raw ratio and the one divided by the speed factor."""
    base, new = machine(1), machine(2, speed=1.03)
    table = _page_doc(render_html(new, base=base, max_slowdown=0.05))["compare"]
    assert isinstance(table, dict)
    titles = [c[1] for c in table["columns"]]
    assert titles[4:6] == ["new/base", "vs speed"]
    assert any("speed factor new/base (host): 1.03" in n for n in table["notes"])
    raw = _page_doc(render_html(new, base=base, max_slowdown=0.05, absolute=True))["compare"]
    assert isinstance(raw, dict) and "vs speed" not in [c[1] for c in raw["columns"]]


def test_the_comparison_of_two_long_runs_of_many_regions_is_fast() -> None:
    """Two 1,000-step runs of 200 regions compare (after loading) in under 2 s."""
    rng = random.Random(0)

    def long_run() -> Summary:
        values = {
            f"b{i // 10}/l{i % 10}": [rng.lognormvariate(0.0, 0.1) for _ in range(1000)]
            for i in range(200)
        }
        return run(values)

    base, new = long_run(), long_run()
    best_s = math.inf
    for _ in range(3):
        t0 = time.perf_counter()
        c = cudatimer.compare(base, new, max_slowdown=0.05)
        best_s = min(best_s, time.perf_counter() - t0)
    assert c.tested == 200 and c.speed[0].used
    assert best_s < 2.0


def test_too_few_regions_for_a_speed_factor_keep_raw_ratios() -> None:
    """Three regions: raw ratios, the factor reported as not used, and a note says why."""
    base = run({n: lognormal(i) for i, n in enumerate(NAMES[:3])})
    new = run({n: [1.2 * x for x in lognormal(10 + i)] for i, n in enumerate(NAMES[:3])})
    c = cudatimer.compare(base, new, max_slowdown=0.05)
    assert len(c.regressions) == 3 and [f.used for f in c.speed] == [False]
    assert all(v.factor == 1.0 and v.ratio == v.raw_ratio for v in c.items)
    assert "fewer than 4, too few for a run-wide speed factor" in cudatimer.compare_report(c)


def test_pooled_runs_measure_the_spread_between_runs_after_the_speed_factor() -> None:
    """Base runs whose whole-machine speed differs by 10%: their normalised statistics agree,
    so a 10% slowdown of one region is still caught; raw ratios leave it undecided."""
    bases = [machine(7 + j, speed=s) for j, s in enumerate((0.95, 1.0, 1.05))]
    new = machine(12, speed=1.02, slowed={"r3": 1.10})
    c = cudatimer.compare(bases, new, max_slowdown=0.05)
    assert [v.name for v in c.regressions] == ["r3"] and verdict(c, "r3").base_runs == 3
    raw = verdict(cudatimer.compare(bases, new, max_slowdown=0.05, absolute=True), "r3")
    assert raw.verdict == "undecided"


def test_between_run_widens_the_intervals(files: dict[str, str]) -> None:
    """A larger assumed spread between runs widens every interval; bad values are refused."""
    narrow = verdict(cudatimer.compare(files["base"], files["same"], between_run=0.0), "a")
    wide = verdict(cudatimer.compare(files["base"], files["same"], between_run=0.03), "a")
    assert narrow.interval is not None and wide.interval is not None
    assert wide.interval[1] - wide.interval[0] > 3 * (narrow.interval[1] - narrow.interval[0])
    with pytest.raises(ValueError, match="between_run"):
        cudatimer.compare(files["base"], files["same"], between_run=1.5)
    with pytest.raises(TypeError, match="between_run"):
        cudatimer.compare(files["base"], files["same"], between_run="x")


def test_absolute_on_the_command_line_and_the_speed_in_json(tmp_path: Path) -> None:
    """compare exits 0 on a uniform drift and 3 with --absolute; --json carries the factor."""
    save(machine(1), tmp_path / "base.json")
    save(machine(2, speed=1.15), tmp_path / "new.json")
    argv = [
        "compare",
        str(tmp_path / "base.json"),
        str(tmp_path / "new.json"),
        "--max-slowdown",
        "0.05",
    ]
    assert main([*argv, "--json", str(tmp_path / "n.json")]) == 0
    assert main([*argv, "--absolute", "--json", str(tmp_path / "a.json")]) == EXIT_SLOWER
    doc = json.loads((tmp_path / "n.json").read_text())
    assert doc["absolute"] is False and doc["between_run"] == 0.005
    (speed,) = doc["speed"]
    assert (
        speed["used"] and speed["regions"] == 8 and speed["factor"] == pytest.approx(1.15, rel=0.01)
    )
    r = doc["regions"][0]
    assert r["ratio"] == pytest.approx(r["raw_ratio"] / r["factor"])
    assert r["raw_ratio"] == pytest.approx(r["new_ms"] / r["base_ms"])
    absolute = json.loads((tmp_path / "a.json").read_text())
    assert absolute["absolute"] is True and absolute["speed"][0]["used"] is False
    assert absolute["counts"]["slower"] == 8


def test_a_small_significant_change_within_max_slowdown_is_same() -> None:
    """A 2% slowdown measured to +-0.5% is 'same' at max_slowdown 5%, 'slower' at 1%."""
    base = run({"r": lognormal(1, n=200, sigma=0.01)})
    new = run({"r": [1.02 * x for x in lognormal(2, n=200, sigma=0.01)]})
    loose = verdict(cudatimer.compare(base, new, max_slowdown=0.05), "r")
    assert loose.verdict == "same" and loose.low is not None and loose.low > 1.0
    assert verdict(cudatimer.compare(base, new, max_slowdown=0.01), "r").verdict == "slower"


def test_per_call_samples_where_no_steps_were_marked() -> None:
    """Without per-step records the gate reads per-call durations from the histograms."""
    base = run({"r": lognormal(1, n=400)}, steps=False)
    new = run({"r": [1.3 * x for x in lognormal(2, n=400)]}, steps=False)
    v = verdict(cudatimer.compare(base, new), "r")
    assert (v.verdict, v.samples, v.base_n) == ("slower", "calls", 400)
    same = verdict(cudatimer.compare(base, run({"r": lognormal(3, n=400)}, steps=False)), "r")
    assert same.verdict == "same"


def test_each_statistic_and_too_few_samples_for_p99() -> None:
    """mean, per_step and p90 gate a 25% slowdown; p99 of 50 steps has no interval."""
    base, new = run({"r": lognormal(1)}), run({"r": [1.25 * x for x in lognormal(2)]})
    for stat in ("mean", "per_step", "p90"):
        assert verdict(cudatimer.compare(base, new, stat=stat), "r").verdict == "slower", stat
    p99 = verdict(cudatimer.compare(base, new, stat="p99"), "r")
    assert p99.verdict == "undecided" and p99.reason.startswith("too few samples for p99")
    calls = verdict(
        cudatimer.compare(run({"r": [1.0] * 9}, steps=False), new, stat="per_step"), "r"
    )
    assert calls.verdict == "undecided" and "per_step needs steps" in calls.reason


def test_runs_of_different_lengths_compare_fairly() -> None:
    """A run of 400 steps against one of 50 of the same program: same, not 8x slower."""
    c = cudatimer.compare(run({"r": lognormal(1)}), run({"r": lognormal(2, n=400)}))
    assert verdict(c, "r").verdict == "same"
    assert (verdict(c, "r").base_n, verdict(c, "r").new_n) == (50, 400)


def test_bonferroni_over_the_regions_tested() -> None:
    """Each interval is at 1 - (1 - confidence) / k for the k regions tested."""
    names = [f"r{i}" for i in range(8)]
    base = run({n: lognormal(i) for i, n in enumerate(names)} | {"few": [1.0, 1.0]})
    new = run({n: lognormal(10 + i) for i, n in enumerate(names)} | {"few": [1.0, 1.0]})
    c = cudatimer.compare(base, new, confidence=0.9)
    assert c.tested == 8
    assert c.region_confidence == pytest.approx(1 - 0.1 / 8)
    one = cudatimer.compare(run({"r0": lognormal(0)}), run({"r0": lognormal(10)}), confidence=0.9)
    wide, narrow = verdict(c, "r0"), verdict(one, "r0")
    assert wide.interval is not None and narrow.interval is not None
    assert wide.interval[1] - wide.interval[0] > 1.3 * (narrow.interval[1] - narrow.interval[0])


def test_drift_within_a_run_widens_the_interval() -> None:
    """Steps that drift in time (a ramp) give a wider interval than the same steps shuffled:
    the batch-means factor sees neighbouring steps alike."""
    ramp = [4.5 + k / 50 for k in range(50)]
    shuffled = ramp[:]
    random.Random(0).shuffle(shuffled)
    new = run({"r": lognormal(1, ms=5.0, sigma=0.001)})
    drift = verdict(cudatimer.compare(run({"r": ramp}), new), "r").interval
    flat = verdict(cudatimer.compare(run({"r": shuffled}), new), "r").interval
    assert drift is not None and flat is not None
    assert math.log(drift[1] / drift[0]) > 1.5 * math.log(flat[1] / flat[0])


def test_the_step_in_progress_is_left_out() -> None:
    """A whole-run summary's step in progress (step == steps) is not a sample."""
    timer = cudatimer.Timer(name="progress", clock="host")
    for _ in range(6):
        with timer.region("r"):
            pass
        timer.step()
    with timer.region("r"):  # the 7th step, never finished
        pass
    s = timer.summary(step_stats=True)
    v = verdict(cudatimer.compare(s, s), "r")
    assert (v.samples, v.base_n) == ("steps", 6)


def test_match_and_min_ms_restrict_the_gate() -> None:
    """--match keeps matching regions only; --min-ms ignores regions small in both runs."""
    base = run({"fwd/attn": lognormal(1), "fwd/mlp": lognormal(2), "tiny": lognormal(3, ms=0.01)})
    new = run(
        {
            "fwd/attn": lognormal(4),
            "fwd/mlp": [2 * x for x in lognormal(5)],
            "tiny": lognormal(6, ms=0.05),
        }
    )
    everything = cudatimer.compare(base, new)
    assert {v.name for v in everything.regressions} == {"fwd/mlp", "tiny"}
    attn = cudatimer.compare(base, new, match="*attn")
    assert [v.name for v in attn.items] == ["fwd/attn"] and attn.ok and attn.ignored == 2
    big = cudatimer.compare(base, new, min_ms=0.1)
    assert {v.name for v in big.items} == {"fwd/attn", "fwd/mlp"} and big.ignored == 1
    grown = cudatimer.compare(base, new, min_ms=0.03)  # tiny grew past it in new: kept
    assert "tiny" in {v.name for v in grown.regressions}


# -- pooled and per-rank baselines ------------------------------------------------------------
def test_pooled_baselines_measure_the_spread_between_runs(tmp_path: Path) -> None:
    """Base runs that differ by 10% from run to run: one of them calls a 5% change slower,
    the three pooled (a folder) leave it undecided, with base_runs 3 and pooled samples."""
    folder = tmp_path / "main"
    for i, ms in enumerate((4.8, 5.3, 5.8)):
        save(run({"r": lognormal(i, ms=ms, sigma=0.01)}), folder / f"run{i}.json")
    new = run({"r": lognormal(9, ms=5.55, sigma=0.01)})
    single = verdict(cudatimer.compare(folder / "run1.json", new), "r")
    assert single.verdict == "slower"
    pooled = verdict(cudatimer.compare(folder, new), "r")
    assert pooled.verdict == "undecided" and pooled.base_runs == 3 and pooled.base_n == 150
    files = verdict(cudatimer.compare(sorted(folder.iterdir()), new), "r")
    assert files == pooled
    runs = [cudatimer.load(p) for p in sorted(folder.iterdir())]
    all_steps = sorted(x.cpu_ms for s in runs for x in s.step_stats)
    assert pooled.base_ms == pytest.approx((all_steps[74] + all_steps[75]) / 2)


def _ranks(folder: Path, slow_rank: int | None) -> None:
    for rank in range(2):
        factor = 1.5 if rank == slow_rank else 1.0
        save(run({"step": [factor * x for x in lognormal(rank)]}), folder / f"rank{rank}.json")


def test_per_rank_folders_compare_rank_by_rank(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Folders of rank{N}.json compare rank by rank: the slowed rank alone is slower."""
    _ranks(tmp_path / "base", None)
    _ranks(tmp_path / "new", 1)
    c = cudatimer.compare(tmp_path / "base", tmp_path / "new")
    assert [(v.rank, v.verdict) for v in c.items] == [(0, "same"), (1, "slower")]
    assert [v.rank for v in c.regressions] == [1] and c.tested == 2
    assert (
        main(["compare", str(tmp_path / "base"), str(tmp_path / "new"), "--max-slowdown", "0.05"])
        == EXIT_SLOWER
    )
    out = capsys.readouterr().out
    assert out.splitlines()[1].split()[:2] == ["rank", "region"]
    with pytest.raises(ValueError, match="per-rank files"):
        cudatimer.compare(tmp_path / "base", tmp_path / "new" / "rank0.json")


# -- the device check -----------------------------------------------------------------------------
def test_runs_of_different_devices_are_refused_unless_allowed(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Different device names: refused (exit 1, both named), or compared with a warning."""
    save(run({"r": lognormal(1)}, device="NVIDIA H200"), tmp_path / "a.json")
    save(run({"r": lognormal(2)}, device="NVIDIA A100", host="ci-2"), tmp_path / "b.json")
    argv = ["compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--max-slowdown", "0.05"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "NVIDIA H200" in err and "NVIDIA A100" in err and "--allow-other-device" in err
    assert main([*argv, "--allow-other-device"]) == 0
    out = capsys.readouterr().out
    assert "warning: base ran on NVIDIA H200, new on NVIDIA A100" in out
    assert "base ran on host ci-1, new on ci-2" in out
    with pytest.raises(ValueError, match="allow_other_device"):
        cudatimer.compare(tmp_path / "a.json", tmp_path / "b.json")


def test_a_summary_records_its_device_and_host() -> None:
    """A Timer's summary names the device (the CPU's model here) and the host."""
    timer = cudatimer.Timer(name="where", clock="host")
    with timer.region("r"):
        pass
    meta = dict(timer.summary().meta)
    assert meta["device"].startswith("CPU ") and len(meta["device"]) > 4
    assert meta["host"] == socket.gethostname()


# -- the command line -----------------------------------------------------------------------
@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    out = {}
    for key, regions in {
        "base": {"a": lognormal(1), "b": lognormal(2)},
        "same": {"a": lognormal(3), "b": lognormal(4)},
        "slow": {"a": lognormal(5), "b": [1.3 * x for x in lognormal(6)]},
        "noisy": {"a": lognormal(7), "b": lognormal(8, sigma=0.6)},
        "missing": {"a": lognormal(9)},
    }.items():
        save(run(regions), tmp_path / f"{key}.json")
        out[key] = str(tmp_path / f"{key}.json")
    return out


def test_lower_quantiles_gate_from_the_command_line(files: dict[str, str]) -> None:
    """--stat p25 gates the first quartile; p10 of 50 steps has no interval (undecided)."""
    gate = ["--max-slowdown", "0.05"]
    assert main(["compare", files["base"], files["slow"], *gate, "--stat", "p25"]) == 3
    c = cudatimer.compare(files["base"], files["slow"], stat="p10")
    assert {v.verdict for v in c.items} == {"undecided"}
    assert all(v.reason.startswith("too few samples for p10") for v in c.items)


def test_exit_codes(files: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    """0 when nothing is slower, 3 when something is; undecided and missing fail when asked."""
    gate = ["--max-slowdown", "0.05"]
    assert main(["compare", files["base"], files["same"], *gate]) == 0
    assert main(["compare", files["base"], files["slow"], *gate]) == EXIT_SLOWER == 3
    assert main(["compare", files["base"], files["noisy"], *gate]) == 0
    assert main(["compare", files["base"], files["noisy"], *gate, "--fail-undecided"]) == 3
    assert main(["compare", files["base"], files["missing"], *gate]) == 0
    assert main(["compare", files["base"], files["missing"], *gate, "--fail-missing"]) == 3
    assert main(["compare", files["base"], files["slow"], *gate, "--match", "a"]) == 0
    assert main(["compare", files["base"], files["base"] + ".nope", *gate]) == 1
    assert main(["compare", files["base"], files["slow"]]) == 0  # no gate: a report
    out = capsys.readouterr().out
    assert "cudatimer: gate FAILED (max slowdown 5%): 1 slower, 1 same" in out


def test_the_table_in_every_format(
    files: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Each format shows base, new, ratio, the interval with its level, and the verdict;
    github gives a Markdown comment."""
    for fmt in ("simple", "github", "plain", "grid"):
        assert (
            main(["compare", files["base"], files["slow"], "--max-slowdown", "0.05", "--fmt", fmt])
            == 3
        )
        out = capsys.readouterr().out
        assert "97.5% interval" in out and "new/base" in out and "slower" in out, fmt
        assert "95% for all 2 tested together (Bonferroni)" in out, fmt
    main(["compare", files["base"], files["slow"], "--max-slowdown", "0.05", "--fmt", "github"])
    comment = capsys.readouterr().out
    assert comment.startswith("**cudatimer: gate FAILED") and "\n| b " in comment
    assert "\n- p50 of per-step sums" in comment


def test_json_verdicts(files: dict[str, str], tmp_path: Path) -> None:
    """--json writes the verdicts, intervals and counts for machines."""
    out = tmp_path / "v" / "gate.json"
    argv = ["compare", files["base"], files["slow"], "--max-slowdown", "0.05", "--json", str(out)]
    assert main(argv) == 3
    doc = json.loads(out.read_text())
    assert doc["format"] == "cudatimer.gate" and doc["ok"] is False
    assert doc["counts"] == {"slower": 1, "faster": 0, "same": 1, "undecided": 0, "missing": 0}
    b = next(r for r in doc["regions"] if r["name"] == "b")
    assert b["verdict"] == "slower" and b["low"] < b["ratio"] < b["high"]
    assert b["ratio"] == pytest.approx(b["new_ms"] / b["base_ms"])
    assert doc["region_confidence"] == pytest.approx(0.975) and doc["tested"] == 2


@pytest.mark.parametrize(
    ("argv", "word"),
    [
        (["--max-slowdown", "-0.1"], "max_slowdown"),
        (["--max-slowdown", "x"], "--max-slowdown"),
        (["--max-slowdown", "0.05", "--stat", "total"], "per_step"),
        (["--max-slowdown", "0.05", "--stat", "max"], "no confidence interval"),
        (["--stat", "p25"], "stat must be one of"),
        (["--max-slowdown", "0.05", "--confidence", "1.5"], "confidence"),
        (["--max-slowdown", "0.05", "--min-ms", "-1"], "min_ms"),
        (["--max-slowdown", "0.05", "--fmt", "nope"], "fmt"),
        (["--json", "x.json"], "add --max-slowdown"),
        (["--absolute"], "add --max-slowdown"),
        (["--max-slowdown", "0.05", "--between-run", "2"], "between_run"),
        (["--fail-undecided"], "add --max-slowdown"),
    ],
)
def test_bad_arguments(
    files: dict[str, str], argv: list[str], word: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Bad gate options exit 2 before any file is read, naming the option."""
    with pytest.raises(SystemExit) as info:
        main(["compare", files["base"], files["slow"], *argv])
    assert info.value.code == 2
    assert word in capsys.readouterr().err


def test_one_run_or_three_without_the_gate_is_a_bad_command_line(
    files: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """compare needs BASE NEW; several BASE runs pool only in the gate."""
    for argv in ([files["base"]], [files["base"], files["same"], files["slow"]]):
        with pytest.raises(SystemExit) as info:
            main(["compare", *argv])
        assert info.value.code == 2
    assert "pool in the gate only" in capsys.readouterr().err
    assert (
        main(["compare", files["base"], files["same"], files["slow"], "--max-slowdown", "0.05"])
        == 3
    )


# -- HTML ------------------------------------------------------------------------------------------
def _page_doc(page: str) -> dict[str, object]:
    match = re.search(
        r'<script type="application/json" id="cudatimer-data">(.*?)</script>', page, re.S
    )
    assert match
    return json.loads(match.group(1))  # type: ignore[no-any-return]


def test_html_shows_the_gates_verdicts(files: dict[str, str], tmp_path: Path) -> None:
    """html BASE NEW --max-slowdown and html(base=..., max_slowdown=...) show the verdicts
    and intervals of compare, not a colour per change."""
    base, slow = cudatimer.load(files["base"]), cudatimer.load(files["slow"])
    table = _page_doc(render_html(slow, base=base, max_slowdown=0.05))["compare"]
    assert isinstance(table, dict)
    titles = [c[1] for c in table["columns"]]
    assert titles[-2:] == ["97.5% interval", "verdict"]
    rows = {r[4]: r for r in table["rows"]}
    assert rows["b"][3] == "slower" and rows["b"][-1] == "slower"
    assert rows["a"][3] == "" and rows["a"][-1] == "same"
    assert any("Bonferroni" in n for n in table["notes"])
    out = tmp_path / "page.html"
    assert (
        main(["html", files["base"], files["slow"], "--max-slowdown", "0.05", "-o", str(out)]) == 0
    )
    assert _page_doc(out.read_text())["compare"] == table
    cudatimer.html(tmp_path / "api.html", summary=slow, base=base, max_slowdown=0.05)
    assert _page_doc((tmp_path / "api.html").read_text())["compare"] == table


# -- the pytest fixture ---------------------------------------------------------------------
_PROJECT_TEST = """
import os
import sys
import time

COLLECTED_WITH_TORCH = "torch" in sys.modules


def test_collection_imported_no_torch():
    assert not COLLECTED_WITH_TORCH


def test_speed(cudatimer_gate):
    slow = float(os.environ.get("SLOW", "1"))
    for _ in range(20):
        with cudatimer_gate.region("attention"):
            time.sleep(0.002 * slow)
        with cudatimer_gate.region("mlp"):
            time.sleep(0.001)
        cudatimer_gate.step()
"""


def _pytest(project: Path, *args: str, slow: float = 1.0) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SLOW": str(slow)}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            # the plugin by its module, and never a second time through its entry point (found
            # where the package's metadata is on the path: an egg-info beside the sources)
            "-p",
            "no:cudatimer",
            "-p",
            "cudatimer_pytest",
            "-p",
            "no:cacheprovider",
            "-q",
            *args,
        ],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_the_fixture_end_to_end(tmp_path: Path) -> None:
    """The baseline is written when missing; a slowed test fails with the table; the update
    option writes it anew; collection imports no torch; the folder is ini-settable."""
    (tmp_path / "pytest.ini").write_text("[pytest]\ncudatimer_baselines = perf/baselines\n")
    (tmp_path / "test_perf.py").write_text(textwrap.dedent(_PROJECT_TEST))
    first = _pytest(tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    written = list((tmp_path / "perf" / "baselines").rglob("*.json"))
    assert len(written) == 1 and written[0].name == "test_speed.json"
    assert written[0].parent.name == "test_perf.py"
    assert "cudatimer: wrote 1 baseline(s) in perf" in first.stdout
    before = written[0].read_text()

    slowed = _pytest(tmp_path, slow=4.0)
    assert slowed.returncode == 1, slowed.stdout
    assert "1 failed, 1 passed" in slowed.stdout
    assert (
        "cudatimer: gate FAILED" in slowed.stdout
        and "--cudatimer-update-baselines" in slowed.stdout
    )
    line = next(ln for ln in slowed.stdout.splitlines() if ln.startswith("attention"))
    assert "slower" in line
    assert written[0].read_text() == before  # a failing test leaves the baseline alone

    update = _pytest(tmp_path, "--cudatimer-update-baselines", slow=4.0)
    assert update.returncode == 0, update.stdout
    assert cudatimer.load(written[0])["attention"].cpu_p50_ms > 7.0  # the slowed times


def test_the_plugin_is_declared_for_pytest() -> None:
    """pyproject.toml names the plugin under pytest11, and the wheel includes it."""
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["entry-points"]["pytest11"] == {"cudatimer": "cudatimer_pytest"}
    assert "cudatimer_pytest" in project["tool"]["setuptools"]["packages"]["find"]["include"]


# -- the benchmark -------------------------------------------------------------------------------
def test_the_benchmark_smoke_mode(tmp_path: Path) -> None:
    """benchmarks/gate.py --smoke runs its pairs and writes every figure."""
    out = tmp_path / "gate.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gate.py"), "--smoke", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(out.read_text())
    for key in ("single", "pooled"):
        for variant in ("aa", "slow10", "slow5"):
            assert 0 <= doc[key][variant]["fails"] <= doc["pairs"] == 2
            assert len(doc[key][variant]["details"]) == 2
    assert doc["pooled"]["base_runs"] == 2 and doc["speed"]["best_s"] > 0
    assert "A/A pairs failing" in proc.stdout
