"""The package's shape: the recorder contract is one typed stub, and the modules' imports
(top-level, lazy and type-only alike) form no circle."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "cudatimer"


def _imports(path: Path) -> set[str]:
    """The cudatimer modules that ``path`` imports anywhere in its code (the package facade
    ``__init__``, which lazy accessors import, excepted)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                found.add(node.module.split(".")[0])
            else:
                found.update(
                    alias.name for alias in node.names if (PACKAGE / f"{alias.name}.py").exists()
                )
    return found - {"__init__"}


def _graph() -> dict[str, set[str]]:
    return {
        p.stem: _imports(p)
        for p in sorted(PACKAGE.glob("*.py"))
        if p.stem not in ("__init__", "__main__")
    }


def test_imports_form_no_circle() -> None:
    """No module imports, directly or through others, a module that imports it."""
    graph = _graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    circles: list[list[str]] = []

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for dep in sorted(graph.get(module, ())):
            if state.get(dep) == 1:
                circles.append([*path[path.index(dep) :], dep] if dep in path else [module, dep])
            elif dep not in state:
                visit(dep, [*path, dep])
        state[module] = 2

    for module in graph:
        if module not in state:
            visit(module, [module])
    assert circles == []


def test_only_the_chooser_imports_an_implementation_of_the_contract() -> None:
    """``_core`` is the one module that picks ``_speedups`` or ``_core_py``; every other module
    goes through ``_core``, and the stub ``_core.pyi`` types what they use."""
    graph = _graph()
    users = {m for m, deps in graph.items() if deps & {"_speedups", "_core_py"}}
    assert users == set()
    source = (PACKAGE / "_core.py").read_text()
    assert '"cudatimer._speedups"' in source and '"cudatimer._core_py"' in source
    assert (PACKAGE / "_core.pyi").exists() and (PACKAGE / "_speedups.pyi").exists()


def test_recorder_layers_in_order() -> None:
    """Contract, then store readers, then records, then renderers: the records know nothing of
    the recorder, and only the report module imports tabulate."""
    graph = _graph()
    for records in ("_records", "_hist"):
        assert not graph[records] & {"_core", "_device", "_recorder", "_timer", "_view"}
    for renderer in ("_report", "_export", "_plot", "_html"):
        assert not graph[renderer] & {"_core", "_device", "_recorder", "_timer"}, renderer
    tabulate_users = {
        p.stem
        for p in PACKAGE.glob("*.py")
        if "import tabulate" in p.read_text() or "from tabulate" in p.read_text()
    }
    assert tabulate_users == {"_report"}
