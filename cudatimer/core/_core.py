"""The recorder core, chosen once at import: the C implementation (``_speedups``) where it was
built and ``CUDATIMER_PURE_PYTHON`` is not set, else the plain-Python reference
(``_core_py``). Both implement ``_core.pyi``; nothing else in cudatimer imports either."""

from __future__ import annotations

import importlib
from types import ModuleType

from .._config import PURE_PYTHON


def _choose() -> ModuleType:
    if not PURE_PYTHON:
        try:
            return importlib.import_module("cudatimer.core._speedups")
        except ImportError:  # not built (no C compiler at install): the reference runs
            pass
    return importlib.import_module("cudatimer.core._core_py")


_impl = _choose()
globals().update({k: v for k, v in vars(_impl).items() if not k.startswith("__")})
