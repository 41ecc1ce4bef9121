"""Renderers: frozen records in, text or bytes out (tables, JSON/CSV/DataFrame, Chrome traces,
PNG, HTML), written by the one writer (``_write``). Only ``_report`` imports tabulate.
"""

__all__: list[str] = []
