"""Regions inside CUDA graphs: what timing a replay costs, how close it reads, and what 10^5
replays without a report hold.

1. ``stamp``: the GPU time a replay gains per timestamp. A graph of 200 small kernels, plain
   and with a region around each kernel (201 timestamps after sharing).
2. ``accuracy``: regions of 0.5-4 ms of matmuls inside a replay against an event pair around
   a replay of the same work captured alone (and, for information, the same work run
   eagerly), per-call medians.
   Means, not medians: a report's percentiles are bucketed (within 1%), its mean exact.
3. ``decode``: a CUDA graph of a one-token forward of a GPT-2-small-shaped model (12 layers,
   768 wide, 12 heads, a static KV cache of 1024 positions, bf16), written here; replays of
   the plain graph, of one captured with every module instrumented, and with ``depth=2``, in
   interleaved rounds (plain, all, depth2, plain, ...); the figures are ratios of medians.
4. ``stress``: 10^5 replays of a graph with 100 captured regions and no report in between:
   host and device memory before and after, samples kept, lost, the report's time.

    python benchmarks/graph_targets.py --json graph_targets.json
    python benchmarks/graph_targets.py --smoke   # fewer rounds and replays (still a GPU)

Needs CUDA (graphs exist only there).
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import cudatimer
from cudatimer.sources import _capture


def _graph(fn: Callable[[], Any]) -> torch.cuda.CUDAGraph:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    torch.cuda.synchronize()
    return g


def _replay_ms(g: torch.cuda.CUDAGraph, n: int) -> float:
    """GPU ms per replay over ``n`` back-to-back replays (one event pair)."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(n):
        g.replay()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / n


# -- 1. per timestamp -------------------------------------------------------------------
def stamp_cost(smoke: bool) -> dict[str, Any]:
    timer = cudatimer.Timer(name="stamp")
    x = torch.randn(64, 64, device="cuda")
    kernels = 200

    def plain() -> None:
        y = x
        for _ in range(kernels):
            y = y * 1.0001

    def timed() -> None:
        y = x
        for _ in range(kernels):
            with timer.region("k"):
                y = y * 1.0001

    g0, g1 = _graph(plain), _graph(timed)
    stamps = _capture.timestamps(g1)
    rounds = 5 if smoke else 15
    base, with_stamps = [], []
    for _ in range(rounds):
        base.append(_replay_ms(g0, 50))
        with_stamps.append(_replay_ms(g1, 50))
    b, t = statistics.median(base), statistics.median(with_stamps)
    return {
        "kernels": kernels,
        "timestamps": stamps,
        "plain_ms": round(b, 4),
        "timed_ms": round(t, 4),
        "us_per_timestamp": round((t - b) * 1e3 / stamps, 3),
        "ratio": round(t / b, 4),
    }


# -- 2. accuracy --------------------------------------------------------------------------
def accuracy(smoke: bool) -> dict[str, Any]:
    """Each region's per-replay time against the same work captured alone, its replays timed
    by an event pair each; and against that work run eagerly (the eager run is slower by the
    launch gap between kernels, ~1.1 us a kernel, that a graph does not have)."""
    graph_t, eager_t = cudatimer.Timer(name="graph"), cudatimer.Timer(name="eager")
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16) / 64
    sizes = {"r1": 4, "r2": 8, "r4": 16, "r8": 32}  # bf16 4096^3 matmuls: ~0.11 ms each

    def work(n: int) -> None:
        y = x
        for _ in range(n):
            y = torch.tanh(y @ w)

    def body(t: cudatimer.Timer) -> None:
        # One kernel before the regions: a region at the very start of a graph also holds
        # the graph's launch (its enter timestamp is a root node; +18 us measured on r1).
        torch.mul(x, 1.0)
        for name, n in sizes.items():
            with t.region(name):
                work(n)

    g = _graph(lambda: body(graph_t))
    alone = {name: _graph(lambda n=n: work(n)) for name, n in sizes.items()}  # type: ignore[misc]
    graph_t.reset()
    ref: dict[str, list[float]] = {name: [] for name in sizes}
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(10 if smoke else 40):
        g.replay()
        body(eager_t)
        for name, ga in alone.items():
            a.record()
            ga.replay()
            b.record()
            b.synchronize()
            ref[name].append(a.elapsed_time(b))
    gs, es = graph_t.summary(), eager_t.summary()
    rows = {}
    for name in sizes:  # means: exact (percentiles are bucketed, within 1%)
        gm, em = gs[name].gpu_mean_ms, es[name].gpu_mean_ms
        assert gm is not None and em is not None
        rm = statistics.fmean(ref[name])
        rows[name] = {
            "graph_ms": round(gm, 4),
            "alone_replay_ms": round(rm, 4),
            "diff_pct": round(100 * (gm - rm) / rm, 2),
            "diff_us": round(1e3 * (gm - rm), 1),
            "eager_ms": round(em, 4),
            "eager_diff_us": round(1e3 * (gm - em), 1),
        }
    return rows


# -- 3. decode ----------------------------------------------------------------------------
class Attn(nn.Module):
    def __init__(self, d: int, heads: int, max_len: int) -> None:
        super().__init__()
        self.heads = heads
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        hd = d // heads
        self.register_buffer("k_cache", torch.zeros(1, heads, max_len, hd))
        self.register_buffer("v_cache", torch.zeros(1, heads, max_len, hd))

    def forward(self, x: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.c_attn(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        self.k_cache.index_copy_(2, pos, k)
        self.v_cache.index_copy_(2, pos, v)
        y = F.scaled_dot_product_attention(q, self.k_cache, self.v_cache, attn_mask=mask)
        return self.c_proj(y.transpose(1, 2).reshape(b, t, d))


class Mlp(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.c_fc = nn.Linear(d, 4 * d)
        self.act = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.act(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, d: int, heads: int, max_len: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(d)
        self.attn = Attn(d, heads, max_len)
        self.ln_2 = nn.LayerNorm(d)
        self.mlp = Mlp(d)

    def forward(self, x: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), pos, mask)
        return x + self.mlp(self.ln_2(x))


class Decoder(nn.Module):
    """GPT-2-small-shaped, one token a call, a static KV cache (a graph replays it)."""

    def __init__(self, layers: int = 12, d: int = 768, heads: int = 12, vocab: int = 50257,
                 max_len: int = 1024) -> None:  # fmt: skip
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(max_len, d)
        self.h = nn.ModuleList(Block(d, heads, max_len) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.max_len = max_len

    def forward(self, idx: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        mask = (torch.arange(self.max_len, device=idx.device) <= pos).view(1, 1, 1, -1)
        x = self.wte(idx) + self.wpe(pos).unsqueeze(0)
        for block in self.h:
            x = block(x, pos, mask)
        return self.lm_head(self.ln_f(x))


def decode(smoke: bool) -> dict[str, Any]:
    torch.manual_seed(0)
    model = Decoder().cuda().to(torch.bfloat16).eval()
    idx = torch.zeros(1, 1, dtype=torch.long, device="cuda")
    pos = torch.zeros(1, dtype=torch.long, device="cuda")

    def step() -> torch.Tensor:
        with torch.no_grad():
            return model(idx, pos)

    graphs: dict[str, torch.cuda.CUDAGraph] = {}
    outs: dict[str, torch.Tensor] = {}
    regions: dict[str, int] = {}
    timers: dict[str, cudatimer.Timer] = {}
    for name, depth in (("plain", -1), ("all", None), ("depth2", 2)):
        timer = cudatimer.Timer(name=f"decode-{name}")
        inst = cudatimer.instrument(model, depth=depth, timer=timer) if depth != -1 else None
        out: list[torch.Tensor] = []
        graphs[name] = _graph(lambda out=out: out.append(step()))  # type: ignore[misc]
        outs[name] = out[-1]
        regions[name] = len(inst.regions) if inst is not None else 0
        timers[name] = timer
        if inst is not None:
            inst.remove()
        timer.reset()
    for g in graphs.values():
        g.replay()
    torch.cuda.synchronize()
    same = all(torch.equal(outs["plain"], o) for o in outs.values())
    rounds = 5 if smoke else 21
    per: dict[str, list[float]] = {k: [] for k in graphs}
    for _ in range(rounds):
        for name, g in graphs.items():
            per[name].append(_replay_ms(g, 100))
    med = {k: statistics.median(v) for k, v in per.items()}
    rows = timers["all"].summary().regions
    return {
        "replay_ms": {k: round(v, 4) for k, v in med.items()},
        "ratio_all": round(med["all"] / med["plain"], 4),
        "ratio_depth2": round(med["depth2"] / med["plain"], 4),
        "regions": regions,
        "timestamps": {k: _capture.timestamps(g) for k, g in graphs.items()},
        "outputs_equal": same,
        "rows_all": len(rows),
        "calls_per_row": sorted({r.calls for r in rows}),
        "top_all": [(r.name, round(r.gpu_mean_ms or 0.0, 4)) for r in rows[:6]],
    }


# -- 4. stress ----------------------------------------------------------------------------
def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return math.nan


def stress(smoke: bool) -> dict[str, Any]:
    timer = cudatimer.Timer(name="stress", trace_samples=0)
    x = torch.randn(16, 16, device="cuda")
    regions = 100

    def body() -> None:
        y = x
        for i in range(regions):
            with timer.region(f"r{i % 10}"):
                y = y + 1

    g = _graph(body)

    def plain() -> None:
        y = x
        for _ in range(regions):
            y = y + 1

    g0 = _graph(plain)
    # Host time of a replay's launch, with and without regions: bursts of 200 replays (the
    # launch queue does not fill), then a synchronize outside the clock; the order of the
    # variants turns round by round. The mean over every burst is the amortised cost: it
    # holds the reads of the ring (every half ring: 324 replays here) and their folds.
    # "timed_raw": the same timed graph launched past cudatimer's wrapper (torch's own
    # replay), so the driver's launch of a graph with more nodes is told apart from the
    # wrapper's bookkeeping.
    raw_replay = torch._C._CUDAGraph.replay
    g_raw = _graph(body)  # its own graph: replays past the wrapper are not counted by it
    host_us: dict[str, list[float]] = {"plain": [], "timed": [], "timed_raw": []}
    variants: list[tuple[str, Callable[[], Any]]] = [
        ("plain", g0.replay),
        ("timed", g.replay),
        ("timed_raw", lambda: raw_replay(g_raw)),
    ]

    def burst(launch: Callable[[], Any]) -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(200):
            launch()
        return (time.perf_counter() - t0) * 1e6 / 200

    # The first replays of a freshly captured graph cost more (on an H200 host the first
    # 6000 of the timed graph ~20 us each against ~10 us later; the driver's and cudatimer's
    # first reads and folds): measured apart, then every variant warms up before the rounds.
    cold = [burst(g.replay) for _ in range(3 if smoke else 30)]
    for _ in range(2 if smoke else 30):
        for _, launch in variants:
            burst(launch)
    for r in range(10 if smoke else 60):
        for name, launch in variants[r % 3 :] + variants[: r % 3]:
            host_us[name].append(burst(launch))
    torch.cuda.synchronize()
    timer.reset()
    replays = 2_000 if smoke else 100_000
    torch.cuda.synchronize()
    rss0, dev0 = _rss_mb(), torch.cuda.memory_allocated()
    t0 = time.perf_counter()
    for i in range(replays):
        g.replay()
        if i % 1000 == 999:
            timer.step()
    host_s = time.perf_counter() - t0
    torch.cuda.synchronize()
    gpu_s = time.perf_counter() - t0
    rss1, dev1 = _rss_mb(), torch.cuda.memory_allocated()
    t1 = time.perf_counter()
    s = timer.summary()
    report_s = time.perf_counter() - t1
    calls = sum(r.calls for r in s.regions)
    text = timer.report()
    return {
        "replays": replays,
        "regions_per_replay": regions,
        "samples": calls,
        "expected": replays * regions,
        "lost_note": "lost" in text,
        "host_s": round(host_s, 2),
        "gpu_s": round(gpu_s, 2),
        "host_us_per_replay": round(1e6 * host_s / replays, 2),
        "launch_us_plain": round(statistics.mean(host_us["plain"]), 2),
        "launch_us_timed": round(statistics.mean(host_us["timed"]), 2),
        "launch_us_timed_raw": round(statistics.mean(host_us["timed_raw"]), 2),
        "launch_us_timed_median": round(statistics.median(host_us["timed"]), 2),
        "launch_us_timed_first_6000": round(statistics.mean(cold), 2),
        # The bookkeeping per replay against the launch of the same graph (target <= 1).
        "bookkeeping_vs_launch": round(
            (statistics.mean(host_us["timed"]) - statistics.mean(host_us["timed_raw"]))
            / statistics.mean(host_us["timed_raw"]),
            3,
        ),
        "report_s": round(report_s, 2),
        "rss_growth_mb": round(rss1 - rss0, 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "device_growth_mb": round((dev1 - dev0) / 2**20, 2),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="fewer rounds and replays")
    ap.add_argument("--json", type=str, default=None, help="write the figures here")
    ap.add_argument("--only", nargs="*", default=None, help="stamp accuracy decode stress")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("graph_targets: needs CUDA (CUDA graphs exist only there)")
        return 0
    parts = {"stamp": stamp_cost, "accuracy": accuracy, "decode": decode, "stress": stress}
    out: dict[str, Any] = {
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
    }
    for name, fn in parts.items():
        if args.only and name not in args.only:
            continue
        t0 = time.perf_counter()
        out[name] = fn(args.smoke)
        out[name + "_s"] = round(time.perf_counter() - t0, 1)
        print(name, json.dumps(out[name]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            f.write(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
