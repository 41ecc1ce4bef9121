"""Where a compiled instrumented step's extra time goes (a diagnostic, not a target).

The compiled GPT-2-small training step of ``compile_targets.py``, plain and with every module
instrumented, each step split into host issue time per phase (forward, backward, optimizer;
no sync inside, so a host-bound step's phases add up to its wall time), then one profiled pair
of steps each: kernels per step, GPU busy time per step, the host spans that took longest.

    python benchmarks/compile_phases.py --json results/compile_phases.json   # CUDA only
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _workloads import GPT, GPTConfig

import cudatimer


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=16)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("compile_phases.py needs CUDA", file=sys.stderr)
        return 2
    cfg, batch, seq = GPTConfig(), 8, 512
    torch.manual_seed(0)
    idx = torch.randint(0, cfg.vocab, (batch, seq), device="cuda")
    tgt = idx.roll(1, dims=1)
    models: dict[str, tuple[Any, Any]] = {}
    for name in ("plain", "timed"):
        m = GPT(cfg).cuda()
        if name == "timed":
            cudatimer.instrument(m, timer=cudatimer.Timer(name="phases"))
        opt = torch.optim.AdamW(m.parameters(), lr=1e-4, fused=True)
        models[name] = (torch.compile(m), opt)

    def phases(name: str) -> tuple[float, float, float]:
        compiled, opt = models[name]
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = compiled(idx)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)).float(), tgt.view(-1))
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=True)
        t3 = time.perf_counter()
        return (t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3

    for name in models:
        for _ in range(4):  # compiles, then warms up
            phases(name)
    torch.cuda.synchronize()
    per: dict[str, list[tuple[float, float, float]]] = {n: [] for n in models}
    wall: dict[str, list[float]] = {n: [] for n in models}
    for r in range(args.rounds):
        for name in list(models) if r % 2 == 0 else list(models)[::-1]:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            ph = [phases(name) for _ in range(3)]
            torch.cuda.synchronize()
            wall[name].append((time.perf_counter() - t0) * 1e3 / 3)
            per[name].extend(ph)
    res: dict[str, Any] = {}
    cuda = torch.autograd.DeviceType.CUDA
    for name in models:
        cols = list(zip(*per[name], strict=True))
        res[name] = {
            "wall_ms": statistics.median(wall[name]),
            "issue_fwd_ms": statistics.median(cols[0]),
            "issue_bwd_ms": statistics.median(cols[1]),
            "issue_opt_ms": statistics.median(cols[2]),
        }
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(2):
                phases(name)
            torch.cuda.synchronize()
        ev = prof.key_averages()
        host = [e for e in ev if e.device_type != cuda]
        top = sorted(host, key=lambda e: -e.cpu_time_total)[:25]
        res[name].update(
            {
                "kernels_per_step": sum(e.count for e in ev if e.device_type == cuda) / 2,
                "gpu_busy_ms_per_step": sum(
                    e.self_device_time_total for e in ev if e.device_type == cuda
                )
                / 2e3,
                "cpu_top": [(e.key, round(e.cpu_time_total / 2e3, 3), e.count // 2) for e in top],
            }
        )
    print(json.dumps(res, indent=1))
    if args.json:
        args.json.write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
