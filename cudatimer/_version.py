"""The package's version, in a module of its own: the CLI and the HTML report read it without
importing the package face (which builds the default Timer)."""

__all__ = ["__version__"]

__version__ = "0.1.0"
