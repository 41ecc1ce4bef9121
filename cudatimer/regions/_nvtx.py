"""NVTX side of a region: one domain per Timer, attributes built once per region and cached.

Decided once, not per call: whether NVTX is on at all (the ``nvtx`` package importable,
``CUDATIMER_NVTX`` not false, ``NVTX_DISABLE`` unset) and, per domain, whether a tool is attached
(the nvtx package hands back a ``DummyDomain`` when none is, and then we skip the calls entirely).
With cached attributes a push/pop pair costs 0.05-0.12 us (measured on an H200), 10x less than
``nvtx.annotate`` built per call; varying values go in the payload, never in new message strings,
because the nvtx package registers every message string and keeps it for the life of the process.
"""

from __future__ import annotations

import os
import zlib
from typing import Any

from .._config import env_flag

try:  # The nvtx package is a dependency, but regions must keep timing without it.
    import nvtx as _nvtx
except ImportError:  # pragma: no cover - exercised by a subprocess test
    _nvtx = None

ENABLED: bool = (
    _nvtx is not None
    and env_flag("CUDATIMER_NVTX", default=True)
    and not os.environ.get("NVTX_DISABLE")  # the nvtx package disables on any non-empty value
)

# Named colors accepted by ``color=`` (0xRRGGBB); any int 0xRRGGBB is accepted too.
COLORS: dict[str, int] = {
    "red": 0xE6194B,
    "green": 0x3CB44B,
    "yellow": 0xFFE119,
    "blue": 0x4363D8,
    "orange": 0xF58231,
    "purple": 0x911EB4,
    "cyan": 0x42D4F4,
    "magenta": 0xF032E6,
    "lime": 0xBFEF45,
    "pink": 0xFABED4,
    "teal": 0x469990,
    "lavender": 0xDCBEFF,
    "brown": 0x9A6324,
    "beige": 0xFFFAC8,
    "maroon": 0x800000,
    "mint": 0xAAFFC3,
    "olive": 0x808000,
    "apricot": 0xFFD8B1,
    "navy": 0x000075,
    "grey": 0xA9A9A9,
    "gray": 0xA9A9A9,
    "white": 0xFFFFFF,
    "black": 0x000000,
}
# Default colors: distinct, readable on Nsight's dark and light themes.
_PALETTE: tuple[int, ...] = (
    0xE6194B,
    0x3CB44B,
    0x4363D8,
    0xF58231,
    0x911EB4,
    0x42D4F4,
    0xF032E6,
    0xBFEF45,
    0x469990,
    0x9A6324,
    0x800000,
    0x808000,
    0x000075,
    0xFFE119,
    0xDCBEFF,
    0xAAFFC3,
)


def default_color(name: str) -> int:
    """A color that depends only on ``name`` (crc32, not ``hash``: stable across processes)."""
    return _PALETTE[zlib.crc32(name.encode()) % len(_PALETTE)]


def resolve_color(name: str, color: object) -> int:
    """Validate ``color`` (None, a name from COLORS, or an int 0xRRGGBB) and return 0xRRGGBB."""
    if color is None:
        return default_color(name)
    if isinstance(color, bool):
        raise TypeError(f"color must be a color name or an int 0xRRGGBB, got {color!r}")
    if isinstance(color, int):
        if not 0 <= color <= 0xFFFFFF:
            raise ValueError(f"color must be in 0x000000..0xFFFFFF, got {color:#x}")
        return color
    if isinstance(color, str):
        try:
            return COLORS[color.lower()]
        except KeyError:
            known = ", ".join(sorted(COLORS))
            raise ValueError(f"unknown color {color!r}; use one of {known} or 0xRRGGBB") from None
    raise TypeError(f"color must be a color name or an int 0xRRGGBB, got {type(color).__name__}")


class Domain:
    """One NVTX domain; ``live`` is False when NVTX is off or no tool is attached."""

    __slots__ = ("_categories", "_d", "live", "name")

    def __init__(self, name: str, *, enabled: bool = True) -> None:
        self.name = name
        self._categories: dict[str, int] = {}
        on = enabled and ENABLED and _nvtx is not None
        self._d: Any = _nvtx.get_domain(name) if on and _nvtx is not None else None
        # DummyDomain means no tool was found at the first NVTX call: every call would be a no-op.
        self.live = self._d is not None and type(self._d).__name__ != "DummyDomain"

    def attributes(
        self, message: str, color: int, category: int | str | None, payload: float | None
    ) -> Any:
        """Build (once per region and option set) the attributes pushed on every call."""
        if not self.live:
            return None
        return self._d.get_event_attributes(
            message=message, color=color, category=category, payload=payload
        )

    def push(self, attrs: Any) -> None:
        self._d.push_range(attrs)

    def pop(self) -> None:
        self._d.pop_range()

    def start(self, attrs: Any) -> Any:
        return self._d.start_range(attrs)

    def end(self, range_id: Any) -> None:
        self._d.end_range(range_id)

    def mark(self, attrs: Any) -> None:
        self._d.mark(attrs)
