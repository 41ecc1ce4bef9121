"""Host-device synchronisations counted against the region open when they happened: the
recorder's side of ``detect_syncs()`` (``features/_syncs.py`` finds them, this counts them).
"""

from __future__ import annotations

from ..core._locks import claim
from ..records._records import SyncSite
from ._source import Host

__all__ = ["SyncCounts"]


class SyncCounts:
    """This source's state for one recorder (``Recorder.syncs``): per slot, and per
    (location, kind, slot), the synchronisations seen inside its regions (``Source``)."""

    __slots__ = ("host", "per_slot", "sites")

    def __init__(self, host: Host) -> None:
        self.host = host
        self.per_slot: dict[int, int] = {}
        self.sites: dict[tuple[str, str, int], int] = {}

    def open_here(self) -> int:
        """Regions of this recorder open on the calling thread."""
        return len(self.host.store.stack())

    def note(self, kind: str, location: str) -> bool:
        """Count one synchronisation against the innermost region open on this thread; False
        (nothing counted) when none of this recorder is open here. Under the recorder's lock,
        which ``reset()`` holds too: a count is never kept for a region opened before it."""
        store = self.host.store
        top = store.stack().top()
        if top is None:
            return False
        with self.host.lock:
            if top.gen != store.gen:
                return False
            self.per_slot[top.slot] = self.per_slot.get(top.slot, 0) + 1
            key = (location, kind, top.slot)
            self.sites[key] = self.sites.get(key, 0) + 1
        return True

    def read(self) -> tuple[dict[int, int], tuple[SyncSite, ...]]:
        """The counts per slot, and the sites as records, most frequent first."""
        tree = self.host.tree
        with claim(self.host.lock, "the Timer's sync counts (a report)"):
            per_slot = dict(self.per_slot)
            sites = dict(self.sites)
        return per_slot, tuple(
            SyncSite(location=loc, kind=kind, region=tree.path(slot), count=n)
            for (loc, kind, slot), n in sorted(
                sites.items(), key=lambda it: (-it[1], it[0][0], it[0][1], tree.path(it[0][2]))
            )
        )

    # -- Source ---------------------------------------------------------------------------
    def drain(self, timeout_s: float) -> None:
        """Nothing to fold: counts are read as they are."""

    def pending(self) -> int:
        return 0

    def notes(self) -> tuple[tuple[str, str], ...]:
        return ()

    def reset(self) -> None:
        self.per_slot = {}
        self.sites = {}
