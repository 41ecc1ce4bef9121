"""What user code calls: ``Timer`` and its ``Region``s, the decorator (``_wrap``) and NVTX."""

__all__: list[str] = []
