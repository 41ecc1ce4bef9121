"""Sync detection on a CUDA device, each case in a fresh process: torch's GPU-trace hooks, once
activated, stay active for the life of the process (torch offers no way to switch them off),
so they must not leak into the other GPU tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]

# A training-like loop: a planted .item() in region a, a .cpu() in b, an explicit
# torch.cuda.synchronize() in c, none in d; then one of each other kind in e, and in "more"
# implicit syncs whose count per call is torch's business.
CHILD = """\
import json
import sys
import warnings

import torch

import cudatimer
from cudatimer import Timer

source, preset = sys.argv[1], sys.argv[2]
torch.cuda.init()
torch.cuda.set_sync_debug_mode(preset)  # what the user had set before detection
mode_before = torch.cuda.get_sync_debug_mode()
filters_before, show_before = list(warnings.filters), warnings.showwarning
timer = Timer(name="gpu")
x = torch.randn(256, 256, device="cuda")
N = 5
detection = cudatimer.detect_syncs(timer=timer, source=source)
for _ in range(N):
    with timer.region("a"):
        y = x @ x
        y.sum().item()  # SITE:item
    with timer.region("b"):
        y = x @ x
        y.cpu()  # SITE:cpu
    with timer.region("c"):
        y = x @ x
        torch.cuda.synchronize()  # SITE:synchronize
    with timer.region("d"):
        y = x @ x
        y.add_(1)
with timer.region("e"):
    ev = torch.cuda.Event()
    ev.record()
    ev.synchronize()  # SITE:event
    torch.cuda.current_stream().synchronize()  # SITE:stream
    if (x > 1e9).any():  # SITE:bool
        pass
with timer.region("more"):  # syncs whose number per call torch may change: at least one each
    torch.ones(4).cuda()  # SITE:cuda
    print(x[0, :2])  # SITE:print
    torch.nonzero(x > 0)  # SITE:nonzero
    x[0, :2].tolist()  # SITE:tolist
x.sum().item()  # outside every region: not counted
with timer.region("report"):
    timer.summary()  # cudatimer's own waits, inside an open region: never counted
mode_during = torch.cuda.get_sync_debug_mode()
cudatimer.detect_syncs(False)
with timer.region("a"):
    x.sum().item()  # detection off: not counted
torch.cuda.synchronize()
s = timer.summary()
print(
    "RESULT",
    json.dumps(
        {
            "source": detection.source,
            "syncs": {r.name: r.syncs for r in s.regions},
            "calls": {r.name: r.calls for r in s.regions},
            "sites": sorted([x.location, x.kind, x.region, x.count] for x in s.sync_sites),
            "mode_before": mode_before,
            "mode_during": mode_during,
            "mode_after": torch.cuda.get_sync_debug_mode(),
            "filters_restored": list(warnings.filters) == filters_before,
            "showwarning_restored": warnings.showwarning is show_before,
        }
    ),
)
"""


def run_child(tmp_path: Path, source: str, preset: str) -> tuple[dict[str, Any], Path]:
    script = tmp_path / "child_syncs.py"
    script.write_text(CHILD)
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(
        [sys.executable, str(script), source, preset],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    return json.loads(line[len("RESULT ") :]), script


def site(script: Path, marker: str) -> str:
    lines = CHILD.splitlines()
    (n,) = [i for i, text in enumerate(lines, 1) if text.endswith(f"# SITE:{marker}")]
    return f"{script}:{n}"


def split_more(out: dict[str, Any], script: Path) -> list[list[Any]]:
    """Take region "more" out of ``out``; check each of its sites is there at least once, at its
    line, with its kind; return the other sites."""
    more = [s for s in out["sites"] if s[2] == "more"]
    by_place = {(loc, kind): count for loc, kind, _, count in more}
    for kind in ("cuda", "print", "nonzero", "tolist"):
        assert by_place.get((site(script, kind), kind), 0) >= 1, (kind, more)
    assert out["syncs"].pop("more") == sum(by_place.values())
    return [s for s in out["sites"] if s[2] != "more"]


def test_trace_counts_every_planted_sync_at_its_line(tmp_path: Path) -> None:
    """Default source (torch's trace hooks): exact counts per region and file:line per sync,
    explicit syncs included; cudatimer's own waits and syncs outside regions never counted."""
    out, script = run_child(tmp_path, "auto", "default")
    assert out["source"] == "trace"
    n = 5
    others = split_more(out, script)
    assert out["syncs"] == {"a": n, "b": n, "c": n, "d": 0, "e": 3, "report": 0}
    assert out["calls"]["a"] == n + 1  # the region after detection stopped ran, uncounted
    assert others == sorted(
        [
            [site(script, "item"), "item", "a", n],
            [site(script, "cpu"), "cpu", "b", n],
            [site(script, "synchronize"), "synchronize", "c", n],
            [site(script, "event"), "event.synchronize", "e", 1],
            [site(script, "stream"), "stream.synchronize", "e", 1],
            [site(script, "bool"), "bool", "e", 1],
        ]
    )
    # The trace source never touches the sync debug mode nor the warning machinery.
    assert out["mode_before"] == out["mode_during"] == out["mode_after"] == 0
    assert out["filters_restored"] and out["showwarning_restored"]


def test_debug_mode_source_counts_implicit_syncs_and_restores_the_mode(tmp_path: Path) -> None:
    """source="debug_mode": .item(), .cpu(), stream.synchronize() and bool are counted; device
    and event syncs are invisible to it; afterwards the debug mode is back to "default"."""
    out, script = run_child(tmp_path, "debug_mode", "default")
    assert out["source"] == "debug_mode"
    n = 5
    others = split_more(out, script)
    assert out["syncs"] == {"a": n, "b": n, "c": 0, "d": 0, "e": 2, "report": 0}
    assert others == sorted(
        [
            [site(script, "item"), "item", "a", n],
            [site(script, "cpu"), "cpu", "b", n],
            [site(script, "stream"), "stream.synchronize", "e", 1],
            [site(script, "bool"), "bool", "e", 1],
        ]
    )
    assert (out["mode_before"], out["mode_during"], out["mode_after"]) == (0, 1, 0)
    assert out["filters_restored"] and out["showwarning_restored"]


def test_debug_mode_source_leaves_a_mode_the_user_set(tmp_path: Path) -> None:
    """A user's own sync debug mode "warn" is the same after detection as before it."""
    out, _ = run_child(tmp_path, "debug_mode", "warn")
    assert out["syncs"]["a"] == 5
    assert (out["mode_before"], out["mode_during"], out["mode_after"]) == (1, 1, 1)
    assert out["filters_restored"] and out["showwarning_restored"]
