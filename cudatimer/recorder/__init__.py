"""The recorder's general path (``Recorder``), the region tree and its snapshot views
(``_view``), step windows and trace samples (``_steps``).
"""

__all__: list[str] = []
