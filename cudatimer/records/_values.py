"""Per-call values other than time: the one place a new kind of value (FLOPs, memory) is added.

A kind of value is a ``Column``: a name with its unit, and the statistics its tables show.
Every column folds the same way, into a ``Tally`` (calls that carried a value, their sum,
least and most: signed values welcome, unlike the time histograms, which fold values <= 0
into zeros), so one contract covers the whole path of a value:

- record: ``Recorder.values.add`` (``recorder/_values.py``), per region path and clock, whole
  run and per kept step;
- records: ``RegionStats.values``, a ``Values`` mapping of column name to ``Tally``;
- merge: ``Tally.merge`` (``RegionStats.merge``, ranks folded by ``RankSummary``);
- window: the tallies of the window's steps merged (``last``/``steps``/``warmup``);
- export: JSON ``"values": {name: {"count", "total", "min", "max"}}`` beside a region's
  histograms, present only when the region has values, so files without it (all files
  written before) load as they are; CSV and DataFrame columns ``<name>_<stat>[_<unit>]``
  for the columns a summary holds, so a run without values exports exactly what it did.

>>> probe = register(Column("probe", "bytes"))
>>> probe.fields()
('probe_mean_bytes', 'probe_max_bytes')
>>> t = Tally.of([4.0, -2.0]).merge(Tally.of([10.0]))
>>> t.count, t.total, t.min, t.max, t.mean
(3, 12.0, -2.0, 10.0, 4.0)
>>> unregister("probe")
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

__all__ = [
    "EMPTY",
    "STATS",
    "Column",
    "Tally",
    "Values",
    "column",
    "columns",
    "flop_rates",
    "register",
    "unregister",
]

#: The statistics a column may show in tables, read off its ``Tally``.
STATS = ("mean", "total", "min", "max", "count")
_NAME = re.compile(r"[a-z][a-z0-9_]*")
_UNIT = re.compile(r"[a-z0-9_]*")


@dataclass(frozen=True)
class Tally:
    """Per-call values of one column in one row: ``count`` calls carried one; their ``total``,
    least (``min``) and most (``max``). Never empty (a row without values has no Tally)."""

    count: int
    total: float
    min: float
    max: float

    def __post_init__(self) -> None:
        if isinstance(self.count, bool) or not isinstance(self.count, int) or self.count < 1:
            raise ValueError(f"a Tally counts at least one call, got count={self.count!r}")
        if not self.min <= self.max:
            raise ValueError(f"a Tally's min {self.min!r} must not be above its max {self.max!r}")

    @classmethod
    def of(cls, values: Iterable[float]) -> Tally:
        """The Tally of ``values`` (at least one)."""
        items = [float(v) for v in values]
        if not items:
            raise ValueError("Tally.of needs at least one value")
        return cls(len(items), math.fsum(items), min(items), max(items))

    @property
    def mean(self) -> float:
        return self.total / self.count

    def stat(self, name: str) -> float | int:
        """One of ``STATS`` by name."""
        if name == "mean":
            return self.mean
        value: float | int = getattr(self, name)
        return value

    def merge(self, other: Tally) -> Tally:
        return Tally(
            self.count + other.count,
            self.total + other.total,
            min(self.min, other.min),
            max(self.max, other.max),
        )


class Values(Mapping[str, Tally]):
    """A row's per-call values: column name -> ``Tally``, frozen and hashable like the row.

    >>> v = Values({"probe": Tally.of([1.0])})
    >>> v["probe"].count, "probe" in v, len(Values())
    (1, True, 0)
    """

    __slots__ = ("_items",)

    def __init__(self, items: Mapping[str, Tally] | Iterable[tuple[str, Tally]] = ()) -> None:
        pairs = items.items() if isinstance(items, Mapping) else items
        checked = {}
        for name, tally in pairs:
            if not isinstance(name, str) or not _NAME.fullmatch(name):
                raise ValueError(
                    "value names must be lower case letters, digits and '_', starting with a "
                    f"letter, got {name!r}"
                )
            if not isinstance(tally, Tally):
                raise TypeError(f"values[{name!r}] must be a Tally, got {type(tally).__name__}")
            checked[name] = tally
        self._items: tuple[tuple[str, Tally], ...] = tuple(sorted(checked.items()))

    def __getitem__(self, name: str) -> Tally:
        for key, tally in self._items:
            if key == name:
                return tally
        raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        return (key for key, _ in self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(self._items)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Values):
            return self._items == other._items
        return super().__eq__(other)

    def __repr__(self) -> str:
        return f"Values({dict(self._items)!r})"

    def merge(self, other: Values) -> Values:
        """Both rows' values, the tallies of a column present in both merged."""
        if not other:
            return self
        if not self:
            return other
        out = dict(self._items)
        for name, tally in other._items:
            mine = out.get(name)
            out[name] = tally if mine is None else mine.merge(tally)
        return Values(out)


#: The values of a row that has none.
EMPTY = Values()


@dataclass(frozen=True)
class Column:
    """A kind of per-call value: ``name`` (lower case, e.g. ``"mem_delta"``), its ``unit`` as
    field names carry it (``"bytes"``; ``""`` for a pure count such as FLOP) and the
    statistics (of ``STATS``) its table columns show."""

    name: str
    unit: str = ""
    stats: tuple[str, ...] = ("mean", "max")
    doc: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise ValueError(
                f"a column's name must be lower case letters, digits and '_', starting with a "
                f"letter, got {self.name!r}"
            )
        if not isinstance(self.unit, str) or not _UNIT.fullmatch(self.unit):
            raise ValueError(f"a column's unit must be lower case letters or '', got {self.unit!r}")
        bad = [s for s in self.stats if s not in STATS]
        if not self.stats or bad:
            raise ValueError(f"a column's stats must be some of {', '.join(STATS)}, got {bad}")

    def fields(self) -> tuple[str, ...]:
        """Its table columns: ``<name>_<stat>`` with ``_<unit>`` after (``mem_peak_max_bytes``)."""
        tail = f"_{self.unit}" if self.unit else ""
        return tuple(f"{self.name}_{stat}{tail}" for stat in self.stats)

    def row(self, tally: Tally | None) -> list[float | int | None]:
        """Its table cells for a row with ``tally`` (None: the row has no value of it)."""
        return [None if tally is None else tally.stat(s) for s in self.stats]


# Registered at import by the features that record values (rarely, once each): dict
# operations under the GIL, no lock (none to be held across a fork).
_COLUMNS: dict[str, Column] = {}


def register(col: Column) -> Column:
    """Make ``col`` known (recording refuses unknown names, tables order columns by
    registration). Registering an equal column again is a no-op; another with its name is
    refused."""
    if not isinstance(col, Column):
        raise TypeError(f"column must be a cudatimer Column, got {type(col).__name__}")
    known = _COLUMNS.get(col.name)
    if known is not None and known != col:
        raise ValueError(f"a different column named {col.name!r} is registered: {known}")
    _COLUMNS[col.name] = col
    return col


def unregister(name: str) -> None:
    """Forget the column ``name`` (values already recorded stay in their records)."""
    _COLUMNS.pop(name, None)


def column(name: str) -> Column | None:
    """The registered column ``name``, or None."""
    return _COLUMNS.get(name)


def columns(names: Iterable[str] | None = None) -> tuple[Column, ...]:
    """Every registered column (``names`` None), or the columns of ``names``: the registered
    ones in registration order, then the others (values of a column this process does not
    know, from a loaded file) by name, with the default stats."""
    known = list(_COLUMNS.values())
    if names is None:
        return tuple(known)
    wanted = set(names)
    seen = {c.name for c in known}
    return (
        *(c for c in known if c.name in wanted),
        *(Column(n) for n in sorted(wanted - seen)),
    )


def flop_rates(
    values: Values, calls: int, mean_ms: float | None
) -> tuple[float | None, float | None, float | None, bool]:
    """A row's FLOPs (``flops=True``) from its values and mean time a call (GPU where timed
    on the GPU, else host): (FLOP a call, achieved TFLOP/s, MFU 0-1 or None where the peak is
    unknown, sampled: fewer calls counted than made); all None without counts.

    >>> v = Values({"flop": Tally.of([2e9]), "flop_peak": Tally.of([100.0])})
    >>> flop_rates(v, 1, 2.0)
    (2000000000.0, 1.0, 0.01, False)
    """
    tally = values.get("flop")
    if tally is None:
        return None, None, None, False
    flop = tally.mean
    sampled = tally.count < calls
    if mean_ms is None or not mean_ms > 0 or math.isnan(mean_ms):
        return flop, None, None, sampled
    rate = flop / mean_ms * 1e-9  # FLOP/ms -> TFLOP/s
    peak = values.get("flop_peak")
    mfu = rate / peak.mean if peak is not None and peak.mean > 0 else None
    return flop, rate, mfu, sampled
