"""The optional packages of the ``integrations`` extra that some tests need: without them
those tests skip, saying which package is missing and how to install it."""

from __future__ import annotations

from typing import Any

import pytest

#: How to get every package a test of the integrations needs.
INSTALL = "pip install -e '.[test,integrations]'"


def needs(module: str) -> Any:
    """``module`` imported, or the test (or the module, at import) skipped with the reason."""
    package = module.split(".")[0]
    return pytest.importorskip(
        module, reason=f"needs {package} (the integrations extra): {INSTALL}"
    )
