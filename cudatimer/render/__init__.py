"""Renderers: frozen records in, ``str`` or a written file out (tables, JSON/CSV/DataFrame,
Chrome traces, PNG, HTML). Only ``_report`` imports tabulate.
"""

__all__: list[str] = []
