"""The timers compared, each behind one small interface.

Only ``region(name)`` runs in the hot path: the benchmark wraps every chosen module's forward as
``with region(name): return forward(...)``, the same wrapper for every timer, so only the timer
differs. ``start_round``/``end_round`` bracket one timed block (a profiler session starts and
stops there, outside the clock); ``drain`` resolves and frees what a timer accumulated;
``report`` produces the timer's own report. Each competitor is built the way its users write it
(Megatron's synchronizing timer, DeepSpeed's new-event-pair timer, Lightning, torchtnt, ...).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import sys
import tempfile
import time
import types
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

RegionFactory = Callable[[str], contextlib.AbstractContextManager[Any]]


class SkipTimer(Exception):
    """The timer cannot run here (no CUDA, a package missing); the message says why."""


class _Null:
    """A shared do-nothing context manager (the wrapper alone, and the disabled baseline)."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_NULL = _Null()


def _null_region(name: str) -> _Null:
    return _NULL


class TimerAdapter:
    """One timing tool. Subclasses set ``region``; the other hooks default to nothing."""

    #: False for the baseline: the model runs unwrapped.
    wraps: bool = True

    def __init__(self) -> None:
        self.region: RegionFactory = _null_region

    def wrap_modules(self, modules: list[tuple[str, nn.Module]]) -> Callable[[], None] | None:
        """Wrap the modules this timer's own way and return the undo; None: the benchmark's
        common wrapper (``with region(name): forward(...)``) is used."""
        return None

    def start_round(self) -> None:
        """Before a timed block, outside the clock (e.g. start a profiler session)."""

    def end_round(self) -> None:
        """After a timed block, outside the clock (e.g. stop the profiler session)."""

    def drain(self) -> int | None:
        """Resolve and free what accumulated; return how many regions were recorded, if known."""
        return None

    def report(self) -> str | None:
        """Produce the timer's report (None: this tool has no report of its own)."""
        return None

    def resolve(self) -> None:
        """Turn what is pending into results, as asking for a report would, without freeing
        it (the resolution check times this); nothing to do for timers that resolve nothing."""

    def close(self) -> None:
        """Release everything (sessions, files)."""


# -- baselines ------------------------------------------------------------------------------------


class NoTimer(TimerAdapter):
    wraps = False


class WrapOnly(TimerAdapter):
    """The forward wrapper with an empty context manager: what the wrapping alone costs."""


class _FloorRegion:
    __slots__ = ("_end", "_start", "_stream")

    def __init__(self) -> None:
        # Measured on an H200: torch.Event.record(cached stream) is 1.6 us, the cheapest
        # timing record.
        self._start = torch.Event(device="cuda", enable_timing=True)
        self._end = torch.Event(device="cuda", enable_timing=True)
        self._stream = torch.cuda.current_stream()

    def __enter__(self) -> None:
        self._start.record(self._stream)

    def __exit__(self, *exc: object) -> None:
        self._end.record(self._stream)


class Floor(TimerAdapter):
    """Two pre-created timing events re-recorded on a cached stream, never resolved: the least
    any event timer can cost per region."""

    def __init__(self) -> None:
        super().__init__()
        ctx = _FloorRegion()
        ctx.__enter__()  # the first record creates the CUDA event (+1.5 us): do it here
        ctx.__exit__(None, None, None)

        def region(name: str) -> _FloorRegion:
            return ctx

        self.region = region


# -- cudatimer ----------------------------------------------------------------------------------


class Cudatimer(TimerAdapter):
    def __init__(
        self, mode: Literal["full", "nvtx", "events"] = "full", enabled: bool = True
    ) -> None:
        super().__init__()
        import cudatimer

        self._timer: Any = cudatimer.Timer(f"bench-{mode}", mode=mode, enabled=enabled)
        self.region = self._timer.region

    def drain(self) -> int:
        summary = self._timer.summary()
        n = int(sum(r.calls for r in summary.regions))
        self._timer.reset()
        return n

    def resolve(self) -> None:
        # Waits for the GPU (already idle when timed), resolves every pending event pair.
        self._timer.summary()

    def report(self) -> str:
        with contextlib.redirect_stdout(_Sink()):  # Timer.report() also prints the table
            text: str = self._timer.report()
        return text


#: What the pure-Python core's process is started with: cudatimer picks its core once, at
#: import, so the two cores cannot be switched inside one process.
PURE_PYTHON_ENV = (("CUDATIMER_PURE_PYTHON", "1"),)


class CudatimerPure(Cudatimer):
    """cudatimer on its pure-Python core (``cudatimer.core._core_py``, what an install without a C
    compiler runs). Only in a process started with ``CUDATIMER_PURE_PYTHON=1``: the suite
    measures it in a process of its own (``compare.py --child cudatimer-py``)."""

    def __init__(self) -> None:
        from cudatimer.core import _core

        if _core.IMPL != "python":
            raise SkipTimer(
                "needs a process started with CUDATIMER_PURE_PYTHON=1 (the core is chosen at "
                f"import; this one runs the {_core.IMPL} core)"
            )
        super().__init__("full")


class CudatimerTimed(Cudatimer):
    """cudatimer's own module decorator, ``timer.timed(module, name=...)``: it replaces
    ``module.forward`` like the common wrapper does, but enters the region without the context
    manager protocol or a per-call region lookup."""

    def wrap_modules(self, modules: list[tuple[str, nn.Module]]) -> Callable[[], None]:
        done: list[nn.Module] = []

        def undo() -> None:
            for m in done:
                m.__dict__.pop("forward", None)

        try:
            for name, module in modules:
                self._timer.timed(module, name=name)
                done.append(module)
        except BaseException:
            undo()
            raise
        return undo


class _Sink:
    def write(self, s: str) -> int:
        return len(s)

    def flush(self) -> None:
        return None


# -- NVTX and the PyTorch profiler ----------------------------------------------------------------


class NvtxAnnotate(TimerAdapter):
    """``with nvtx.annotate(name):`` built per region, as most code writes it."""

    def __init__(self) -> None:
        super().__init__()
        import nvtx

        self.region = nvtx.annotate


class RecordFunction(TimerAdapter):
    """``torch.profiler.record_function(name)`` with no profiler running (left in code)."""

    def __init__(self) -> None:
        super().__init__()
        self.region = torch.profiler.record_function


def _profiler_activities() -> list[torch.profiler.ProfilerActivity]:
    acts = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    return acts


class TorchProfiler(TimerAdapter):
    """``torch.profiler.profile`` running (CPU + CUDA activities) + ``record_function`` per
    region. The session starts and stops around each block, outside the clock."""

    def __init__(self) -> None:
        super().__init__()
        self.region = torch.profiler.record_function
        self._prof: torch.profiler.profile | None = None

    def start_round(self) -> None:
        self._prof = torch.profiler.profile(activities=_profiler_activities())
        self._prof.start()

    def end_round(self) -> None:
        if self._prof is not None:
            self._prof.stop()

    def drain(self) -> None:
        self._prof = None
        return None

    def report(self) -> str | None:
        if self._prof is None:
            return None
        text: str = self._prof.key_averages().table(sort_by="cpu_time_total", row_limit=20)
        return text

    def close(self) -> None:
        self._prof = None


# -- what training frameworks ship ----------------------------------------------------------------


class _MegatronTimer:
    """Megatron-LM's ``_Timer``: synchronize, read the clock; synchronize, add the elapsed time.
    One object per name, reused, as ``timers(name).start()`` / ``.stop()`` does."""

    __slots__ = ("_start", "calls", "elapsed")

    def __init__(self) -> None:
        self.elapsed = 0.0
        self.calls = 0
        self._start = 0.0

    def __enter__(self) -> None:
        torch.cuda.synchronize()
        self._start = time.time()

    def __exit__(self, *exc: object) -> None:
        torch.cuda.synchronize()
        self.elapsed += time.time() - self._start
        self.calls += 1


class SyncTimer(TimerAdapter):
    """``torch.cuda.synchronize()`` + clock around each region (Megatron-LM's timers)."""

    def __init__(self) -> None:
        super().__init__()
        timers: dict[str, _MegatronTimer] = {}

        def region(name: str) -> _MegatronTimer:
            t = timers.get(name)
            if t is None:
                t = timers[name] = _MegatronTimer()
            return t

        self._timers = timers
        self.region = region

    def drain(self) -> int:
        n = sum(t.calls for t in self._timers.values())
        for t in self._timers.values():
            t.elapsed, t.calls = 0.0, 0
        return n

    def report(self) -> str:
        return "\n".join(
            f"{name}: {t.elapsed * 1e3:.3f} ms / {t.calls}" for name, t in self._timers.items()
        )


class _DeepSpeedTimer:
    """DeepSpeed's ``SynchronizedWallClockTimer.Timer``: a new timing event pair per start/stop,
    ``record()`` with no stream, kept until the elapsed time is read."""

    __slots__ = ("_start", "pairs")

    def __init__(self) -> None:
        self._start: torch.cuda.Event | None = None
        self.pairs: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []

    def __enter__(self) -> None:
        self._start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        self._start.record()

    def __exit__(self, *exc: object) -> None:
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end.record()
        assert self._start is not None
        self.pairs.append((self._start, end))
        self._start = None

    def resolve(self) -> tuple[float, int]:
        # DeepSpeed's CudaEventTimer.get_elapsed_msec: wait for the end event, read the span.
        total = 0.0
        for start, end in self.pairs:
            end.synchronize()
            total += start.elapsed_time(end)
        n = len(self.pairs)
        self.pairs.clear()
        return total, n


class EventPairTimer(TimerAdapter):
    """A new pair of timing events per region, resolved at report time (DeepSpeed's pattern)."""

    def __init__(self) -> None:
        super().__init__()
        timers: dict[str, _DeepSpeedTimer] = {}

        def region(name: str) -> _DeepSpeedTimer:
            t = timers.get(name)
            if t is None:
                t = timers[name] = _DeepSpeedTimer()
            return t

        self._timers = timers
        self.region = region

    def drain(self) -> int:
        return sum(t.resolve()[1] for t in self._timers.values())

    def report(self) -> str:
        lines = []
        for name, t in self._timers.items():
            ms, n = t.resolve()
            lines.append(f"{name}: {ms:.3f} ms / {n}")
        return "\n".join(lines)


class LightningSimple(TimerAdapter):
    """Lightning's ``SimpleProfiler().profile(name)``: host clock, no CUDA synchronization."""

    def __init__(self) -> None:
        super().__init__()
        try:
            from lightning.pytorch.profilers import SimpleProfiler
        except ImportError:
            try:
                from pytorch_lightning.profilers import SimpleProfiler
            except ImportError as exc:
                raise SkipTimer(f"lightning is not installed ({exc})") from None
        self._prof: Any = SimpleProfiler()
        self.region = self._prof.profile

    def drain(self) -> int:
        n = sum(len(v) for v in self._prof.recorded_durations.values())
        self._prof.recorded_durations = defaultdict(list)
        return n

    def report(self) -> str:
        text: str = self._prof.summary()
        return text


def _lightning_profilers() -> types.ModuleType:
    try:
        return importlib.import_module("lightning.pytorch.profilers")
    except ImportError as exc:
        raise SkipTimer(f"lightning is not installed ({exc})") from None


class LightningCudatimer(TimerAdapter):
    """``cudatimer.lightning.CudaTimerProfiler().profile(name)``: each action a cudatimer
    region through Lightning's Profiler interface (start/stop), as ``Trainer(profiler=...)``
    calls it; GPU time, no sync."""

    def __init__(self) -> None:
        super().__init__()
        _lightning_profilers()
        import cudatimer
        from cudatimer.lightning import CudaTimerProfiler

        self._timer: Any = cudatimer.Timer("bench-lightning")
        self._prof = CudaTimerProfiler(timer=self._timer, mark_steps=False)
        self.region = self._prof.profile

    def drain(self) -> int:
        n = int(sum(r.calls for r in self._timer.summary().regions))
        self._timer.reset()
        self._prof._regions = {}  # reset() released the Regions; make them again
        return n

    def resolve(self) -> None:
        self._timer.summary()

    def report(self) -> str:
        return self._prof.summary()


class LightningPyTorch(TimerAdapter):
    """Lightning's ``PyTorchProfiler().profile(name)``: a torch.profiler session (started at
    the first action) and a ``record_function`` per action; stopped after each block."""

    def __init__(self) -> None:
        super().__init__()
        self._prof: Any = _lightning_profilers().PyTorchProfiler()
        # Its default schedule advances only on Lightning's own step actions (a Trainer's
        # training_step): outside a Trainer it would stay in "wait" and record nothing, so
        # the session records throughout, as it does in a Trainer's active steps.
        self._prof._schedule = None
        self._prof._profiler_kwargs.pop("schedule", None)
        self.region = self._prof.profile

    def end_round(self) -> None:
        self._prof.teardown(stage=None)  # stops the session; the next action starts one

    def report(self) -> str:
        return "Lightning PyTorchProfiler: session stopped after each block"


def _import_torchtnt_timer() -> types.ModuleType:
    """``torchtnt.utils.timer``; when the package's ``__init__`` fails on an import the timer
    does not need (0.2.4 imports ``pkg_resources``, gone from recent setuptools), load the
    submodules without running the package ``__init__`` files."""
    try:
        return importlib.import_module("torchtnt.utils.timer")
    except ImportError as first:
        spec = importlib.util.find_spec("torchtnt")
        if spec is None or not spec.submodule_search_locations:
            raise SkipTimer(f"torchtnt is not installed ({first})") from None
        for mod in [m for m in sys.modules if m == "torchtnt" or m.startswith("torchtnt.")]:
            del sys.modules[mod]
        root = Path(next(iter(spec.submodule_search_locations)))
        for pkg, where in (("torchtnt", root), ("torchtnt.utils", root / "utils")):
            stub = types.ModuleType(pkg)
            stub.__path__ = [str(where)]
            sys.modules[pkg] = stub
        try:
            return importlib.import_module("torchtnt.utils.timer")
        except ImportError as second:
            raise SkipTimer(f"torchtnt.utils.timer does not import ({second})") from None


class TorchtntTimer(TimerAdapter):
    """torchtnt's ``Timer().time(name)``: ``cuda_sync`` defaults to True when CUDA is available,
    so it synchronizes before and after each region."""

    def __init__(self) -> None:
        super().__init__()
        mod = _import_torchtnt_timer()
        self._mod = mod
        self._timer: Any = mod.Timer()
        self.region = self._timer.time

    def drain(self) -> int:
        n = sum(len(v) for v in self._timer.recorded_durations.values())
        self._timer.reset()
        return n

    def report(self) -> str:
        text: str = self._mod.get_timer_summary(self._timer)
        return text


# -- Triton's Proton ------------------------------------------------------------------------------


def proton_check(device: str = "cuda") -> str | None:
    """A quick check, in this process, that a Proton session works here: two sessions (the
    benchmark starts one per block), a scope around a kernel, finalize. None when it works,
    else the exact error. Run it only where torch.profiler never runs: CUPTI takes one
    subscriber per process, and next to torch.profiler Proton's start raised
    ``RuntimeError: Failed to execute cuptiSubscribe with error 39`` (H200, triton 3.6)."""
    try:
        import triton.profiler as proton
    except Exception as exc:
        return f"triton.profiler does not import: {type(exc).__name__}: {exc}"
    try:
        x = torch.ones(1, device=device)
        with tempfile.TemporaryDirectory(prefix="proton-check-") as d:
            for i in range(2):
                session = proton.start(os.path.join(d, f"check{i}"))
                with proton.scope("check"):
                    x.add_(1)
                if device == "cuda":
                    torch.cuda.synchronize()
                proton.finalize(session)
            files = list(Path(d).glob("*.hatchet"))
        if not files:
            return "Proton wrote no .hatchet file after two sessions"
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}".strip()
    return None


class ProtonScopes(TimerAdapter):
    """Triton's Proton: a session (CUPTI) per block, ``proton.scope(name)`` per region."""

    def __init__(self) -> None:
        super().__init__()
        if importlib.util.find_spec("triton") is None:
            raise SkipTimer("triton is not installed")
        try:
            import triton.profiler as proton
        except Exception as exc:
            raise SkipTimer(f"triton.profiler does not import ({exc})") from None
        self._proton: Any = proton
        self._dir = tempfile.TemporaryDirectory(prefix="proton-")
        self._session: Any = None
        self._n = 0
        self.region = proton.scope

    def start_round(self) -> None:
        self._n += 1
        self._session = self._proton.start(os.path.join(self._dir.name, f"r{self._n}"))

    def end_round(self) -> None:
        if self._session is not None:
            self._proton.finalize(self._session)  # writes r<N>.hatchet
            self._session = None

    def report(self) -> str:
        files = sorted(Path(self._dir.name).glob("*.hatchet"))
        return f"{len(files)} hatchet files, {sum(f.stat().st_size for f in files)} bytes"

    def close(self) -> None:
        self.end_round()
        self._dir.cleanup()


# -- the registry ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class TimerSpec:
    key: str
    description: str
    make: Callable[[], TimerAdapter]
    needs_cuda: bool = False
    default: bool = True
    #: A profiler session owns CUPTI: no sync counting under torch.profiler for it.
    profiler_based: bool = False
    #: The memory test runs its full count for these (the product), others stop at a time cap.
    full_memory_run: bool = False
    #: Why the per-timer checks (syncs, memory, report) skip it; None: they run.
    no_checks: str | None = None
    #: Measured in a separate process of its own (why); None: in the main process.
    own_process: str | None = None
    #: Environment variables that process is started with (on top of the suite's own).
    env: tuple[tuple[str, str], ...] = ()
    #: The timers that process measures next to this one: its rows read against them.
    peers: tuple[str, ...] = ("none", "floor", "cudatimer")
    #: A quick check that the timer works in that process (None: works, else the error).
    quick_check: Callable[[str], str | None] | None = None


TIMERS: tuple[TimerSpec, ...] = (
    TimerSpec("none", "no timer, model unwrapped (baseline)", NoTimer),
    TimerSpec("wrap-only", "the forward wrapper with an empty context manager", WrapOnly),
    TimerSpec(
        "floor",
        "2 pre-created torch.Event(enable_timing) re-recorded on a cached stream, never read",
        Floor,
        needs_cuda=True,
    ),
    TimerSpec(
        "cudatimer",
        "cudatimer.Timer() region: NVTX + pooled events, resolved at report",
        lambda: Cudatimer("full"),
        full_memory_run=True,
    ),
    TimerSpec(
        "cudatimer-py",
        "cudatimer.Timer() region on the pure-Python core (CUDATIMER_PURE_PYTHON=1)",
        CudatimerPure,
        # Its own process runs the report and memory checks too: another core, other numbers.
        full_memory_run=True,
        own_process=(
            "cudatimer chooses its core once, at import: the pure-Python core runs in a process "
            "started with CUDATIMER_PURE_PYTHON=1"
        ),
        env=PURE_PYTHON_ENV,
        # Its own process's cudatimer would be the pure-Python core too: no peer of it there.
        peers=("none", "floor"),
    ),
    TimerSpec(
        "cudatimer-timed",
        "cudatimer's module decorator timer.timed(module, name=...) instead of the common wrapper",
        CudatimerTimed,
        # Only the wrapper differs: the per-timer checks would measure the same recorder.
        no_checks="same recorder as cudatimer",
    ),
    # The nvtx and off modes hold no samples: their memory test stops at the time cap like the
    # competitors' (10 s each for 1e6 regions otherwise), still some 1e5 regions.
    TimerSpec(
        "cudatimer-nvtx",
        "cudatimer.Timer(mode='nvtx'): NVTX range only",
        lambda: Cudatimer("nvtx"),
    ),
    TimerSpec(
        "cudatimer-events",
        "cudatimer.Timer(mode='events'): events, no NVTX",
        lambda: Cudatimer("events"),
        default=False,
        full_memory_run=True,
    ),
    TimerSpec(
        "cudatimer-off",
        "cudatimer.Timer(enabled=False): regions left in code, switched off",
        lambda: Cudatimer("full", enabled=False),
    ),
    TimerSpec("nvtx-annotate", "with nvtx.annotate(name): per region", NvtxAnnotate),
    TimerSpec(
        "torch-profiler",
        "torch.profiler.profile(CPU+CUDA) running + record_function per region",
        TorchProfiler,
        profiler_based=True,
    ),
    TimerSpec("record-function", "record_function per region, no profiler running", RecordFunction),
    TimerSpec(
        "sync-timer",
        "torch.cuda.synchronize() + clock around each region (Megatron-LM timers)",
        SyncTimer,
        needs_cuda=True,
    ),
    TimerSpec(
        "event-pair",
        "new Event pair per region, record() without stream, read later (DeepSpeed timers)",
        EventPairTimer,
        needs_cuda=True,
    ),
    TimerSpec(
        "lightning-simple",
        "lightning SimpleProfiler().profile(name): host clock, no sync",
        LightningSimple,
    ),
    TimerSpec(
        "lightning-cudatimer",
        "cudatimer.lightning.CudaTimerProfiler().profile(name): cudatimer regions, no sync",
        LightningCudatimer,
        default=False,
    ),
    TimerSpec(
        "lightning-pytorch",
        "lightning PyTorchProfiler().profile(name): torch.profiler + record_function",
        LightningPyTorch,
        default=False,
        profiler_based=True,
    ),
    TimerSpec(
        "torchtnt",
        "torchtnt.utils.timer.Timer().time(name): cuda_sync=True on GPUs",
        TorchtntTimer,
    ),
    TimerSpec(
        "proton",
        "triton.profiler session (CUPTI) + proton.scope(name) per region",
        ProtonScopes,
        needs_cuda=True,
        profiler_based=True,
        own_process=(
            "CUPTI takes one subscriber per process; next to torch.profiler, Proton's start "
            "raised 'Failed to execute cuptiSubscribe with error 39'"
        ),
        quick_check=proton_check,
    ),
)

BY_KEY: dict[str, TimerSpec] = {s.key: s for s in TIMERS}


def make(spec: TimerSpec, cuda: bool) -> TimerAdapter:
    """Build ``spec``'s adapter; raises SkipTimer with the reason when it cannot run here."""
    if spec.needs_cuda and not cuda:
        raise SkipTimer("needs CUDA (this run has no GPU)")
    return spec.make()
