"""Boundary sources other than a region's own enter and exit: marks traced into compiled code
(``_compile``), backward rows (``_backward``) and CUDA graph captures (``_capture``).
"""

__all__: list[str] = []
