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


#: How many distinct names the process registers as NVTX strings (all domains together). An
#: attached tool keeps every registered string for the life of the process (NVTX has no call
#: to forget one): 200,000 distinct names grew a process under a tool by 86 MB that reset()
#: never gave back. Names past the bound are pushed as plain messages instead (below).
REGISTERED_NAMES = 4096

# (domain, name) of every string registered so far: at most REGISTERED_NAMES entries.
_registered: set[tuple[str, str]] = set()


def _nothing(*args: Any) -> None:
    return None


def _plain_calls() -> tuple[Any, Any, Any, Any, Any] | None:
    """torch's NVTX calls with a plain message (nvtxRangePushA and friends, NVTX's default
    domain): nothing registered, so nothing kept per name. Builtins, called with no Python
    frame in between (see push). None where torch was built without NVTX."""
    try:
        import torch

        n = torch._C._nvtx
        return n.rangePushA, n.rangePop, n.rangeStartA, n.rangeEnd, n.markA
    except (ImportError, AttributeError):  # pragma: no cover - torch without NVTX
        return None


class PlainDomain:
    """Where a region past ``REGISTERED_NAMES`` pushes its range: a plain message in NVTX's
    default domain (Nsight shows the name as it is, without the domain's prefix and color);
    the region's ``attrs`` is then the name itself."""

    __slots__ = ("end", "live", "mark", "pop", "push", "start")

    def __init__(self) -> None:
        calls: tuple[Any, ...] = _plain_calls() or ()
        self.live = bool(calls)
        fns: tuple[Any, ...] = calls or (_nothing,) * 5
        self.push: Any = fns[0]
        self.pop: Any = fns[1]
        self.start: Any = fns[2]
        self.end: Any = fns[3]
        self.mark: Any = fns[4]


class Domain:
    """One NVTX domain; ``live`` is False when NVTX is off or no tool is attached.

    ``push``, ``pop``, ``start`` and ``end`` are the nvtx package's own bound methods (C
    functions): between a Python-level wrapper's first instruction, where CPython runs signal
    handlers, and its call into NVTX, a KeyboardInterrupt could not be told from one raised
    after the range was pushed; with no Python frame in between, an exception raised as the
    call returns always means the range was pushed (the recorder's enter relies on it)."""

    __slots__ = ("_categories", "_d", "end", "live", "name", "plain", "pop", "push", "start")

    def __init__(self, name: str, *, enabled: bool = True) -> None:
        self.name = name
        self._categories: dict[str, int] = {}
        on = enabled and ENABLED and _nvtx is not None
        self._d: Any = _nvtx.get_domain(name) if on and _nvtx is not None else None
        # DummyDomain means no tool was found at the first NVTX call: every call would be a no-op.
        self.live = self._d is not None and type(self._d).__name__ != "DummyDomain"
        d: Any = self._d
        if self.live:
            self.push, self.pop = d.push_range, d.pop_range
            self.start, self.end = d.start_range, d.end_range
        else:
            self.push = self.pop = self.start = self.end = _nothing
        self.plain: PlainDomain | None = None  # made when a name first goes past the bound

    def attributes(
        self, message: str, color: int, category: int | str | None, payload: float | None
    ) -> Any:
        """Build (once per region and option set) the attributes pushed on every call. None
        when NVTX is off; past ``REGISTERED_NAMES`` names, the message itself, pushed
        through ``plain_domain()`` (``registered(message)`` tells which)."""
        if not self.live:
            return None
        key = (self.name, message)
        if key not in _registered:
            if len(_registered) >= REGISTERED_NAMES:
                return message if self.plain_domain().live else None
            _registered.add(key)
        return self._d.get_event_attributes(
            message=message, color=color, category=category, payload=payload
        )

    def plain_domain(self) -> PlainDomain:
        if self.plain is None:
            self.plain = PlainDomain()
        return self.plain

    def of(self, attrs: Any) -> Domain | PlainDomain:
        """The domain that pushes ``attrs`` (what ``attributes`` returned)."""
        return self.plain_domain() if isinstance(attrs, str) else self

    def mark(self, attrs: Any) -> None:
        if isinstance(attrs, str):
            self.plain_domain().mark(attrs)
        else:
            self._d.mark(attrs)
