"""Hostile arguments: windows that would never end, NVTX attributes past NVTX's C types, odd
timeouts and sizes, names without a UTF-8 form, module names holding "/". Each is refused
at the call with a TypeError or ValueError naming the argument (or, for instrument(), made
to work), the same way with and without an NVTX tool attached."""

from __future__ import annotations

import itertools
import json
import math
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import cudatimer
from cudatimer import Timer
from cudatimer.recorder import _steps as steps_module
from tests.helpers.nvtx_harness import (
    HarnessUnavailable,
    injection_library,
    ranges,
    run_with_injection,
)

REPO_ROOT = Path(__file__).resolve().parents[2]


def _stepped(name: str, steps: int = 6) -> Timer:
    t = Timer(name=name, clock="host")
    for _ in range(steps):
        with t.region("work"):
            pass
        t.step()
    return t


def _finishes(code: str, timeout: float = 60.0) -> str:
    """Run ``code`` in a fresh interpreter that is killed past ``timeout`` s; its stdout."""
    try:
        proc = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code)],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=REPO_ROOT,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running after {timeout} s:\n{code}")
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


# -- 1. windows that never return ------------------------------------------------------------


def _endless() -> Iterator[int]:
    for i in itertools.count():
        if i > 10_000:
            raise AssertionError("the window went on reading an endless iterator")
        yield i


@pytest.mark.parametrize(
    "steps",
    [_endless, lambda: itertools.count(), lambda: iter([1, 2]), lambda: (s for s in [1])],
    ids=["guarded", "count", "iter", "generator"],
)
def test_iterators_are_refused_as_steps(steps: Callable[[], Any]) -> None:
    """steps= refuses iterators and generators (they may never end), saying what to pass."""
    t = _stepped("iterators")
    with pytest.raises(TypeError, match=r"steps must be a range or .*list") as info:
        t.summary(steps=steps())
    assert type(info.value) is TypeError


def test_listed_steps_are_bounded() -> None:
    """A list of more than MAX_LISTED_STEPS step numbers is refused, pointing at range."""
    t = _stepped("listed")
    too_many = list(range(steps_module.MAX_LISTED_STEPS + 1))
    with pytest.raises(ValueError, match=r"steps lists .* pass a range"):
        t.summary(steps=too_many)
    assert t.summary(steps=(1, 3)).steps == 2
    assert t.summary(steps={0, 5, 10**30}).steps == 2


def test_huge_ranges_are_taken_arithmetically() -> None:
    """A range of any length or stride makes a window at once, its length and label bounded."""
    out = _finishes(
        """
        import json, time
        from cudatimer import Timer
        from cudatimer.recorder import _steps
        t = Timer(name="huge", clock="host")
        for _ in range(6):
            with t.region("work"):
                pass
            t.step()
        began = time.monotonic()
        s = t.summary(steps=range(0, 10**12, 2))
        s2 = t.summary(steps=range(1, 10**40, 3), warmup=2)
        w = _steps.select(10**9, 5 * 10**8, 1000, steps=range(0, 10**12, 2), dropped=[5 * 10**8])
        print(json.dumps({
            "seconds": time.monotonic() - began,
            "steps": s.steps, "calls": s["work"].calls, "label": dict(s.meta)["window"],
            "steps2": s2.steps, "label2": dict(s2.meta)["window"],
            "len": len(w), "in": [5 * 10**8 in w, 5 * 10**8 + 2 in w, 3 in w, 10**9 in w],
            "label3": w.label,
        }))
        """
    )
    got = json.loads(out)
    assert got["seconds"] < 5
    # Steps 0, 2, 4 finished and 6 is in progress (named, so in the window).
    assert (got["steps"], got["calls"], got["label"]) == (4, 3, "steps 0, 2, 4, 6")
    assert (got["steps2"], got["label2"]) == (1, "step 4")
    assert got["len"] == 250_000_000 and got["in"] == [False, True, False, True]
    assert got["label3"] == (
        "steps 500000002, 500000004, 500000006, 500000008, 500000010, 500000012, 500000014, "
        "500000016, ... (250000000 steps)"
    )


# -- 2. NVTX attributes: the same checks with and without a tool -------------------------------

_BAD_ATTRIBUTES: list[tuple[str, dict[str, Any]]] = [
    ("payload", {"payload": 2**63}),
    ("payload", {"payload": -(2**63) - 1}),
    ("payload", {"payload": math.nan}),
    ("payload", {"payload": math.inf}),
    ("payload", {"payload": -math.inf}),
    ("category", {"category": 2**32}),
    ("category", {"category": -1}),
    ("category", {"category": "\ud800"}),
    ("name", {"name": "\ud800"}),
]


def _refusals(timer: Timer) -> list[list[str]]:
    """(verb, error type, message) of each bad attribute, through region() and mark()."""
    found = []
    for _, options in _BAD_ATTRIBUTES:
        for verb in (timer.region, timer.mark):
            kwargs = dict(options)
            name = kwargs.pop("name", "r")
            try:
                verb(name, **kwargs)
            except Exception as exc:
                found.append([verb.__name__, type(exc).__name__, str(exc)])
            else:
                found.append([verb.__name__, "accepted", ""])
    return found


_CHILD = """
import enum, json, math, sys
from cudatimer import Timer
from tests.api.test_hostile_args import _refusals
t = Timer(name="attrs", domain="hostile")
found = _refusals(t)
class Kind(enum.IntEnum):
    BIG = 2**40
    CAT = 3
with t.region("edges", payload=2**63 - 1, category=2**32 - 1):
    pass
with t.region("low", payload=-(2**63)):
    pass
with t.region("enum", payload=Kind.BIG, category=Kind.CAT):
    pass
t.mark("mark-edge", payload=2**63 - 1, category=2**32 - 1)
json.dump([t.domain.live, found], open(sys.argv[1], "w"))
"""


@pytest.fixture(scope="module")
def nvtx_tool() -> Path:
    try:
        return injection_library()
    except HarnessUnavailable as exc:
        pytest.skip(str(exc))


def test_bad_attributes_are_refused_without_a_tool() -> None:
    """Out-of-range categories and payloads, NaN/inf payloads and surrogates are refused."""
    found = _refusals(Timer(name="no-tool", domain="hostile"))
    for (what, _), (verb, kind, message) in zip(
        [b for b in _BAD_ATTRIBUTES for _ in range(2)], found, strict=True
    ):
        assert kind == "ValueError", (verb, what, kind, message)
        assert message.startswith(what), (verb, message)


def test_bad_attributes_fail_the_same_with_a_tool(nvtx_tool: Path, tmp_path: Path) -> None:
    """Under an NVTX tool each bad attribute fails with the very message it fails with
    without one, and the extreme valid values reach the tool exactly."""
    out = tmp_path / "found.json"
    recs = run_with_injection(_CHILD, argv=[str(out)])
    live, found = json.loads(out.read_text())
    assert live
    assert found == _refusals(Timer(name="no-tool-2", domain="hostile"))
    got = {r.msg: r for r in ranges(recs, "hostile")}
    edges, low, kind, mark = got["edges"], got["low"], got["enum"], got["mark-edge"]
    assert (edges.payload_type, edges.payload, edges.category) == ("int64", 2**63 - 1, 2**32 - 1)
    assert (low.payload_type, low.payload) == ("int64", -(2**63))
    assert (kind.payload_type, kind.payload, kind.category) == ("int64", 2**40, 3)
    assert (mark.kind, mark.payload, mark.category) == ("mark", 2**63 - 1, 2**32 - 1)


# -- 3. timeouts and sizes ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "timeout", [math.nan, math.inf, -math.inf, 10**400], ids=["nan", "inf", "-inf", "10**400"]
)
def test_timeout_must_be_finite(timeout: float) -> None:
    """timeout_s=nan/inf (a report that could wait for ever) is a ValueError naming it."""
    with pytest.raises(ValueError, match="timeout_s must be a finite number"):
        cudatimer.summary(timeout_s=timeout)
    with pytest.raises(ValueError, match="timeout_s"):
        Timer(name="timeouts").report(timeout_s=timeout)


@pytest.mark.parametrize(
    ("option", "value", "most"),
    [
        ("trace_samples", 2**64, "10,000,000"),
        ("trace_samples", 10**13, "10,000,000"),
        ("keep_steps", 2**64, "1,000,000"),
        ("keep_steps", 10**13, "1,000,000"),
    ],
)
def test_sizes_are_bounded(option: str, value: int, most: str) -> None:
    """keep_steps and trace_samples past their maximum are a ValueError giving the maximum;
    the maximum itself works."""
    with pytest.raises(ValueError, match=f"{option} must be at most {most}") as info:
        Timer(name="sizes", **{option: value})
    assert type(info.value) is ValueError
    t = Timer(name="max-sizes", clock="host", keep_steps=10**6, trace_samples=10**7)
    with t.region("x"):
        pass
    t.step()
    assert t.summary(last=1, trace=True)["x"].calls == 1


# -- 4. names without a UTF-8 form -------------------------------------------------------------


@pytest.mark.parametrize(
    ("what", "call"),
    [
        ("name", lambda: cudatimer.cuda_region("a\ud800")),
        ("name", lambda: cudatimer.mark("\udfff")),
        ("name", lambda: Timer(name="\ud800")),
        ("domain", lambda: Timer(domain="x\ud800")),
        ("category", lambda: Timer(name="cat").region("a", category="\ud800")),
    ],
)
def test_lone_surrogates_are_refused(what: str, call: Callable[[], Any]) -> None:
    """A lone surrogate in a name, domain or category is a ValueError naming it (not a
    UnicodeEncodeError from deep inside)."""
    with pytest.raises(ValueError, match=f"^{what} .*lone surrogate") as info:
        call()
    assert not isinstance(info.value, UnicodeError)


# -- 5. instrument() and module names torch accepts --------------------------------------------


def _odd_model() -> torch.nn.Module:
    model = torch.nn.Sequential()
    model.add_module("a/b", torch.nn.Linear(2, 2))
    model.add_module(" ", torch.nn.ReLU())
    model.add_module("s\ud800", torch.nn.Identity())
    return model


def test_instrument_names_slashes_and_odd_module_names() -> None:
    """A child named "a/b" (torch allows it) is timed as "a\u2215b"; a blank or surrogate
    name is made printable; globs and handle keys keep torch's paths."""
    model = _odd_model()
    t = Timer(name="odd", clock="host")
    with cudatimer.instrument(model, timer=t, backward=True) as handle:
        model(torch.zeros(1, 2, requires_grad=True)).sum().backward()
    assert handle.regions == {
        "": "Sequential",
        "a/b": "a\u2215b",
        " ": "' '",
        "s\ud800": "s\\ud800",
    }
    assert handle.backward_regions["a/b"] == "Sequential.backward/a\u2215b"
    names = t.summary().names
    assert {"Sequential/a\u2215b", "Sequential/' '", "Sequential/s\\ud800"} <= set(names)
    assert "Sequential.backward/a\u2215b" in names
    t2 = Timer(name="odd-glob", clock="host")
    with cudatimer.instrument(model, include="a/*", timer=t2) as only:
        model(torch.zeros(1, 2))
    assert only.regions == {"a/b": "a\u2215b"}


def test_region_name_with_nul_is_refused() -> None:
    """A NUL in a region name is a ValueError naming it (NVTX would cut the name there)."""
    import pytest as _pytest

    import cudatimer as _ct

    with _pytest.raises(ValueError, match="NUL"):
        _ct.Timer(name="nul").region("a\x00b")
