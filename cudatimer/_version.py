"""The package's version, in a module of its own: the CLI and the HTML report read it without
importing anything that needs torch."""

__all__ = ["__version__"]

__version__ = "0.1.0"
