"""Environment switches, read once at import (never on the hot path)."""

from __future__ import annotations

import os

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_flag(name: str, *, default: bool) -> bool:
    """Parse a boolean environment variable; an unknown value is an error, not a silent guess."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(
        f"environment variable {name}={raw!r} is not a boolean; use 1/true/yes or 0/false/no"
    )


#: ``CUDATIMER_DISABLE=1`` turns every region into a no-op at import: decorators return the
#: function unchanged and ``cuda_region`` returns a shared null context.
DISABLED_AT_IMPORT: bool = env_flag("CUDATIMER_DISABLE", default=False)

#: ``CUDATIMER_PURE_PYTHON=1`` runs the recorder's pure-Python core (``_core_py``) even where
#: the C core (``cudatimer.core._speedups``) was built: every event goes through torch's own
#: ``record``/``elapsed_time``. Read once, when ``_core`` picks the core. For debugging and for
#: measuring what the C core saves.
PURE_PYTHON: bool = env_flag("CUDATIMER_PURE_PYTHON", default=False)
