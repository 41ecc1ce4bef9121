"""Regions in eager code: the cost targets, measured side by side in one run (ratios only).

1. Launch-bound loop (48 x Linear(256)+GELU, batch 32, fp32): what cudatimer adds per region
   against two floors, each measured in the same rounds: two pre-created timing ``torch.Event``
   records on a cached stream, and two raw ``cudaEventRecord`` calls through ctypes on torch's
   own libcudart (the handles read once). ``--runs`` independent runs of ``--rounds`` rounds,
   variants rotated each round; a variant's cost in a round is its time minus the unwrapped
   loop's in that round; per run the 10% trimmed mean; the figure is the median of the runs.
2. Launch-bound one-token decode of a 12-layer GPT-2 (the benchmark's own GPT, seq 1, no
   grad): every module instrumented (``instrument(model)``) against the plain decode, and
   instrument's per-module cost against a hand-written ``with region:`` around each module's
   forward (the same modules, the same Timer settings); beside them the floors of a per-module
   wrapper: doing nothing, two ``torch.Event`` records, two records as cudatimer makes them.
3. 10^6 regions with no report: resident memory growth.
4. The pure-Python core against the C core per region: this script again, in a process with
   CUDATIMER_PURE_PYTHON=1, measuring its own loop (its own unwrapped rounds and floor).
5. Another copy of the package (``--before DIR``: a checkout holding its ``cudatimer``
   folder, the extension built), in a process of its own, against its own floor: the same loop and
   method, so "did this change move the figure" is answered in one run.

    python3 benchmarks/eager_targets.py --out DIR                  # on a GPU: eager_targets.json
    python3 benchmarks/eager_targets.py --parts decode --rounds 200 --out DIR
    python3 benchmarks/eager_targets.py --smoke --out DIR          # a quick run (CPU too)
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
if os.environ.get("CUDATIMER_TREE"):  # a child measuring another copy of the package
    sys.path.insert(0, os.environ["CUDATIMER_TREE"])
import cudatimer  # noqa: E402  (after the path of the copy to measure)
from benchmarks._workloads import GPT, GPTConfig  # noqa: E402

Loop = Callable[[int], None]


def trimmed_mean(values: list[float], cut: float = 0.1) -> float:
    ordered = sorted(values)
    k = int(len(ordered) * cut)
    kept = ordered[k : len(ordered) - k] or ordered
    return sum(kept) / len(kept)


def _sync(cuda: bool) -> None:
    if cuda:
        torch.cuda.synchronize()


def paired_rounds(
    loops: dict[str, Loop],
    iters: int,
    rounds: int,
    cuda: bool,
    seed: int,
    setup: Callable[[str], None] | None = None,
) -> dict[str, list[float]]:
    """Seconds per iteration of each loop minus the "none" loop's, per round (rotated order);
    ``setup(name)`` runs before a loop's block, outside its time."""
    names = list(loops)
    rng = random.Random(seed)
    added: dict[str, list[float]] = {n: [] for n in names if n != "none"}
    for name in names:  # warm-up: pools, caches, lazily created events
        if setup is not None:
            setup(name)
        loops[name](iters)
    _sync(cuda)
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        if rng.random() < 0.5:
            order.reverse()
        took: dict[str, float] = {}
        for name in order:
            if setup is not None:
                setup(name)
            _sync(cuda)
            t0 = time.perf_counter()
            loops[name](iters)
            _sync(cuda)
            took[name] = (time.perf_counter() - t0) / iters
        for name in added:
            added[name].append(took[name] - took["none"])
    return added


# -- 1. the launch-bound loop ------------------------------------------------------------------
def _cudart() -> Any:
    """torch's own libcudart (already loaded: found in the process's maps), for the raw floor."""
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if "libcudart.so" in line}
    if not paths:
        raise RuntimeError("libcudart is not loaded in this process")
    lib = ctypes.CDLL(sorted(paths)[0])
    lib.cudaEventRecord.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.cudaEventRecord.restype = ctypes.c_int
    return lib


def launch_loops(device: str, only_cudatimer: bool = False) -> tuple[dict[str, Loop], int]:
    torch.manual_seed(0)
    layers = [
        torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU()).to(device)
        for _ in range(48)
    ]
    x0 = torch.randn(32, 256, device=device)
    timer = cudatimer.Timer(name="launch")
    regions = [timer.region(f"layer{i}") for i in range(len(layers))]

    def none(n: int) -> None:
        for _ in range(n):
            x = x0
            for layer in layers:
                x = layer(x)

    def with_cudatimer(n: int) -> None:
        for _ in range(n):
            x = x0
            for layer, region in zip(layers, regions, strict=True):
                with region:
                    x = layer(x)

    loops: dict[str, Loop] = {"none": none, "cudatimer": with_cudatimer}
    if device == "cuda" and not only_cudatimer:
        stream = torch.cuda.current_stream()
        pairs = [
            (
                torch.Event(device="cuda", enable_timing=True),
                torch.Event(device="cuda", enable_timing=True),
            )
            for _ in layers
        ]
        for a, b in pairs:
            a.record(stream)
            b.record(stream)

        def torch_floor(n: int) -> None:
            for _ in range(n):
                x = x0
                for layer, (a, b) in zip(layers, pairs, strict=True):
                    a.record(stream)
                    x = layer(x)
                    b.record(stream)

        lib = _cudart()
        record = lib.cudaEventRecord
        raw_stream = ctypes.c_void_p(stream.cuda_stream)
        raw = [(ctypes.c_void_p(a.event_id), ctypes.c_void_p(b.event_id)) for a, b in pairs]

        def raw_floor(n: int) -> None:
            for _ in range(n):
                x = x0
                for layer, (a, b) in zip(layers, raw, strict=True):
                    record(a, raw_stream)
                    x = layer(x)
                    record(b, raw_stream)

        loops["torch-floor"] = torch_floor
        loops["raw-floor"] = raw_floor
    return loops, len(layers)


def launch(args: argparse.Namespace, device: str) -> dict[str, Any]:
    loops, per_iter = launch_loops(device)
    runs = []
    for run in range(args.runs):
        added = paired_rounds(loops, args.iters, args.rounds, device == "cuda", seed=run)
        us = {k: trimmed_mean(v) / per_iter * 1e6 for k, v in added.items()}
        runs.append(us)
    out: dict[str, Any] = {"runs": runs}
    if "torch-floor" in runs[0]:
        out["vs_torch_floor"] = [r["cudatimer"] / r["torch-floor"] for r in runs]
        out["vs_raw_floor"] = [r["cudatimer"] / r["raw-floor"] for r in runs]
        out["median_vs_torch_floor"] = statistics.median(out["vs_torch_floor"])
        out["median_vs_raw_floor"] = statistics.median(out["vs_raw_floor"])
    out["cudatimer_us"] = statistics.median(r["cudatimer"] for r in runs)
    return out


# -- 2. decode ---------------------------------------------------------------------------------
def _every_module(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    return [(n, m) for n, m in model.named_modules() if not isinstance(m, torch.nn.ModuleList)]


def decode(args: argparse.Namespace, device: str) -> dict[str, Any]:
    cfg = GPTConfig(vocab=256, seq=32, layers=2, width=64, heads=4) if args.smoke else GPTConfig()
    torch.manual_seed(0)
    model = GPT(cfg).to(device).eval()
    idx = torch.randint(0, cfg.vocab, (1, 1), device=device)
    modules = _every_module(model)

    def run(n: int) -> None:
        with torch.no_grad():
            for _ in range(n):
                model(idx)

    # instrument(): its wrappers on every module, on and off as the rounds need.
    t_inst = cudatimer.Timer(name="decode-instrument")
    t_manual = cudatimer.Timer(name="decode-manual")
    manual_forwards: list[tuple[torch.nn.Module, Any]] = []
    for name, module in modules:
        region = t_manual.region(name or "model")
        fwd = module.forward

        def timed(*a: Any, _f: Any = fwd, _r: Any = region, **k: Any) -> Any:
            with _r:
                return _f(*a, **k)

        manual_forwards.append((module, timed))

    # The floors: a Python wrapper around each forward doing nothing (what any per-module
    # wrapper costs), the same wrapper with two pre-created torch.Event records on a cached
    # stream, and with two records as cudatimer makes them (a pooled event recorded through the
    # recorder's stream record, raw cudaEventRecord in the C core, given back at once).
    wrapper_forwards: list[tuple[torch.nn.Module, Any]] = []
    for _, module in modules:

        def bare(*args: Any, _f: Any = module.forward, **k: Any) -> Any:
            return _f(*args, **k)

        wrapper_forwards.append((module, bare))
    floor_forwards: list[tuple[torch.nn.Module, Any]] = []
    core_forwards: list[tuple[torch.nn.Module, Any]] = []
    if device == "cuda":
        stream = torch.cuda.current_stream()
        from cudatimer.core import _device  # (here: a --before copy of the package may lack it)

        rec = _device.current_rec()
        assert rec is not None
        take, give = rec.take, rec.give
        for _, module in modules:
            a = torch.Event(device="cuda", enable_timing=True)
            b = torch.Event(device="cuda", enable_timing=True)
            fwd = module.forward

            def floor(*args: Any, _f: Any = fwd, _a: Any = a, _b: Any = b, **k: Any) -> Any:
                _a.record(stream)
                out = _f(*args, **k)
                _b.record(stream)
                return out

            def core(*args: Any, _f: Any = fwd, **k: Any) -> Any:
                give(take())
                out = _f(*args, **k)
                give(take())
                return out

            floor_forwards.append((module, floor))
            core_forwards.append((module, core))
    swapped = {
        "manual": manual_forwards,
        "wrapper": wrapper_forwards,
        "torch-floor": floor_forwards,
        "core-floor": core_forwards,
    }

    state = {"mode": "none"}
    handle: list[Any] = []

    def switch(mode: str) -> None:
        if state["mode"] == mode:
            return
        if handle:
            handle.pop().remove()
        for module, _ in manual_forwards:
            module.__dict__.pop("forward", None)
        if mode == "instrument":
            handle.append(cudatimer.instrument(model, timer=t_inst))
        elif mode in swapped:
            for module, forward in swapped[mode]:
                module.forward = forward
        state["mode"] = mode

    modes = ("none", "instrument", "manual", "wrapper")
    modes += ("torch-floor", "core-floor") if floor_forwards else ()
    loops: dict[str, Loop] = {m: run for m in modes}
    added = paired_rounds(
        loops, args.decode_iters, args.rounds, device == "cuda", seed=7, setup=switch
    )
    switch("none")
    base = []
    for _ in range(args.rounds // 4 or 1):  # the plain decode's own time, for the slowdown
        _sync(device == "cuda")
        t0 = time.perf_counter()
        run(args.decode_iters)
        _sync(device == "cuda")
        base.append((time.perf_counter() - t0) / args.decode_iters)
    plain_s = statistics.median(base)
    inst_s, manual_s = trimmed_mean(added["instrument"]), trimmed_mean(added["manual"])
    regions = len(t_inst.summary().regions)
    floor: dict[str, float] = {}
    for mode in ("wrapper", "torch-floor", "core-floor"):
        if mode in added:
            floor_s = trimmed_mean(added[mode])
            key = mode.replace("-", "_")
            floor[f"{key}_slowdown"] = (plain_s + floor_s) / plain_s
            floor[f"{key}_us_per_module"] = floor_s / len(modules) * 1e6
            floor[f"instrument_vs_{key}"] = inst_s / floor_s
    return {
        **floor,
        "modules": len(modules),
        "regions_recorded": regions,
        "plain_decode_ms": plain_s * 1e3,
        "instrument_slowdown": (plain_s + inst_s) / plain_s,
        "manual_slowdown": (plain_s + manual_s) / plain_s,
        "instrument_us_per_module": inst_s / len(modules) * 1e6,
        "manual_us_per_module": manual_s / len(modules) * 1e6,
        "instrument_vs_manual": inst_s / manual_s,
    }


# -- 3. memory -----------------------------------------------------------------------------------
def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def memory(args: argparse.Namespace, device: str) -> dict[str, Any]:
    n = 10**4 if args.smoke else 10**6
    x = torch.ones(8, device=device)
    timer = cudatimer.Timer(name="memory")
    region = timer.region("r")
    for _ in range(n // 10):  # warm: pools, pending queue, step series at their cap
        with region:
            x.add_(1)
    gc.collect()
    before = _rss_mb()
    for _ in range(n):
        with region:
            x.add_(1)
    gc.collect()
    after = _rss_mb()
    calls = timer.summary().regions[0].calls
    return {
        "regions": n,
        "rss_growth_mb": after - before,
        "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "calls": calls,
    }


# -- 4 and 5. another core or another copy of the package, in its own process ----------------
def child(args: argparse.Namespace, device: str) -> dict[str, Any]:
    """The launch loop's cudatimer and torch floor in this process (its own unwrapped rounds)."""
    loops, per_iter = launch_loops(device)
    loops.pop("raw-floor", None)
    runs, ratios = [], []
    for run in range(args.runs):
        added = paired_rounds(loops, args.iters, args.rounds, device == "cuda", seed=run)
        runs.append(trimmed_mean(added["cudatimer"]) / per_iter * 1e6)
        if "torch-floor" in added:
            ratios.append(trimmed_mean(added["cudatimer"]) / trimmed_mean(added["torch-floor"]))
    return {
        "compiled": cudatimer.compiled(),
        "cudatimer_us_runs": runs,
        "cudatimer_us": statistics.median(runs),
        "vs_torch_floor": ratios,
        "median_vs_torch_floor": statistics.median(ratios) if ratios else None,
    }


def run_child(args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", "--runs", str(args.runs)]
    command += ["--rounds", str(args.rounds), "--iters", str(args.iters)]
    command += ["--smoke"] if args.smoke else []
    done = subprocess.run(
        command, env=dict(os.environ, **env), capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"child {env} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


# The figures main() can measure (pure: the pure-Python core against this run's launch loop).
PARTS = ("launch", "decode", "memory", "pure")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=Path("."))
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--rounds", type=int, default=120)
    p.add_argument("--iters", type=int, default=4)
    p.add_argument("--decode-iters", type=int, default=8)
    p.add_argument("--smoke", action="store_true", help="tiny sizes: checks that it runs")
    p.add_argument(
        "--before", type=Path, help="a checkout of another version, measured in its own process"
    )
    p.add_argument(
        "--parts", default=",".join(PARTS), help=f"comma-separated, of: {', '.join(PARTS)}"
    )
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    parts = set(args.parts.split(","))
    if not parts <= set(PARTS):
        p.error(f"--parts: unknown {sorted(parts - set(PARTS))}")
    if args.smoke:
        args.runs, args.rounds, args.iters, args.decode_iters = 1, 3, 1, 1
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.child:
        print(json.dumps(child(args, device)))
        return
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__,
        "compiled": cudatimer.compiled(),
        "date": time.strftime("%Y-%m-%d"),
    }
    measures = {"launch": launch, "decode": decode, "memory": memory}
    for part in ("launch", "decode", "memory"):
        if part in parts:
            result[part] = measures[part](args, device)
    if "pure" in parts and "launch" in parts:  # the pure core against this run's C core
        pure = run_child(args, {"CUDATIMER_PURE_PYTHON": "1"})
        result["pure"] = pure
        result["pure_vs_c_per_region"] = pure["cudatimer_us"] / result["launch"]["cudatimer_us"]
    if args.before is not None:
        result["before"] = run_child(args, {"CUDATIMER_TREE": str(args.before.resolve())})
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "eager_targets.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
