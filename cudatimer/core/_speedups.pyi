"""The C implementation of the recorder core: the contract in ``_core.pyi`` (the reference is
``_core_py``), and three functions of its own, declared here and nowhere else: the binding to
the CUDA runtime torch loaded (``load``, ``runtime_path``) and c10's current stream as the hot
path reads it (``current_stream``). Code outside the core reaches them only through
``getattr(_core, name, None)``, since the Python core has none of them."""

from ._core import *  # noqa: F403

def load() -> bool:
    """Bind to the CUDA runtime library already loaded in this process (torch's): True when
    events can be recorded through it. Never loads a library, never initialises CUDA; called
    once at import."""

def runtime_path() -> str | None:
    """The path of the CUDA runtime library ``load`` bound, or None."""

def current_stream() -> tuple[int, int, int] | None:
    """(stream id, device, device type) of the current stream as c10 reports it to the hot
    path; None when that symbol is not bound."""
