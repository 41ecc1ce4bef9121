"""Both recorder cores hold to ``cudatimer/core/_core.pyi``, name by name and signature by
signature.

The stub is parsed with ``ast``; each core (the C ``_speedups``, whose functions carry
``__text_signature__``, and the Python ``_core_py``) is read with ``inspect``. Checked:

- every function, constant and class of the stub exists in the core; functions and methods
  have the stub's parameters: names, kinds (positional-only, keyword-only, ``*args``...),
  whether each has a default, and the default's value where the stub writes one; a class
  without ``__init__`` in the stub is built with no argument;
- the core has no public name the stub lacks: module names (imports aside) and class
  members (those inherited from a builtin base such as ``list`` or ``tuple`` aside); the C
  core's extras are the functions ``_speedups.pyi`` declares, checked the same way;
- a plain attribute of the stub is writable, a property may be read-only; a record (a
  ``NamedTuple`` of the stub) has the stub's fields in the stub's order. The C core's
  records are struct sequences: built by the core only, so their constructors and the
  ``NamedTuple`` helpers (``_replace``, ``_asdict``) are no part of the contract;
- the C text signatures say what the C code parses: METH_O and METH_NOARGS flags, and the
  ``kw[]`` names, ``|`` (optional) and ``$`` (keyword-only) of each
  ``PyArg_ParseTupleAndKeywords``, read from the C source.

Edits of the stub, of each core and of the C source show that every rule reports its drift.
Both cores pass in ~0.04 s, the C source in ~0.03 s; ``python3 -m mypy.stubtest`` took ~45 s
a core here and reads no signature from C without ``__text_signature__``.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from cudatimer.core import _core, _core_py, _device
from cudatimer.records._hist import INV_LOG_GAMMA

ROOT = Path(__file__).resolve().parents[2]
STUB = ROOT / "cudatimer" / "core" / "_core.pyi"
C_STUB = ROOT / "cudatimer" / "core" / "_speedups.pyi"

#: What CPython gives every struct sequence (the C core's records) besides its fields.
STRUCTSEQ_NAMES = frozenset({"n_fields", "n_sequence_fields", "n_unnamed_fields"})


def _c_core() -> ModuleType | None:
    try:
        return importlib.import_module("cudatimer.core._speedups")
    except ImportError:
        return None


C_CORE = _c_core()
CORES = [pytest.param(_core_py, id="python")] + (
    [pytest.param(C_CORE, id="c")] if C_CORE is not None else []
)
needs_c = pytest.mark.skipif(C_CORE is None, reason="the C core was not built here")

# -- the stub, read with ast ---------------------------------------------------------------------
_NO_VALUE = object()  # a default written ``...`` in the stub: only its presence is checked
_MISSING = object()


@dataclass(frozen=True)
class Param:
    name: str
    kind: Any  # an inspect.Parameter kind
    has_default: bool
    default: Any = field(default=_NO_VALUE, compare=False)

    def __str__(self) -> str:
        star = {inspect.Parameter.VAR_POSITIONAL: "*", inspect.Parameter.VAR_KEYWORD: "**"}
        default = (
            ""
            if not self.has_default
            else "=" + ("..." if self.default is _NO_VALUE else repr(self.default))
        )
        return f"{star.get(self.kind, '')}{self.name}{default}"


def _show(params: list[Param]) -> str:
    """``params`` as a signature with ``/`` and ``*`` where the kinds change."""
    out: list[str] = []
    for i, p in enumerate(params):
        before = params[i - 1].kind if i else None
        if before is inspect.Parameter.POSITIONAL_ONLY and p.kind is not before:
            out.append("/")
        if p.kind is inspect.Parameter.KEYWORD_ONLY and before not in (
            inspect.Parameter.KEYWORD_ONLY,
            inspect.Parameter.VAR_POSITIONAL,
        ):
            out.append("*")
        out.append(str(p))
    if params and params[-1].kind is inspect.Parameter.POSITIONAL_ONLY:
        out.append("/")
    return "(" + ", ".join(out) + ")"


def _default(node: ast.expr) -> Any:
    if isinstance(node, ast.Constant) and node.value is Ellipsis:
        return _NO_VALUE
    return ast.literal_eval(node)


def _stub_params(fn: ast.FunctionDef, method: bool) -> list[Param]:
    a = fn.args
    P = inspect.Parameter
    positional = [(arg, P.POSITIONAL_ONLY) for arg in a.posonlyargs]
    positional += [(arg, P.POSITIONAL_OR_KEYWORD) for arg in a.args]
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(a.defaults))
    defaults += list(a.defaults)
    params = [
        Param(arg.arg, kind, d is not None, _NO_VALUE if d is None else _default(d))
        for (arg, kind), d in zip(positional, defaults, strict=True)
    ]
    if a.vararg is not None:
        params.append(Param(a.vararg.arg, P.VAR_POSITIONAL, False))
    for arg, d in zip(a.kwonlyargs, a.kw_defaults, strict=True):
        params.append(
            Param(arg.arg, P.KEYWORD_ONLY, d is not None, _NO_VALUE if d is None else _default(d))
        )
    if a.kwarg is not None:
        params.append(Param(a.kwarg.arg, P.VAR_KEYWORD, False))
    return params[1:] if method else params


@dataclass
class StubClass:
    methods: dict[str, ast.FunctionDef] = field(default_factory=dict)
    properties: set[str] = field(default_factory=set)
    attributes: set[str] = field(default_factory=set)  # writable
    fields: list[str] | None = None  # a NamedTuple's, in order

    def members(self) -> set[str]:
        return set(self.methods) | self.properties | self.attributes | set(self.fields or ())


@dataclass
class Stub:
    functions: dict[str, ast.FunctionDef] = field(default_factory=dict)
    constants: dict[str, str] = field(default_factory=dict)  # name -> annotation
    classes: dict[str, StubClass] = field(default_factory=dict)

    def names(self) -> set[str]:
        return set(self.functions) | set(self.constants) | set(self.classes)


def parse_stub(source: str) -> Stub:
    """The module-level functions, constants and classes a stub declares."""
    stub = Stub()
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef):
            stub.functions[node.name] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            stub.constants[node.target.id] = ast.unparse(node.annotation)
        elif isinstance(node, ast.ClassDef):
            stub.classes[node.name] = _parse_class(node)
    return stub


def _parse_class(node: ast.ClassDef) -> StubClass:
    cls = StubClass()
    record = any(ast.unparse(b) == "NamedTuple" for b in node.bases)
    if record:
        cls.fields = []
    for item in node.body:
        if isinstance(item, ast.FunctionDef):
            decorators = {ast.unparse(d) for d in item.decorator_list}
            if "property" in decorators:
                cls.properties.add(item.name)
            elif f"{item.name}.setter" in decorators:
                cls.properties.discard(item.name)
                cls.attributes.add(item.name)
            else:
                cls.methods[item.name] = item
        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            if cls.fields is not None:
                cls.fields.append(item.target.id)
            else:
                cls.attributes.add(item.target.id)
    return cls


# -- a core, read with inspect -------------------------------------------------------------------
def _runtime_params(obj: Any, method: bool) -> list[Param] | str:
    """``obj``'s parameters (``self`` dropped for a method), or why they cannot be read."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError) as e:
        return f"no signature ({e}): give it a __text_signature__"
    params = [
        Param(
            p.name,
            p.kind,
            p.default is not inspect.Parameter.empty,
            p.default if p.default is not inspect.Parameter.empty else _NO_VALUE,
        )
        for p in sig.parameters.values()
    ]
    return params[1:] if method else params


def _compare(where: str, stub: list[Param], runtime: list[Param] | str) -> list[str]:
    if isinstance(runtime, str):
        return [f"{where}: {runtime}"]
    if stub != runtime:
        return [f"{where}: stub {_show(stub)}, core {_show(runtime)}"]
    for s, r in zip(stub, runtime, strict=True):
        if s.default is not _NO_VALUE and (type(s.default), s.default) != (
            type(r.default),
            r.default,
        ):
            return [f"{where}: default of {s.name}: stub {s.default!r}, core {r.default!r}"]
    return []


def _imported(module: ModuleType) -> set[str]:
    """Names a Python module binds by import (C modules import nothing into their dict)."""
    path = getattr(module, "__file__", None) or ""
    if not path.endswith(".py"):
        return set()
    names: set[str] = set()
    for node in ast.parse(Path(path).read_text()).body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def public_names(module: ModuleType) -> set[str]:
    """The public names ``module`` defines itself (imports and submodules aside)."""
    imported = _imported(module)
    return {
        name
        for name, value in vars(module).items()
        if not name.startswith("_") and name not in imported and not isinstance(value, ModuleType)
    }


def _own_members(cls: type, instance: Any) -> set[str]:
    """Public names of ``cls`` and its bases up to the first builtin one, and of an instance."""
    names: set[str] = set()
    for klass in cls.__mro__:
        if klass.__module__ == "builtins":
            break
        names.update(vars(klass))
    names.update(getattr(instance, "__dict__", {}))
    return {n for n in names if not n.startswith("_")}


def _check_class(where: str, stub: StubClass, cls: Any, instance: Any) -> list[str]:
    if not isinstance(cls, type):
        return [f"{where}: not a class in the core ({type(cls).__name__})"]
    out: list[str] = []
    if stub.fields is not None:  # a record
        fields = getattr(cls, "__match_args__", None)
        if tuple(stub.fields) != fields:
            out.append(f"{where}: fields: stub {tuple(stub.fields)}, core {fields}")
        elif not isinstance(instance, cls) or len(instance) != len(stub.fields):
            out.append(f"{where}: an instance is not a tuple of {len(stub.fields)} fields")
        else:
            out += [
                f"{where}.{f}: not field {i}"
                for i, f in enumerate(stub.fields)
                if getattr(instance, f) is not instance[i]
            ]
    else:
        init = stub.methods.get("__init__")
        out += _compare(
            f"{where}()",
            _stub_params(init, method=True) if init is not None else [],
            _runtime_params(cls, method=False),
        )
    if instance is not None and not isinstance(instance, cls):
        out.append(f"{where}: the instance checked is a {type(instance).__name__}")
        return out
    for name, fn in sorted(stub.methods.items()):
        if name == "__init__":
            continue
        value = inspect.getattr_static(cls, name, _MISSING)
        if value is _MISSING:
            out.append(f"{where}.{name}: missing in the core")
        elif not inspect.isroutine(value) and not isinstance(value, (staticmethod, classmethod)):
            out.append(
                f"{where}.{name}: a method in the stub, a {type(value).__name__} in the core"
            )
        else:
            out += _compare(
                f"{where}.{name}",
                _stub_params(fn, method=True),
                _runtime_params(getattr(cls, name), True),
            )
    for name in sorted(stub.properties | stub.attributes | set(stub.fields or ())):
        value = inspect.getattr_static(cls, name, _MISSING)
        if value is _MISSING and name not in getattr(instance, "__dict__", {}):
            out.append(f"{where}.{name}: missing in the core")
        elif inspect.isroutine(value):
            out.append(f"{where}.{name}: an attribute in the stub, a method in the core")
    for name in sorted(stub.attributes):
        if instance is not None and hasattr(instance, name):
            try:
                setattr(instance, name, getattr(instance, name))
            except AttributeError:
                out.append(f"{where}.{name}: writable in the stub, read-only in the core")
    extra = _own_members(cls, instance) - stub.members()
    if stub.fields is not None:
        extra -= STRUCTSEQ_NAMES
    out += [f"{where}.{name}: in the core, not in the stub" for name in sorted(extra)]
    return out


def _check_functions(
    where: str, functions: dict[str, ast.FunctionDef], module: ModuleType
) -> list[str]:
    out: list[str] = []
    for name, fn in sorted(functions.items()):
        value = getattr(module, name, _MISSING)
        if value is _MISSING or value is None:  # None: how a test removes a function
            out.append(f"{where}.{name}: missing in the core")
        elif not callable(value) or isinstance(value, type):
            out.append(f"{where}.{name}: not a function in the core")
        else:
            out += _compare(
                f"{where}.{name}", _stub_params(fn, method=False), _runtime_params(value, False)
            )
    return out


_FINAL = re.compile(r"Final\[(\w+)\]")


def drift(
    stub: Stub, module: ModuleType, instances: dict[str, Any], extras: Stub | None = None
) -> list[str]:
    """How ``module`` departs from ``stub`` (with ``extras``: its own documented names)."""
    where = module.__name__.rsplit(".", 1)[-1]
    out = _check_functions(where, stub.functions, module)
    if extras is not None:
        out += _check_functions(where, extras.functions, module)
    for name, annotation in sorted(stub.constants.items()):
        if not hasattr(module, name):
            out.append(f"{where}.{name}: missing in the core")
            continue
        m = _FINAL.fullmatch(annotation)
        value = getattr(module, name)
        if m is not None and type(value).__name__ != m[1]:
            out.append(f"{where}.{name}: a {type(value).__name__}, the stub says {m[1]}")
    for name, cls in sorted(stub.classes.items()):
        if not hasattr(module, name):
            out.append(f"{where}.{name}: missing in the core")
        else:
            out += _check_class(f"{where}.{name}", cls, getattr(module, name), instances.get(name))
    allowed = stub.names() | (extras.names() if extras is not None else set())
    out += [
        f"{where}.{name}: in the core, not in the stub"
        for name in sorted(public_names(module) - allowed)
    ]
    return out


# -- one instance of each class, for attributes set per instance and writability -----------------
class _Stream:
    stream_id = 0
    device_index = 0


class _Event:
    def record(self, stream: Any = None) -> None:
        return None

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: Any) -> float:
        return 0.0


def instances(core: ModuleType) -> dict[str, Any]:
    """An object of every class of the contract, made by ``core``."""
    core.configure(
        inv_log_gamma=INV_LOG_GAMMA,
        harvest_batch=_device.HARVEST_BATCH,
        anchor_hop_ms=_device.ANCHOR_HOP_MS,
        prewarm=_device.PREWARM_EVENTS,
    )
    store = core.Store(1, 1, 1, lambda parent, name: 0)
    store.record(0, store.gen, -1, math.nan, 1.0, 0, 5, 0, math.nan, 0, False)
    snap = store.snapshot(series=True, trace=True)
    return {
        "Store": store,
        "Stack": store.stack(),
        "Frame": core.Frame(None, 0, 0, core.HOST),
        "StreamRec": core.StreamRec((0, 0, 1), _Stream(), None, _Event),
        "RegionBase": core.RegionBase(),
        "NullRegion": core.NullRegion(),
        "Snapshot": snap,
        "SlotStats": snap.stats[0],
        "HistState": snap.stats[0].cpu,
        "SeriesRow": snap.series[0],
        "TraceItem": snap.trace[0],
    }


def _extras(core: ModuleType) -> Stub | None:
    return parse_stub(C_STUB.read_text()) if core is C_CORE else None


# -- the C core's text signatures against its argument parsers ------------------------------------
# A C function's __text_signature__ is written by hand beside the code that parses its
# arguments: its flags (METH_O, METH_NOARGS, METH_FASTCALL, METH_VARARGS | METH_KEYWORDS) and,
# for keywords, the kw[] list and format string of PyArg_ParseTupleAndKeywords. Both are read
# from the source here, so a signature cannot name what the parser does not take.
_METHOD_TABLE = re.compile(r"static PyMethodDef (\w+)\[\] = \{(.*?)\n\};", re.S)
_ENTRY = re.compile(
    r'\{"(\w+)",\s*(?:\(PyCFunction\))?(?:\(void \(\*\)\(void\)\))?(\w+),\s*(METH_[A-Z_ |]+),'
)
_TYPE = re.compile(r"static PyTypeObject \w+ = \{(.*?)\n\};", re.S)
_KW = re.compile(r"static char \*kw\[\] = \{(.*?)NULL\};", re.S)
_FORMAT = re.compile(r'PyArg_ParseTupleAndKeywords\(\s*args,\s*kwds,\s*"([^"]*)"')


def c_sources() -> str:
    parts = [ROOT / "cudatimer" / "core" / "_speedups.c"]
    return "\n".join(p.read_text() for p in parts + sorted(parts[0].parent.glob("_c/*.c")))


def _body(source: str, function: str) -> str:
    m = re.search(rf"^{function}\(.*?\)\n\{{\n(.*?)\n\}}", source, re.S | re.M)
    return m[1] if m else ""


def _parser_drift(where: str, params: list[Param] | str, flags: str, body: str) -> list[str]:
    P = inspect.Parameter
    if isinstance(params, str):
        return [f"{where}: {params}"]
    kinds = [p.kind for p in params]
    if "METH_NOARGS" in flags and params:
        return [f"{where}: METH_NOARGS, signature {_show(params)}"]
    if "METH_O" in flags.split(" | ") and kinds != [P.POSITIONAL_ONLY]:
        return [f"{where}: METH_O takes one positional argument, signature {_show(params)}"]
    fastcall = "METH_FASTCALL" in flags and "METH_KEYWORDS" not in flags
    if fastcall and any(k not in (P.POSITIONAL_ONLY, P.VAR_POSITIONAL) for k in kinds):
        return [f"{where}: METH_FASTCALL takes no keywords, signature {_show(params)}"]
    if "METH_KEYWORDS" not in flags:
        return []
    kw, fmt = _KW.search(body), _FORMAT.search(body)
    if kw is None or fmt is None:
        return [f"{where}: no kw[] list and PyArg_ParseTupleAndKeywords call found"]
    names = re.findall(r'"(\w*)"', kw[1])
    if [p.name for p in params] != names:
        return [f"{where}: kw[] {names}, signature {_show(params)}"]
    units = re.findall(r"[|$]|[a-zA-Z](?:[*#!&]|)", fmt[1].split(":")[0])
    optional = keyword_only = len(names)
    index = 0
    for unit in units:
        if unit == "|":
            optional = index
        elif unit == "$":
            keyword_only = index
        else:
            index += 1
    out = []
    for i, p in enumerate(params):
        if (p.kind is P.KEYWORD_ONLY) != (i >= keyword_only):
            out.append(f"{where}: {p.name} keyword-only in one of signature and parser only")
        if p.has_default and i < optional:
            out.append(f"{where}: {p.name} has a default in the signature, required in the parser")
    return out


def c_parser_drift(source: str, module: ModuleType) -> list[str]:
    """Where the C core's text signatures and argument parsers (in ``source``) disagree."""
    owners: dict[str, Any] = {}
    out: list[str] = []
    for block in _TYPE.findall(source):
        name = re.search(r'tp_name = "[\w.]+\.(\w+)"', block)
        if name is None:
            continue
        cls = getattr(module, name[1])
        table = re.search(r"\.tp_methods = (\w+)", block)
        if table is not None:
            owners[table[1]] = cls
        init = re.search(r"\.tp_init = \(initproc\)(\w+)", block)
        if init is not None:
            flags = "METH_VARARGS | METH_KEYWORDS"
            out += _parser_drift(
                name[1], _runtime_params(cls, False), flags, _body(source, init[1])
            )
    tables = _METHOD_TABLE.findall(source)
    assert len(tables) >= 6 and sum(t not in owners for t, _ in tables) == 1  # one is the module's
    for table, entries in tables:
        owner = owners.get(table, module)
        found = _ENTRY.findall(entries)
        assert len(found) == entries.count('{"'), f"an entry of {table} not read"
        for name, function, flags in found:
            where = f"{getattr(owner, '__name__', '?')}.{name}"
            params = _runtime_params(getattr(owner, name), method=owner is not module)
            out += _parser_drift(where, params, flags.strip(), _body(source, function))
    return out


# -- the checks ----------------------------------------------------------------------------------
@pytest.mark.parametrize("core", CORES)
def test_core_matches_the_stub(core: ModuleType) -> None:
    """Every name and signature of ``_core.pyi`` is the core's, and the core has no other."""
    found = drift(parse_stub(STUB.read_text()), core, instances(core), _extras(core))
    assert found == [], "\n".join(found)


def test_python_core_has_none_of_the_c_extras() -> None:
    """The functions only ``_speedups.pyi`` declares are the C core's alone."""
    extras = parse_stub(C_STUB.read_text())
    assert extras.functions and extras.names() == set(extras.functions)
    assert not extras.names() & parse_stub(STUB.read_text()).names()
    assert [name for name in sorted(extras.names()) if hasattr(_core_py, name)] == []


def test_chooser_exposes_the_chosen_core() -> None:
    """``_core`` carries every name of the stub, each the chosen core's own object."""
    chosen = C_CORE if _core.IMPL == "c" else _core_py
    names = parse_stub(STUB.read_text()).names()
    assert [n for n in sorted(names) if getattr(_core, n, None) is not getattr(chosen, n)] == []


# Each edit of the stub, and what the check must then say about either core.
STUB_EDITS = [
    ("def drain(timeout_s: float, /)", "def drain(timeout: float, /)", "drain: stub (timeout, /)"),
    ("def drain(timeout_s: float, /)", "def drain(timeout_s: float)", "drain: stub (timeout_s)"),
    ("def pending_total() -> int: ...\n", "", "pending_total: in the core, not in the stub"),
    ("def now_ns()", "def bogus() -> None: ...\ndef now_ns()", "bogus: missing in the core"),
    ("torch_record: bool = False", "torch_record: bool", "StreamRec.take: stub (torch_record)"),
    ("torch_record: bool = False", "torch_record: bool = True", "default of torch_record"),
    ("series: bool = False, trace", "series: bool = False, *, trace", "Store.snapshot: stub"),
    ("    enabled: bool\n", "    enabled_: bool\n", "Store.enabled: in the core, not in the stub"),
    ("    def harvest(self) -> None: ...\n", "", "StreamRec.harvest: in the core, not in the stub"),
    (
        "    @property\n    def gen(self) -> int: ...",
        "    gen: int",
        "Store.gen: writable in the stub",
    ),
    ("    total: float\n    min: float", "    min: float\n    total: float", "HistState: fields"),
    ("        kind: int,\n        rec", "        kind: int = 0,\n        rec", "Frame(): stub"),
    (
        "class Stack:",
        "class Stack:\n    def __init__(self, base: int) -> None: ...",
        "Stack(): stub (base)",
    ),
    ("IMPL: Final[str]", "IMPL: Final[int]", "IMPL: a str, the stub says int"),
]


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize(("old", "new", "said"), STUB_EDITS, ids=[e[2] for e in STUB_EDITS])
def test_an_edited_stub_is_caught(core: ModuleType, old: str, new: str, said: str) -> None:
    """A name, parameter, default, kind, attribute or field changed in the stub is reported."""
    source = STUB.read_text()
    assert source.count(old) == 1, old
    found = drift(parse_stub(source.replace(old, new)), core, instances(core), _extras(core))
    assert any(said in line for line in found), found


# Each edit of a core's module (name, new value), and what the check must then say.
CORE_EDITS = [
    pytest.param("flush_all", lambda: None, "flush_all: in the core, not", id="a new function"),
    pytest.param("drain", None, ".drain: missing in the core", id="a function gone"),
    pytest.param(
        "drain", lambda timeout: 0, ".drain: stub (timeout_s, /), core (timeout)", id="renamed"
    ),
    pytest.param(
        "stream_of", lambda key, /, new=False: None, "stream_of: stub (key, /), core", id="added"
    ),
]


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize(("name", "value", "said"), CORE_EDITS)
def test_an_edited_core_is_caught(
    core: ModuleType, name: str, value: Any, said: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A function added to, removed from or re-signed in a core is reported."""
    monkeypatch.setattr(core, name, value, raising=False)
    found = drift(parse_stub(STUB.read_text()), core, instances(core), _extras(core))
    assert any(said in line for line in found), found


def test_an_edited_method_of_the_python_core_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A method re-signed or added in the Python core is reported (C types are read-only)."""
    monkeypatch.setattr(_core_py.Store, "count", lambda self, slot, gen, device: None)
    monkeypatch.setattr(_core_py.Stack, "peek", lambda self: None, raising=False)
    found = drift(parse_stub(STUB.read_text()), _core_py, instances(_core_py))
    assert "_core_py.Store.count: stub (slot, gen, dev), core (slot, gen, device)" in found
    assert "_core_py.Stack.peek: in the core, not in the stub" in found


@needs_c
def test_c_signatures_match_the_c_argument_parsers() -> None:
    """Each C text signature takes what its flags and ``PyArg_ParseTupleAndKeywords`` take."""
    assert C_CORE is not None
    found = c_parser_drift(c_sources(), C_CORE)
    assert found == [], "\n".join(found)


C_SOURCE_EDITS = [
    ('"slot", "gen", "dev", NULL', '"slot", "gen", "device", NULL', "Store.count: kw[]"),
    ('"|p:take"', '"p:take"', "torch_record has a default in the signature, required"),
    ('"|$dndn:configure"', '"|dndn:configure"', "inv_log_gamma keyword-only"),
    ('{"drain", drain, METH_O,', '{"drain", drain, METH_NOARGS,', "drain: METH_NOARGS"),
]


@needs_c
@pytest.mark.parametrize(("old", "new", "said"), C_SOURCE_EDITS, ids=[e[0] for e in C_SOURCE_EDITS])
def test_an_edited_c_parser_is_caught(old: str, new: str, said: str) -> None:
    """A kw[] name, an optional or keyword-only mark, or a flag changed in C is reported."""
    assert C_CORE is not None
    source = c_sources()
    assert source.count(old) == 1, old
    found = c_parser_drift(source.replace(old, new), C_CORE)
    assert any(said in line for line in found), found
