"""FLOPs per region (flops=True) on the CPU: exact counts per module type forward and
backward, nested sums, the signature cache and its bound, sampled rows, uncounted ops,
compiled regions, peaks (override, environment, unknown device, bad values), and the
fields through JSON, old files, merges, windows and the outputs."""

from __future__ import annotations

import io
import json
import math
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import cudatimer
from cudatimer import Timer
from cudatimer.records._ranks import RankSummary
from cudatimer.render._report import render, render_compare, render_ranks
from cudatimer.sources import _flops

# All formulas count a multiply-add as 2 FLOP, as torch.utils.flop_counter does.


def _timer(**kw: object) -> Timer:
    return Timer(name="flops", clock="host", **kw)  # type: ignore[arg-type]


def _flop(t: Timer, name: str) -> float:
    row = t.summary()[name]
    assert row.flop_mean is not None, f"{name} has no FLOP count"
    return row.flop_mean


def _linear_fwd(b: int, i: int, o: int) -> int:
    return 2 * b * i * o


def test_linear_forward_exact() -> None:
    """A Linear module's row counts 2*b*in*out a call, every call (one count reused)."""
    t = _timer()
    m = torch.nn.Linear(48, 24)
    with cudatimer.instrument(m, flops=True, timer=t):
        for _ in range(5):
            m(torch.randn(16, 48))
    row = t.summary()["Linear"]
    assert row.flop_mean == _linear_fwd(16, 48, 24)
    assert row.values["flop"].count == 5 and not row.flop_sampled


def test_matmul_bmm_conv_sdpa_forward_and_backward_exact() -> None:
    """matmul, bmm, conv2d and CPU attention, forward and backward, match closed forms."""
    t = _timer()
    a = torch.randn(8, 32, requires_grad=True)
    b = torch.randn(32, 16, requires_grad=True)
    with t.region("mm", flops=True):
        a @ b
    with t.region("mm_fb", flops=True):
        (a @ b).sum().backward()
    x = torch.randn(4, 8, 16)
    y = torch.randn(4, 16, 12)
    with t.region("bmm", flops=True):
        torch.bmm(x, y)
    img = torch.randn(2, 3, 10, 10, requires_grad=True)
    w = torch.randn(5, 3, 3, 3, requires_grad=True)
    with t.region("conv", flops=True):
        F.conv2d(img, w)
    with t.region("conv_fb", flops=True):
        F.conv2d(img, w).sum().backward()
    q = torch.randn(2, 4, 16, 8, requires_grad=True)
    with t.region("sdpa", flops=True):
        F.scaled_dot_product_attention(q, q, q, is_causal=True)
    with t.region("sdpa_fb", flops=True):
        F.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
    mm = 2 * 8 * 32 * 16
    assert _flop(t, "mm") == mm
    assert _flop(t, "mm_fb") == 3 * mm  # forward, and one matmul per input gradient
    assert _flop(t, "bmm") == 2 * 4 * 8 * 16 * 12
    conv = 2 * (2 * 8 * 8) * 5 * (3 * 3 * 3)  # output positions x out channels x kernel
    assert _flop(t, "conv") == conv
    assert _flop(t, "conv_fb") == 3 * conv
    # attention: q@k^T and p@v, 2*b*h*s*s*d each; backward 2.5x that (torch's count; causal
    # attention is not halved)
    attn = 2 * (2 * 2 * 4 * 16 * 16 * 8)
    assert _flop(t, "sdpa") == attn
    assert _flop(t, "sdpa_fb") == attn + 2.5 * attn


def test_torch_counts_cpu_attention_zero_and_ours_do_not() -> None:
    """The CPU flash kernel has no formula in torch; the project's own counts it."""
    q = torch.randn(1, 2, 8, 4)
    mode = torch.utils.flop_counter.FlopCounterMode(display=False)
    with mode:
        F.scaled_dot_product_attention(q, q, q)
    assert mode.get_total_flops() in (0, 2 * 2 * 1 * 2 * 8 * 8 * 4)
    assert _flops.count(F.scaled_dot_product_attention, q, q, q)[1] == 2 * 2 * 1 * 2 * 8 * 8 * 4


def test_parents_include_children() -> None:
    """A model's row is the sum of its modules' rows (and its own ops)."""
    t = _timer()
    m = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    with cudatimer.instrument(m, flops=True, timer=t):
        for _ in range(3):
            m(torch.randn(4, 32))
    s = t.summary()
    kids = s["Sequential/0"].flop_mean + s["Sequential/1"].flop_mean + s["Sequential/2"].flop_mean  # type: ignore[operator]
    assert s["Sequential"].flop_mean == kids == _linear_fwd(4, 32, 64) + _linear_fwd(4, 64, 8)
    assert s["Sequential/1"].flop_mean == 0


def test_counting_call_is_left_out_of_the_times() -> None:
    """The first call of a signature is counted and untimed: calls 4, samples 3."""
    t = _timer()
    f = t.timed(lambda x: x @ x, name="sq", flops=True)
    for _ in range(4):
        f(torch.ones(8, 8))
    row = t.summary()["sq"]
    assert row.calls == 4 and row.cpu.count == 3
    assert row.values["flop_untimed"].count == 1
    assert "sampled (every=N)" not in t.report(file=io.StringIO())


def test_signature_change_recounts() -> None:
    """A new input shape is counted again: the row's mean covers both sizes."""
    t = _timer()
    f = t.timed(lambda x: x @ x, name="sq", flops=True)
    f(torch.ones(4, 4))
    f(torch.ones(4, 4))
    f(torch.ones(8, 8))
    row = t.summary()["sq"]
    assert row.values["flop"].total == 2 * (2 * 4**3) + 2 * 8**3
    assert row.values["flop_untimed"].count == 2
    assert not row.flop_sampled


def test_cache_bound_then_sampled() -> None:
    """Past CACHE_SIZE signatures, new ones are counted 1 in flop_every and the row says so."""
    t = _timer(flop_every=4)
    region = t.region("grow", flops=True)
    f = region(lambda x: x.sum())
    n = _flops.CACHE_SIZE + 12
    for i in range(n):
        f(torch.ones(i + 1))
    assert len(region.flop_state.cache) == _flops.CACHE_SIZE
    row = t.summary()["grow"]
    assert row.calls == n
    assert row.values["flop"].count == _flops.CACHE_SIZE + 3  # 12 misses, 1 in 4 counted
    assert row.flop_sampled
    assert "*: FLOPs counted on a sample" in t.report(file=io.StringIO())


def test_signature_check_cost_under_a_microsecond() -> None:
    """signature() of a module call (self, one tensor, a few keywords) costs <= 1 us."""
    import timeit

    m = torch.nn.Linear(4, 4)
    x = torch.ones(8, 4)
    kwargs = {"mask": None, "use_cache": False}
    n = 2000
    best = min(timeit.repeat(lambda: _flops.signature((m, x), kwargs), number=n, repeat=50)) / n
    # One attribute read of torch's, the same way: on a host slower than 0.1 us for it (a
    # loaded CI machine) the bound scales with it.
    shape = min(timeit.repeat(lambda: x.shape, number=n, repeat=50)) / n
    assert best < max(1e-6, 10 * shape), f"{best * 1e6:.2f} us a call ({shape * 1e6:.3f} us ref)"


def test_with_blocks_sampled_one_in_every() -> None:
    """A with block is counted on calls 0, N, 2N...; the row is marked sampled."""
    t = _timer(flop_every=8)
    x = torch.ones(4, 4)
    for _ in range(20):
        with t.region("blk", flops=True):
            x @ x
    row = t.summary()["blk"]
    assert row.values["flop"].count == 3 and row.flop_mean == 2 * 4**3
    assert row.flop_sampled and row.cpu.count == 17


def test_uncounted_ops_listed_per_row() -> None:
    """A custom op with no formula is named on its row, never silently zero."""

    @torch.library.custom_op("cudatimer_test::mystery", mutates_args=())
    def mystery(x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    t = _timer()
    with t.region("odd", flops=True):
        mystery(torch.ones(3))
    s = t.summary()
    assert _flops.uncounted(s.meta) == {"odd": ("cudatimer_test::mystery",)}
    assert "cudatimer_test::mystery" in t.report(file=io.StringIO())


def test_compiled_region_counted_by_an_eager_call() -> None:
    """A decorated compiled function (Inductor, CPU) is counted: its first call runs eagerly
    under the counting mode, later compiled calls reuse the count."""
    t = _timer()
    compiled = torch.compile(lambda a, b: torch.relu(a @ b), backend="inductor")
    f = t.timed(compiled, name="comp", flops=True)
    a, b = torch.randn(16, 32), torch.randn(32, 8)
    for _ in range(3):
        f(a, b)
    row = t.summary()["comp"]
    assert row.flop_mean == 2 * 16 * 32 * 8 and row.values["flop"].count == 3


def test_instrumented_compiled_model_rows_counted() -> None:
    """instrument() then torch.compile(model): the submodules' rows inside compiled code get
    the counts of the model's eager counting call."""
    t = _timer()
    m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    with cudatimer.instrument(m, flops=True, timer=t):
        cm = torch.compile(m, backend="inductor")
        for _ in range(4):
            cm(torch.randn(8, 16))
    s = t.summary()
    assert s["Sequential"].flop_mean == _linear_fwd(8, 16, 32) + _linear_fwd(8, 32, 4)
    assert s["Sequential/0"].flop_mean == _linear_fwd(8, 16, 32)
    assert s["Sequential/0"].values["flop"].count == s["Sequential/0"].calls


def test_peak_override_number_and_dict() -> None:
    """peak_tflops as a number applies to every dtype; a dict to its dtypes only."""
    x = torch.ones(64, 64)
    for peak, expect in ((2.0, 2.0), ({"fp32": 4.0}, 4.0), ({"bf16": 1.0}, None)):
        t = _timer(peak_tflops=peak)
        f = t.timed(lambda a: a @ a, name="mm", flops=True)
        for _ in range(3):
            f(x)
        row = t.summary()["mm"]
        if expect is None:
            assert row.mfu is None
        else:
            assert row.values["flop_peak"].mean == expect
            assert row.mfu == pytest.approx(row.tflop_per_s / expect)  # type: ignore[operator]


def test_unknown_device_gives_no_mfu_and_one_note() -> None:
    """Without a peak (the CPU), mfu is None and the report says why, once."""
    t = _timer()
    f = t.timed(lambda a: a @ a, name="mm", flops=True)
    for _ in range(3):
        f(torch.ones(8, 8))
    row = t.summary()["mm"]
    assert row.tflop_per_s is not None and row.mfu is None
    text = t.report(file=io.StringIO())
    assert text.count("MFU unknown (no peak) for cpu (fp32)") == 1


def test_device_table_names() -> None:
    """Device names map to the table's rows; other GPUs are unknown."""
    assert _flops.device_peaks("NVIDIA H200")[1]["bf16"] == 989.4  # type: ignore[index]
    assert _flops.device_peaks("NVIDIA H100 PCIe")[0] == "H100 PCIe"  # type: ignore[index]
    assert _flops.device_peaks("NVIDIA A100-SXM4-80GB")[0] == "A100"  # type: ignore[index]
    assert _flops.device_peaks("NVIDIA L4")[0] == "L4"  # type: ignore[index]
    assert _flops.device_peaks("NVIDIA A10")[0] == "A10"  # type: ignore[index]
    assert _flops.device_peaks("Tesla V100-SXM2-16GB")[0] == "V100 SXM2"  # type: ignore[index]
    assert _flops.device_peaks("NVIDIA B200")[0] == "B200"  # type: ignore[index]
    assert _flops.device_peaks("NVIDIA GeForce RTX 3090") is None


@pytest.mark.parametrize(
    ("value", "error", "text"),
    [
        ("989", TypeError, "peak_tflops must be a number"),
        (-1, ValueError, "peak_tflops must be a finite number of TFLOP/s > 0"),
        (math.inf, ValueError, "peak_tflops must be a finite"),
        (True, TypeError, "peak_tflops must be a number"),
        ({"bf17": 1.0}, ValueError, "peak_tflops keys must be dtypes"),
        ({"bf16": 0}, ValueError, r"peak_tflops\['bf16'\] must be"),
        ({}, ValueError, "at least one dtype"),
    ],
)
def test_bad_peak_tflops(value: object, error: type[Exception], text: str) -> None:
    """A bad peak_tflops is refused, naming the argument and what is expected."""
    with pytest.raises(error, match=text):
        _timer(peak_tflops=value)


def test_bad_flop_every() -> None:
    """flop_every must be an int >= 1."""
    with pytest.raises(ValueError, match="flop_every must be >= 1"):
        _timer(flop_every=0)
    with pytest.raises(TypeError, match="flop_every must be an int"):
        _timer(flop_every=2.0)


def test_flops_option_checked() -> None:
    """flops must be a bool, and needs a row (not mode='nvtx')."""
    t = _timer()
    with pytest.raises(TypeError, match="flops must be a bool or None"):
        t.region("x", flops=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="flops=True needs a row"):
        t.region("x", flops=True, mode="nvtx")
    with pytest.raises(TypeError, match="flops must be a bool"):
        cudatimer.instrument(torch.nn.Linear(2, 2), flops="yes", timer=t)  # type: ignore[arg-type]


def test_environment_peaks(monkeypatch: pytest.MonkeyPatch) -> None:
    """CUDATIMER_PEAK_TFLOPS gives the peaks; a bad value is an error naming it."""
    monkeypatch.setenv("CUDATIMER_PEAK_TFLOPS", "fp32=3, bf16=9")
    t = _timer()
    assert t.recorder.flops.override == {"fp32": 3.0, "bf16": 9.0}
    monkeypatch.setenv("CUDATIMER_PEAK_TFLOPS", "7")
    assert _timer().recorder.flops.override["fp8"] == 7.0  # type: ignore[index]
    assert _timer(peak_tflops=5).recorder.flops.override["fp32"] == 5.0  # type: ignore[index]
    for bad in ("fast", "bf16=", "int4=3", "fp32=-1"):
        monkeypatch.setenv("CUDATIMER_PEAK_TFLOPS", bad)
        with pytest.raises(ValueError, match="CUDATIMER_PEAK_TFLOPS"):
            _timer()


def _run(t: Timer, steps: int = 3) -> None:
    f = t.timed(lambda a: a @ a, name="mm", flops=True)
    for i in range(steps):
        f(torch.ones(16 * (i + 1), 16 * (i + 1)))
        f(torch.ones(16 * (i + 1), 16 * (i + 1)))
        t.step()


def test_json_round_trip_and_report_of_loaded_file(tmp_path: object) -> None:
    """Saved and loaded, a counted row has the same FLOPs, TFLOP/s and MFU, and renders them."""
    t = _timer(peak_tflops=1.0)
    _run(t)
    path = os.path.join(str(tmp_path), "run.json")
    saved = t.save(path)
    loaded = cudatimer.load(path)
    a, b = saved["mm"], loaded["mm"]
    assert (a.flop_mean, a.tflop_per_s, a.mfu) == (b.flop_mean, b.tflop_per_s, b.mfu)
    assert (
        dict(loaded.meta)["flop_peaks"] == "cpu: fp64=1,fp32=1,tf32=1,bf16=1,fp16=1,fp8=1 (given)"
    )
    text = render(loaded)
    assert "TFLOP/s" in text and "MFU" in text


def test_old_files_load_without_flop_fields(tmp_path: object) -> None:
    """A file without values (written before) loads, its rows with no FLOP fields; a file
    with memory values only loads too."""
    t = _timer()
    with t.region("plain"):
        pass
    from cudatimer.render import _export

    data = _export.summary_to_dict(t.summary())
    assert "values" not in data["regions"][0]
    old = _export.summary_from_dict(json.loads(json.dumps(data)))
    assert old["plain"].flop_mean is None and old["plain"].mfu is None
    data["regions"][0]["values"] = {"mem_delta": {"count": 1, "total": 5.0, "min": 5.0, "max": 5.0}}
    mem = _export.summary_from_dict(json.loads(json.dumps(data)))
    assert mem["plain"].values["mem_delta"].total == 5.0 and mem["plain"].flop_mean is None
    assert "TFLOP/s" not in render(mem)


def test_windows_cover_their_steps() -> None:
    """last=1 covers the last step's calls: its size's FLOPs only."""
    t = _timer()
    _run(t)
    assert t.summary(last=1)["mm"].flop_mean == 2 * 48**3
    assert t.summary()["mm"].flop_mean == pytest.approx(2 * (16**3 + 32**3 + 48**3) / 3)


def test_rank_merges_keep_flops() -> None:
    """Merged across ranks, the counts add up and the rank table shows TFLOP/s."""
    a, b = _timer(peak_tflops=1.0), _timer(peak_tflops=1.0)
    _run(a, 1)
    _run(b, 2)
    ranked = RankSummary((0, 1), (a.summary(), b.summary()))
    merged = ranked.merged()
    assert merged["mm"].values["flop"].count == 6
    assert merged["mm"].flop_mean == pytest.approx(
        (2 * 2 * 16**3 + 2 * 2 * 16**3 + 2 * 2 * 32**3) / 6
    )
    assert "TFLOP/s" in render(merged)
    assert "TFLOP/s" in render_ranks(ranked)


def test_csv_and_dataframe_columns() -> None:
    """CSV and DataFrame carry flop_mean, tflop_per_s and mfu (NaN where None)."""
    pandas = pytest.importorskip("pandas")
    t = _timer()
    _run(t)
    with t.region("plain"):
        pass
    buf = io.StringIO()
    t.to_csv(buf)
    header = buf.getvalue().splitlines()[0].split(",")
    for col in ("flop_mean", "tflop_per_s", "mfu"):
        assert col in header
    df = t.to_dataframe()
    assert isinstance(df, pandas.DataFrame)
    plain = df[df["name"] == "plain"].iloc[0]
    assert math.isnan(plain["tflop_per_s"]) and math.isnan(plain["mfu"])
    assert df[df["name"] == "mm"].iloc[0]["flop_mean"] > 0


def test_html_has_mfu_bars(tmp_path: object) -> None:
    """The HTML page shows the MFU column with a bar per counted row."""
    t = _timer(peak_tflops=0.001)
    _run(t)
    path = os.path.join(str(tmp_path), "r.html")
    t.html(path)
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    assert '["mfu", "MFU", "mfu"]' in text.replace('","', '", "')  # the column, drawn as bars
    plain = _timer()
    with plain.region("x"):
        pass
    plain.html(path)
    with open(path, encoding="utf-8") as fh:
        assert '"MFU"' not in fh.read()


def test_cli_show_columns(tmp_path: object) -> None:
    """cudatimer show --columns region,tflop_per_s,mfu renders the FLOP columns of a file."""
    t = _timer(peak_tflops=1.0)
    _run(t)
    path = os.path.join(str(tmp_path), "run.json")
    t.save(path)
    out = subprocess.run(
        [sys.executable, "-m", "cudatimer", "show", path, "--columns", "region,tflop_per_s,mfu"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    ).stdout
    assert "TFLOP/s" in out and "MFU" in out


def test_compare_by_tflop_per_s() -> None:
    """compare(stat='tflop_per_s') compares achieved TFLOP/s of counted rows."""
    a, b = _timer(), _timer()
    _run(a)
    _run(b)
    text = render_compare(a.summary(), b.summary(), stat="tflop_per_s")
    assert "TFLOP/s" in text and "mm" in text


def test_step_series_rows_carry_flops() -> None:
    """Per-step rows carry the FLOPs of the calls their times cover (the counting call of a
    new shape is untimed: one timed call a step here), and their rate."""
    t = _timer(peak_tflops=1.0)
    _run(t)
    rows = [r for r in t.step_series() if r.name == "mm"]
    assert [(r.calls, r.flop) for r in rows] == [(1, 2 * 16**3), (1, 2 * 32**3), (1, 2 * 48**3)]
    assert all(r.tflop_per_s == pytest.approx(r.flop / r.cpu_ms * 1e-9) for r in rows)  # type: ignore[operator]
    assert all(r.mfu == pytest.approx(r.tflop_per_s) for r in rows)


def test_step_feed_scalars_carry_mfu() -> None:
    """StepFeed's per-step records and scalars carry TFLOP/s and MFU of counted rows."""
    got: list[cudatimer.StepTimes] = []
    t = _timer(peak_tflops=1.0)
    feed = cudatimer.StepFeed(got.append, timer=t)
    f = t.timed(lambda a: a @ a, name="mm", flops=True)
    x = torch.ones(32, 32)
    for _ in range(3):
        f(x)
        f(x)
        feed.step()
    feed.close()
    last = got[-1]
    assert last.regions[0].flop == 2 * 2 * 32**3
    scalars = last.scalars()
    assert scalars["cudatimer/mm/tflop_per_s"] > 0 and "cudatimer/mm/mfu" in scalars
