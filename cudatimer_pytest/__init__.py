"""The ``cudatimer_gate`` pytest fixture: a per-region performance gate inside a test.

Installed with cudatimer and loaded by pytest through its ``pytest11`` entry point. Loading it
costs nothing: this module imports neither cudatimer nor torch; the fixture does, in the tests
that ask for it.

    def test_attention_speed(cudatimer_gate):
        for _ in range(50):
            with cudatimer_gate.region("attention"):
                attention(x)
            cudatimer_gate.step()        # per-step samples (optional: else per call)

At the end of the test its regions are compared with the test's baseline file, as
``cudatimer compare BASELINE NEW --max-slowdown 0.05`` would: a region significantly slower
fails the test with the table. A missing baseline is written (the test passes), and
``--cudatimer-update-baselines`` writes every baseline anew. Baselines live in
``.cudatimer-baselines/`` under the rootdir (ini: ``cudatimer_baselines``), one folder per
device name (a run on another GPU starts its own baselines), one file per test.
"""

from __future__ import annotations

import os
import re
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

__all__ = ["Gate", "cudatimer_gate"]

_WRITTEN = pytest.StashKey[list[Path]]()
_GATE = pytest.StashKey["Gate"]()
_UNSAFE = re.compile(r"[^A-Za-z0-9._\[\]-]+")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("cudatimer", "cudatimer performance gate")
    group.addoption(
        "--cudatimer-update-baselines",
        action="store_true",
        default=False,
        help="write the baselines of tests that use cudatimer_gate anew (no comparison)",
    )
    parser.addini(
        "cudatimer_baselines",
        "folder of cudatimer_gate baselines, relative to the rootdir",
        default=".cudatimer-baselines",
    )
    parser.addini(
        "cudatimer_max_slowdown", "cudatimer_gate: the largest slowdown let pass", default="0.05"
    )
    parser.addini(
        "cudatimer_confidence", "cudatimer_gate: for all regions together", default="0.95"
    )
    parser.addini(
        "cudatimer_fail_undecided",
        "cudatimer_gate: fail regions too noisy for a verdict",
        type="bool",
        default=False,
    )
    parser.addini(
        "cudatimer_absolute",
        "cudatimer_gate: gate raw ratios, not ratios divided by the run-wide speed factor",
        type="bool",
        default=False,
    )


def _part(text: str) -> str:
    return _UNSAFE.sub("_", text).strip("_") or "_"


def _ini_float(config: pytest.Config, name: str) -> float:
    text = str(config.getini(name))
    try:
        return float(text)
    except ValueError:
        raise pytest.UsageError(f"ini option {name} must be a number, got {text!r}") from None


class Gate:
    """What ``cudatimer_gate`` gives a test: ``region(name)`` (a region of its own Timer),
    ``step()``, and the gate's options (``max_slowdown``, ``stat``, ``confidence``,
    ``fail_undecided``, ``absolute``), which a test may change before it ends."""

    def __init__(self, node_id: str, config: pytest.Config) -> None:
        self.node_id = node_id
        self.folder = Path(str(config.rootpath)) / str(config.getini("cudatimer_baselines"))
        self.update = bool(config.getoption("cudatimer_update_baselines"))
        self.max_slowdown = _ini_float(config, "cudatimer_max_slowdown")
        self.confidence = _ini_float(config, "cudatimer_confidence")
        self.fail_undecided = bool(config.getini("cudatimer_fail_undecided"))
        self.absolute = bool(config.getini("cudatimer_absolute"))
        self.stat = "p50"
        self._config = config
        self._timer: Any = None

    @property
    def timer(self) -> Any:
        """The test's own ``cudatimer.Timer`` (made on first use: this imports cudatimer)."""
        if self._timer is None:
            import cudatimer

            self._timer = cudatimer.Timer(name=f"gate:{self.node_id}")
        return self._timer

    def region(self, name: str, **options: Any) -> Any:
        """``with cudatimer_gate.region("attention"):``, options as ``Timer.region``."""
        return self.timer.region(name, **options)

    def step(self) -> int:
        """Mark a step: the gate then compares per-step sums (else per-call durations)."""
        return int(self.timer.step())

    def baseline_path(self, device: str) -> Path:
        parts = [_part(p) for p in re.split(r"::|/", self.node_id) if p]
        return self.folder.joinpath(_part(device), *parts[:-1], parts[-1] + ".json")

    def finish(self) -> str | None:
        """Compare with the baseline (or write it); the failure's text, or None."""
        if self._timer is None:
            return None
        import cudatimer

        run = self._timer.summary(step_stats=True)
        if not run.regions:
            return None
        path = self.baseline_path(dict(run.meta).get("device", "unknown device"))
        if self.update or not path.exists():
            self._timer.save(path)
            self._config.stash.setdefault(_WRITTEN, []).append(path)
            return None
        result = cudatimer.compare(
            cudatimer.load(path),
            run,
            max_slowdown=self.max_slowdown,
            stat=self.stat,
            confidence=self.confidence,
            fail_undecided=self.fail_undecided,
            absolute=self.absolute,
        )
        if result.ok:
            return None
        where = os.path.relpath(path, str(self._config.rootpath))
        return (
            f"{cudatimer.compare_report(result)}\nbaseline: {where}; if the new times are "
            "right, rerun with --cudatimer-update-baselines"
        )


@pytest.fixture
def cudatimer_gate(request: pytest.FixtureRequest) -> Generator[Gate, None, None]:
    """A per-region performance gate: ``with cudatimer_gate.region("attention"): ...``."""
    gate = Gate(request.node.nodeid, request.config)
    request.node.stash[_GATE] = gate
    yield gate


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    # After the test body passed, in its call phase: a slowdown fails the test itself (a
    # fixture's teardown could only make it an error).
    result = yield
    gate = item.stash.get(_GATE, None)
    if gate is not None:
        failure = gate.finish()
        if failure is not None:
            pytest.fail(failure, pytrace=False)
    return result


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    written = config.stash.get(_WRITTEN, [])
    if written:
        root = str(config.rootpath)
        folders = sorted({os.path.relpath(p.parent, root) for p in written})
        terminalreporter.write_line(
            f"cudatimer: wrote {len(written)} baseline(s) in {', '.join(folders)}"
        )
