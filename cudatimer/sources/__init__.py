"""Boundary sources other than a region's own enter and exit: marks traced into compiled code
(``_compile``), backward rows (``_backward``), CUDA graph captures (``_capture``) and sync
counts (``_sync_counts``), each with a per-recorder object behind one protocol, and the one
registry of Timers (``_source``).
"""

__all__: list[str] = []
