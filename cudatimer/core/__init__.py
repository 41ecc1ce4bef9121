"""The recorder's contract (``_core.pyi``), the chooser that picks its implementation once at
import (``_core``), the C core (``_speedups``) and its pure-Python reference (``_core_py``),
the device seam (``_device``), locks and the device timestamp kernel (``_stamps``).
"""

__all__: list[str] = []
