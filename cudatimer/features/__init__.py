"""Features on top of a Timer: ``instrument()``, sync detection, ``timed_replay``,
``nsight_capture``, the report at exit and ``StepFeed``.
"""

__all__: list[str] = []
