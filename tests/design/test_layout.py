"""The package's shape: layer folders whose imports go one way, no import circle (the package face
counted), the recorder contract as one typed stub, and no module reaching into another's private
names."""

from __future__ import annotations

import ast
from pathlib import Path

import cudatimer

#: The package as imported: the checkout's, or an installed wheel's (CI runs the suite on both).
PACKAGE = Path(cudatimer.__file__).resolve().parent

#: What each layer folder may import besides itself and the leaf modules (``_config``,
#: ``_version``). The top level (the face, the CLI, the public modules) may import any folder.
ALLOWED = {
    "records": set(),
    "core": {"records"},
    "sources": {"core", "records"},
    "recorder": {"sources", "core", "records"},
    "render": {"records"},
    "regions": {"recorder", "sources", "core", "records", "render"},
    "features": {"regions", "recorder", "sources", "core", "records", "render"},
}
LEAVES = {"_config", "_version"}


def _name(path: Path) -> str:
    """``core/_core.py`` -> ``core._core``; ``core/__init__.py`` -> ``core``; ``__init__.py``
    -> ``__init__`` (the face)."""
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if p.name != "__main__.py"}


def _package_of(name: str, path: Path) -> list[str]:
    """The dotted package that holds module ``name`` (``[]`` for the top level)."""
    parts = [] if name == "__init__" else name.split(".")
    return parts if path.name == "__init__.py" else parts[:-1]


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The cudatimer modules that ``path`` imports anywhere in its code (top-level, lazy and
    type-only alike); ``__init__`` is the face."""
    found: set[str] = set()
    here = _package_of(name, path)
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level >= 1:
            base = here[: len(here) - (node.level - 1)]
            target = [*base, *(node.module.split(".") if node.module else [])]
            dotted = ".".join(target)
            module = dotted if dotted else "__init__"
            hit = False
            for alias in node.names:
                sub = f"{dotted}.{alias.name}" if dotted else alias.name
                if sub in known:
                    found.add(sub)
                    hit = True
            if not hit or node.module:
                found.add(module if module in known else "__init__")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("cudatimer"):
                    rest = alias.name.removeprefix("cudatimer").lstrip(".")
                    found.add(rest or "__init__")
    return found - {name}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: _imports(name, path, known) for name, path in modules.items()}


def _folder(name: str) -> str | None:
    return name.split(".")[0] if "." in name or name in ALLOWED else None


def test_the_layer_folders_are_packages_that_ls_shows() -> None:
    """Each layer is a folder with an ``__init__`` and private modules inside."""
    for folder in ALLOWED:
        assert (PACKAGE / folder / "__init__.py").is_file(), folder
        inside = [p.name for p in (PACKAGE / folder).glob("*.py") if p.name != "__init__.py"]
        assert inside and all(n.startswith("_") for n in inside), (folder, inside)
    loose = {p.stem for p in PACKAGE.glob("*.py")}
    public = {"__init__", "__main__", "distributed", "hf", "lightning", "sinks"}
    assert loose - public <= {"_cli", *LEAVES}, loose - public


def test_imports_form_no_circle_counting_the_face() -> None:
    """No module imports, directly or through others, a module that imports it, the package
    face ``__init__`` included (nothing below the face climbs back to it)."""
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
    assert {m for m, deps in graph.items() if "__init__" in deps} == set()


def test_each_folder_imports_only_the_layers_below_it() -> None:
    """records <- core <- sources <- recorder <- regions <- features; renderers read records
    only."""
    broken = []
    for module, deps in _graph().items():
        folder = _folder(module)
        if folder is None:
            continue
        for dep in deps:
            other = _folder(dep)
            if dep in LEAVES or other == folder:
                continue
            if other is None or other not in ALLOWED[folder]:
                broken.append(f"{module} -> {dep}")
    assert broken == []


def test_no_module_imports_another_modules_private_names() -> None:
    """``from .x import _name`` across modules is refused: a shared name is public in its module
    (private modules themselves, ``from . import _x``, are fine)."""
    found = []
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level >= 1 and node.module:
                last = node.module.split(".")[-1]
                for alias in node.names:
                    private = alias.name.startswith("_") and not alias.name.startswith("__")
                    if private and last.startswith("_"):  # a name out of a module
                        found.append(f"{name}: {node.module}.{alias.name}")
    assert found == []


def test_only_the_chooser_imports_an_implementation_of_the_contract() -> None:
    """``core._core`` is the one module that picks ``_speedups`` or ``_core_py``; every other
    module goes through it, and the stub ``_core.pyi`` types what they use."""
    graph = _graph()
    users = {m for m, deps in graph.items() if deps & {"core._speedups", "core._core_py"}}
    assert users == set()
    source = (PACKAGE / "core" / "_core.py").read_text()
    assert '"cudatimer.core._speedups"' in source and '"cudatimer.core._core_py"' in source
    assert (PACKAGE / "core" / "_core.pyi").exists()
    assert (PACKAGE / "core" / "_speedups.pyi").exists()


def test_recorder_layers_in_order() -> None:
    """Contract, then store readers, then records, then renderers: the records know nothing of
    the recorder, and only the report module imports tabulate."""
    graph = _graph()
    for module, deps in graph.items():
        if _folder(module) in ("records", "render"):
            assert not {d for d in deps if _folder(d) in ("core", "recorder", "regions")}, module
    tabulate_users = {
        _name(p)
        for p in PACKAGE.rglob("*.py")
        if "import tabulate" in p.read_text() or "from tabulate" in p.read_text()
    }
    assert tabulate_users == {"render._report"}


def test_timer_stays_thin() -> None:
    """``Timer`` holds options, regions and switches; its outputs live in ``regions._output``
    (each method a one-line call), so the class stays within 400 lines."""
    tree = ast.parse((PACKAGE / "regions" / "_timer.py").read_text())
    timer = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Timer")
    assert timer.end_lineno is not None and timer.end_lineno - timer.lineno + 1 <= 400
    verbs = ("report", "save", "step_series", "export_trace", "to_csv", "to_dataframe", "plot")
    for node in timer.body:
        if isinstance(node, ast.FunctionDef) and node.name in (*verbs, "html", "summary"):
            body = node.body[1:] if ast.get_docstring(node) else node.body
            assert len(body) == 1, node.name  # one call into _output
