"""The C implementation of the recorder core: the contract in ``_core.pyi`` (the reference is
``_core_py``), with ``load()``/``runtime_path()``/``current_stream()`` besides."""

from ._core import *  # noqa: F403
