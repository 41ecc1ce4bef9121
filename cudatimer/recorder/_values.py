"""One recorder's per-call values other than time (``records/_values.py`` says what a value
column is): tallies per region path and clock, for the whole run and per kept step.

Outside the core on purpose: a value is measured by a feature around a call (FLOPs counted,
allocator bytes read), never by the hot path, so its fold costs a dict update under the
recorder's lock (~0.5 us) only in the calls that carry one.

>>> from cudatimer.records import _values
>>> from cudatimer.regions._timer import Timer
>>> col = _values.register(_values.Column("probe", "bytes"))
>>> t = Timer(name="values")
>>> with t.region("load"):
...     t.recorder.values.add_open("probe", 4096)
True
>>> t.summary()["load"].values["probe"].total
4096.0
>>> _values.unregister("probe")
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from ..core import _core
from ..core._locks import claim
from ..records._values import Tally, Values, column

__all__ = ["ValueStore"]

_TIMED, _HOST, _SKIP, _UNTIMED = _core.TIMED, _core.HOST, _core.SKIP, _core.UNTIMED

Key = tuple[int, int]  # (slot, device index or -1 for the host clock): a report row
#: One call's values for ``ValueStore.add_each``: (slot, gen, dev, step or None,
#: ((name, value), ...)).
Call = tuple[int, int, int, int | None, tuple[tuple[str, float], ...]]
#: ``Call`` with the number of calls that carried those values, for ``add_counted``.
Counted = tuple[int, int, int, int | None, tuple[tuple[str, float], ...], int]


class _Acc:
    """A Tally being folded."""

    __slots__ = ("count", "hi", "lo", "total")

    def __init__(self, value: float, n: int = 1) -> None:
        self.count = n
        self.total = value * n
        self.lo = value
        self.hi = value

    def add(self, value: float, n: int = 1) -> None:
        self.count += n
        self.total += value * n
        if value < self.lo:
            self.lo = value
        if value > self.hi:
            self.hi = value

    def tally(self) -> Tally:
        return Tally(self.count, self.total, self.lo, self.hi)


def _number(name: str, value: float) -> float:
    """``value`` of column ``name`` as a float, checked."""
    if column(name) is None:
        raise ValueError(f"no value column named {name!r} is registered (records._values.register)")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"value must be a number, got {type(value).__name__}")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"value must be a finite number, got {value!r}")
    return number


def _frozen(accs: dict[Key, dict[str, _Acc]]) -> dict[Key, Values]:
    return {key: Values({n: a.tally() for n, a in by.items()}) for key, by in accs.items()}


class ValueStore:
    """Per-call values of one recorder (``Recorder.values``): ``add`` folds one into the row
    of a region path and clock; ``read`` gives the whole run's and each kept step's."""

    def __init__(self, store: Any, lock: Any, keep_steps: int) -> None:
        self._store = store
        self._lock = lock  # the recorder's: reset() holds it
        self._keep = keep_steps
        self._run: dict[Key, dict[str, _Acc]] = {}
        self._steps: dict[int, dict[Key, dict[str, _Acc]]] = {}

    def add(
        self, slot: int, gen: int, dev: int, name: str, value: float, step: int | None = None
    ) -> bool:
        """Fold ``value`` of column ``name`` into the row (``slot``, clock ``dev``: a device
        index, -1 the host) of the generation ``gen``; False when a reset() came since.
        ``step``: the step the call ended in, for a value known after the call (memory, read
        from the allocator's history later); None: the current step."""
        return self.add_each([(slot, gen, dev, step, ((name, value),))]) == 1

    def add_each(self, calls: Iterable[Call]) -> int:
        """``add`` for many calls under one lock (a source that learns values in batches):
        each call is (slot, gen, dev, step, ((name, value), ...)); returns how many were kept
        (the others came before a reset())."""
        return self.add_counted([(*call, 1) for call in calls])

    def add_counted(self, calls: Iterable[Counted]) -> int:
        """``add_each`` for calls that carry the same values ``n`` times each (a count reused
        for every call of one signature): (slot, gen, dev, step, ((name, value), ...), n);
        returns how many calls were kept."""
        checked = [
            ((slot, dev), gen, step, [(name, _number(name, value)) for name, value in values], n)
            for slot, gen, dev, step, values, n in calls
        ]
        store = self._store
        kept_calls = 0
        with self._lock:
            current = store.step
            for key, gen, step, values, n in checked:
                if gen != store.gen:
                    continue
                kept_calls += n
                # keep_steps=0: no step is kept, and no window can be reported; a step older
                # than the kept ones has no table either.
                at = current if step is None else step
                if self._keep and at >= current - self._keep:
                    tables: tuple[dict[Key, dict[str, _Acc]], ...] = (self._run, self._step(at))
                else:
                    tables = (self._run,)
                for table in tables:
                    by = table.setdefault(key, {})
                    for name, number in values:
                        acc = by.get(name)
                        if acc is None:
                            by[name] = _Acc(number, n)
                        else:
                            acc.add(number, n)
        return kept_calls

    def add_open(self, name: str, value: float) -> bool:
        """``add`` to the innermost region open on this thread (its clock decided at enter);
        False when none is, or it records no sample (off, NVTX only, inside a graph)."""
        top = self._store.stack().top()
        if top is None:
            return False
        kind = top.kind
        if kind == _TIMED:
            dev = top.rec.device
        elif kind in (_HOST, _SKIP):
            dev = -1
        elif kind == _UNTIMED:
            dev = top.dev
        else:
            return False
        return self.add(top.slot, top.gen, dev, name, value)

    def _step(self, step: int) -> dict[Key, dict[str, _Acc]]:
        table = self._steps.get(step)
        if table is None:
            table = self._steps[step] = {}
            # The store keeps the last keep_steps steps' samples; values keep as many.
            newest = max(step, self._store.step)
            for old in [s for s in self._steps if s < newest - self._keep]:
                del self._steps[old]
        return table

    def read(self) -> tuple[dict[Key, Values], dict[int, dict[Key, Values]]]:
        """The whole run's values per row, and each kept step's."""
        with claim(self._lock, "the Timer's per-call values (a report)"):
            return _frozen(self._run), {s: _frozen(t) for s, t in self._steps.items()}

    def steps_of(self, steps: Iterable[int]) -> dict[int, dict[Key, Values]]:
        """The values of the kept steps among ``steps`` (none: an empty dict, one test)."""
        if not self._steps:
            return {}
        with self._lock:
            return {s: _frozen(self._steps[s]) for s in steps if s in self._steps}

    def reset(self) -> None:
        self._run = {}
        self._steps = {}
