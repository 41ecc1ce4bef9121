"""Frozen records: what a report reads (``Summary``, ``RegionStats``, ...), the mergeable
histogram, and cross-rank records. They import nothing of the recorder.
"""

__all__: list[str] = []
