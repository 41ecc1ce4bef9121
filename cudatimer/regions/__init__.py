"""What user code calls: ``Timer`` and its ``Region``s, the decorator (``_wrap``), NVTX, and
the one output path every report and export of a Timer goes through (``_output``)."""

__all__: list[str] = []
