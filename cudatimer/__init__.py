"""cudatimer: where PyTorch GPU time goes, from CUDA events and NVTX ranges, never synchronizing.

>>> import cudatimer
>>> @cudatimer.cuda_timed
... def forward(x):
...     return x * 2
>>> with cudatimer.cuda_region("step"):
...     _ = forward(3)
>>> cudatimer.summary()["step/forward"].calls
1
>>> cudatimer.reset()
"""

from __future__ import annotations

from typing import Any

from ._export import load
from ._hist import ALPHA, Histogram
from ._records import SCHEMA_VERSION, RegionStats, Summary, SyncSite
from ._timer import Region, Timer

__all__ = [
    "ALPHA",
    "SCHEMA_VERSION",
    "Histogram",
    "Region",
    "RegionStats",
    "Summary",
    "SyncSite",
    "Timer",
    "cuda_region",
    "cuda_timed",
    "default_timer",
    "disable",
    "enable",
    "is_enabled",
    "load",
    "report",
    "reset",
    "save",
    "step",
    "summary",
]
__version__ = "0.1.0"

_DEFAULT = Timer()


def default_timer() -> Timer:
    """The Timer behind the module-level functions."""
    return _DEFAULT


def cuda_region(name: str, **options: Any) -> Region:
    """A region of the default Timer: ``with cuda_region("fwd"):`` or ``@cuda_region("fwd")``.

    Options are those of :meth:`Timer.region` (``mode``, ``color``, ``category``, ``payload``,
    ``clock``).
    """
    return _DEFAULT.region(name, **options)


def cuda_timed(fn: Any = None, /, name: str | None = None, **options: Any) -> Any:
    """Decorator: ``@cuda_timed``, ``@cuda_timed("name")`` or ``@cuda_timed(name=..., **opts)``.

    Works on functions, methods, class and static methods, ``nn.Module.forward`` (or a module
    instance), async functions (timed until the coroutine finishes) and generator functions
    (each resume is one call). The default name is the function's ``__qualname__``.
    """
    return _DEFAULT.timed(fn, name=name, **options)


def report(**options: Any) -> str:
    """Print the default Timer's table and return it (reading never clears results)."""
    return _DEFAULT.report(**options)


def summary(*, timeout_s: float = 60.0) -> Summary:
    """The default Timer's results as frozen records."""
    return _DEFAULT.summary(timeout_s=timeout_s)


def reset() -> None:
    """Clear the default Timer's results."""
    _DEFAULT.reset()


def enable() -> None:
    """Turn the default Timer on."""
    _DEFAULT.enable()


def disable() -> None:
    """Turn the default Timer off: regions do no timing and emit no NVTX."""
    _DEFAULT.disable()


def is_enabled() -> bool:
    return _DEFAULT.enabled


def step() -> int:
    """Mark an iteration boundary of the default Timer; returns the new step number."""
    return _DEFAULT.step()


def save(path: str, *, timeout_s: float = 60.0) -> Summary:
    """Write the default Timer's summary as JSON; ``cudatimer.load(path)`` reads it back."""
    return _DEFAULT.save(path, timeout_s=timeout_s)
