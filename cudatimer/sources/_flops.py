"""FLOPs per region call (``flops=True``): counted from the ops a call dispatches, with
PyTorch's formulas (``torch.utils.flop_counter``'s registry) and the project's own for the
ops torch has none for (the CPU flash-attention kernels), then divided by the measured time
of the row at report time (``records._values.flop_rates``).

How, and why so: a dispatch mode sees every op of a call, but running one costs ~10-100 us
of host time per op, far more than the region. So a call is counted once and the count
reused:

- a decorated function's or module's call, once per input signature (tensor shapes and
  dtypes, grad mode, autocast state; ``signature``), kept in a bounded cache on its region
  (``CACHE_SIZE`` signatures); every later call of a known signature adds the cached count;
- a ``with`` block (no inputs to look at), a region whose signatures overflow the cache, or
  an argument the signature cannot read: one call in ``Timer(flop_every=...)`` (64) is
  counted, and the row's FLOPs a call are the mean of the counted ones (``sampled``).

A call being counted runs under the mode, slower on the host; it is kept out of the time
samples (its frame becomes an untimed one: counted in ``calls``, no sample), and so are the
calls of flops regions inside it, which take their counts from the same pass. A region's
FLOPs include its children's ops, as its time does. Ops with no formula from a namespace
other than aten's (custom ops, third-party attention, Triton kernels wrapped as ops) are
listed per row as uncounted (``flop_uncounted`` in the summary's meta), never silently zero.

Inside ``torch.compile``d code no op is dispatched to count: a compiled call adds the count
of the region's last eager counting call. An active dispatch mode makes a compiled callable
run eagerly (torch 2.13-2.14), so the first call of a flops region around compiled code (a
decorated compiled function, ``instrument(torch.compile(model))``'s model row) counts itself
and every flops region inside it.
"""

from __future__ import annotations

import math
import os
import re
import threading
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch.utils import flop_counter
from torch.utils._python_dispatch import TorchDispatchMode

from ..core import _core
from ..records._values import Column, register

__all__ = [
    "CACHE_SIZE",
    "DTYPES",
    "FLOP",
    "FLOPS",
    "FLOP_PEAK",
    "FLOP_UNTIMED",
    "PEAKS",
    "Entry",
    "FlopCalls",
    "FlopsProbe",
    "RegionFlops",
    "count",
    "counted",
    "device_peaks",
    "parse_peak_env",
    "parse_peak_tflops",
    "signature",
]

#: FLOP a call (fields ``flop_mean``, ``flop_max``).
FLOP = register(Column("flop", "", ("mean", "max"), doc="FLOP a call, counted from its ops"))
#: The dense peak of the device and dtype most of a call's FLOPs ran in, TFLOP/s (field
#: ``flop_peak_mean_tflops``): kept with the values, so merges, windows and loaded files
#: read MFU as the run did.
FLOP_PEAK = register(
    Column("flop_peak", "tflops", ("mean",), doc="peak TFLOP/s of the call's main dtype")
)
#: Calls left out of the time samples because they counted (field ``flop_untimed_count``).
FLOP_UNTIMED = register(
    Column("flop_untimed", "", ("count",), doc="calls counted under the dispatch mode, untimed")
)

#: The dtype classes a peak is given for.
DTYPES = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8")
#: Signatures kept per region before new ones are sampled instead.
CACHE_SIZE = 32
ENV_PEAK = "CUDATIMER_PEAK_TFLOPS"

# Dense (no sparsity) peaks, TFLOP/s, from NVIDIA's datasheets (docs/flops.md names each):
# fp32 the CUDA cores, tf32/bf16/fp16/fp8 the Tensor Cores; None: the GPU has no such mode.
_P = dict[str, float]
PEAKS: dict[str, _P] = {
    "H100 SXM": {
        "fp64": 67.0,
        "fp32": 67.0,
        "tf32": 494.7,
        "bf16": 989.4,
        "fp16": 989.4,
        "fp8": 1978.9,
    },
    "H100 PCIe": {
        "fp64": 51.0,
        "fp32": 51.0,
        "tf32": 378.0,
        "bf16": 756.0,
        "fp16": 756.0,
        "fp8": 1513.0,
    },
    "H100 NVL": {
        "fp64": 60.0,
        "fp32": 60.0,
        "tf32": 417.5,
        "bf16": 835.5,
        "fp16": 835.5,
        "fp8": 1670.5,
    },
    "H200": {
        "fp64": 67.0,
        "fp32": 67.0,
        "tf32": 494.7,
        "bf16": 989.4,
        "fp16": 989.4,
        "fp8": 1978.9,
    },
    "H200 NVL": {
        "fp64": 60.0,
        "fp32": 60.0,
        "tf32": 417.5,
        "bf16": 835.5,
        "fp16": 835.5,
        "fp8": 1670.5,
    },
    "B200": {
        "fp64": 37.0,
        "fp32": 75.0,
        "tf32": 1100.0,
        "bf16": 2250.0,
        "fp16": 2250.0,
        "fp8": 4500.0,
    },
    "A100": {"fp64": 19.5, "fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0},
    "L40S": {"fp32": 91.6, "tf32": 183.0, "bf16": 362.05, "fp16": 362.05, "fp8": 733.0},
    "L4": {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0, "fp8": 242.5},
    "A10": {"fp32": 31.2, "tf32": 62.5, "bf16": 125.0, "fp16": 125.0},
    "V100 SXM2": {"fp64": 7.8, "fp32": 15.7, "fp16": 125.0},
    "V100 PCIe": {"fp64": 7.0, "fp32": 14.0, "fp16": 112.0},
}
# torch.cuda.get_device_name() -> table row, first match wins ("NVIDIA H100 80GB HBM3" is
# the SXM part; "NVIDIA L40S" must not read as an L4).
_NAMES: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(p, re.IGNORECASE), key)
    for p, key in (
        (r"\bH200\b.*\bNVL\b", "H200 NVL"),
        (r"\bH200\b", "H200"),
        (r"\bH100\b.*\bNVL\b", "H100 NVL"),
        (r"\bH100\b.*\bPCIe\b", "H100 PCIe"),
        (r"\bH100\b", "H100 SXM"),
        (r"\bB200\b", "B200"),
        (r"\bA100\b", "A100"),
        (r"\bL40S\b", "L40S"),
        (r"\bL4\b", "L4"),
        (r"\bA10\b", "A10"),
        (r"\bV100\b.*\bPCIe\b", "V100 PCIe"),
        (r"\bV100\b", "V100 SXM2"),
    )
)


def device_peaks(name: str) -> tuple[str, _P] | None:
    """The table row (its key, peaks by dtype) of the GPU named ``name``, or None.

    >>> device_peaks("NVIDIA H100 80GB HBM3")[0], device_peaks("NVIDIA L40S")[0]
    ('H100 SXM', 'L40S')
    >>> device_peaks("NVIDIA GeForce RTX 4090") is None
    True
    """
    for pattern, key in _NAMES:
        if pattern.search(name):
            return key, PEAKS[key]
    return None


def _peak_number(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{where} must be a number of TFLOP/s, got {type(value).__name__}")
    number = float(value)
    if not math.isfinite(number) or number <= 0:
        raise ValueError(f"{where} must be a finite number of TFLOP/s > 0, got {value!r}")
    return number


def parse_peak_tflops(value: object, where: str = "peak_tflops") -> _P | None:
    """``Timer(peak_tflops=...)``: None (the table), a number (every dtype) or a dict by
    dtype (those dtypes; the others from the table), as peaks by dtype.

    >>> parse_peak_tflops(989)["bf16"], parse_peak_tflops({"fp32": 67})
    (989.0, {'fp32': 67.0})
    """
    if value is None:
        return None
    if isinstance(value, Mapping):
        out = {}
        for key, number in value.items():
            if key not in DTYPES:
                raise ValueError(
                    f"{where} keys must be dtypes among {', '.join(DTYPES)}; got {key!r}"
                )
            out[key] = _peak_number(number, f"{where}[{key!r}]")
        if not out:
            raise ValueError(f"{where} must name at least one dtype, got an empty dict")
        return out
    number = _peak_number(value, where)
    return dict.fromkeys(DTYPES, number)


def parse_peak_env(text: str) -> _P:
    """``CUDATIMER_PEAK_TFLOPS``: ``"989"`` (every dtype) or ``"bf16=989,fp32=67"``.

    >>> parse_peak_env("bf16=989, fp32=67")
    {'bf16': 989.0, 'fp32': 67.0}
    """
    text = text.strip()
    if "=" not in text:
        try:
            number = float(text)
        except ValueError:
            number = math.nan
        if not math.isfinite(number) or number <= 0:
            raise ValueError(
                f"environment variable {ENV_PEAK}={text!r} is not a peak: use a number of "
                "TFLOP/s > 0 ('989') or dtype=number pairs ('bf16=989,fp32=67')"
            )
        return dict.fromkeys(DTYPES, number)
    out: dict[str, float] = {}
    for part in text.split(","):
        key, sep, raw = part.partition("=")
        key = key.strip()
        try:
            number = float(raw) if sep else math.nan
        except ValueError:
            number = math.nan
        if key not in DTYPES or not math.isfinite(number) or number <= 0:
            raise ValueError(
                f"environment variable {ENV_PEAK}={text!r}: {part.strip()!r} is not "
                f"dtype=TFLOP/s with a dtype among {', '.join(DTYPES)} and a number > 0"
            )
        out[key] = number
    return out


# -- counting ---------------------------------------------------------------------------------
aten = torch.ops.aten


_sdpa_count: Callable[..., int] = flop_counter.sdpa_flop_count
_sdpa_backward_count: Callable[..., int] = flop_counter.sdpa_backward_flop_count


def _cpu_flash(
    query: Any, key: Any, value: Any, *args: Any, out_shape: Any = None, **kw: Any
) -> int:
    return int(_sdpa_count(query, key, value))


def _cpu_flash_backward(
    grad_out: Any, query: Any, key: Any, value: Any, *args: Any, out_shape: Any = None, **kw: Any
) -> int:
    return int(_sdpa_backward_count(grad_out, query, key, value))


def _shapes(formula: Callable[..., int]) -> Callable[..., int]:
    """``formula`` over shapes, called as torch's registry entries are (tensors, ``out_val``)."""

    def of_tensors(*args: Any, out_val: Any = None, **kwargs: Any) -> int:
        args = tuple(a.shape if isinstance(a, torch.Tensor) else a for a in args)
        kwargs = {k: v.shape if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
        return formula(*args, **kwargs)

    return of_tensors


# torch 2.13-2.14 count 0 for CPU attention: its flash kernels have no formula. Counted as
# torch counts the CUDA kernels (causal attention is not halved).
_OWN: dict[Any, Callable[..., int]] = {}
for _name, _formula in (
    ("_scaled_dot_product_flash_attention_for_cpu", _cpu_flash),
    ("_scaled_dot_product_flash_attention_for_cpu_backward", _cpu_flash_backward),
):
    _op = getattr(aten, _name, None)
    if _op is not None:
        _OWN[_op] = _shapes(_formula)

# Namespaces whose ops without a formula do no FLOPs worth a note (elementwise ops, views,
# copies, reductions: memory-bound work). Any other op without a formula is listed.
_QUIET = frozenset({"aten", "prim", "prims", "_c10d_functional", "c10d", "profiler", "cudatimer"})
_MATMULS = frozenset(
    getattr(aten, n) for n in ("mm", "addmm", "bmm", "baddbmm", "matmul") if hasattr(aten, n)
)
_CONVS = frozenset(
    getattr(aten, n)
    for n in ("convolution", "_convolution", "cudnn_convolution", "convolution_backward")
    if hasattr(aten, n)
)
_FP8 = frozenset(
    getattr(torch, n)
    for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
    if hasattr(torch, n)
)
_DTYPE = {torch.float64: "fp64", torch.bfloat16: "bf16", torch.float16: "fp16"}
_scaled_mm = getattr(aten, "_scaled_mm", None)


def _first_tensor(args: Any) -> torch.Tensor | None:
    for a in args:
        if isinstance(a, torch.Tensor):
            return a
        if isinstance(a, (list, tuple)):
            for b in a:
                if isinstance(b, torch.Tensor):
                    return b
    return None


def _kind(packet: Any, args: Any) -> tuple[str, int, str]:
    """(device type, index, dtype class) an op's FLOPs ran in: its first tensor's."""
    t = _first_tensor(args)
    if t is None:
        return ("cpu", -1, "fp32")
    dev = t.device
    dtype = t.dtype
    if packet is _scaled_mm or dtype in _FP8:
        name = "fp8"
    elif dtype is torch.float32:
        name = "fp32"
        if dev.type == "cuda" and (
            (packet in _MATMULS and torch.backends.cuda.matmul.allow_tf32)
            or (packet in _CONVS and torch.backends.cudnn.allow_tf32)
        ):
            name = "tf32"
    else:
        name = _DTYPE.get(dtype, str(dtype).removeprefix("torch."))
    return (dev.type, -1 if dev.index is None else dev.index, name)


class _Scope:
    """One call being counted: its FLOPs by (device type, index, dtype) and the ops with no
    formula it ran."""

    __slots__ = ("by", "flop", "uncounted")

    def __init__(self) -> None:
        self.flop = 0
        self.by: dict[tuple[str, int, str], int] = {}
        self.uncounted: set[str] = set()


class _Counting(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Adds each op's FLOPs to every scope open on its thread (a call and the calls around it
    being counted by one pass)."""

    supports_higher_order_operators = True

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.scopes: list[_Scope] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if isinstance(func, torch._ops.HigherOrderOperator):
            name = getattr(func, "__name__", str(func))
            if "triton" in name:
                self._uncounted(f"triton kernel ({name})")
            return NotImplemented
        packet = func._overloadpacket
        formula = _OWN.get(packet) or flop_counter.flop_registry.get(packet)
        if formula is None and func.namespace == "aten":
            # As FlopCounterMode does: an op with a decomposition is counted by its parts.
            with self:
                r = func.decompose(*args, **kwargs)
            if r is not NotImplemented:
                return r
        out = func(*args, **kwargs)
        if formula is not None:
            n = int(formula(*args, **kwargs, out_val=out))
            if n:
                key = _kind(packet, args)
                for s in self.scopes:
                    s.flop += n
                    s.by[key] = s.by.get(key, 0) + n
        elif func.namespace not in _QUIET:
            self._uncounted(f"{func.namespace}::{packet.__name__.rpartition('.')[2]}")
        return out

    def _uncounted(self, name: str) -> None:
        for s in self.scopes:
            s.uncounted.add(name)


class _Local(threading.local):
    def __init__(self) -> None:
        self.mode: _Counting | None = None
        # (region, its frame or None, _Scope | Entry | None) of the open `with` blocks
        self.blocks: list[tuple[Any, Any, Any]] = []


_LOCAL = _Local()


def _open() -> _Scope:
    scope = _Scope()
    mode = _LOCAL.mode
    if mode is None:
        mode = _LOCAL.mode = _Counting()
        mode.scopes.append(scope)
        try:
            mode.__enter__()  # type: ignore[no-untyped-call]
        except BaseException:
            _LOCAL.mode = None
            raise
    else:
        mode.scopes.append(scope)
    return scope


def _close(scope: _Scope) -> None:
    mode = _LOCAL.mode
    if mode is None:
        return
    if scope in mode.scopes:
        mode.scopes.remove(scope)
    if not mode.scopes:
        _LOCAL.mode = None
        mode.__exit__(None, None, None)  # type: ignore[no-untyped-call]


def count(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, int]:
    """Run ``fn(*args, **kwargs)`` counting its FLOPs as regions do: (its result, FLOP).

    >>> import torch
    >>> count(torch.mm, torch.ones(4, 8), torch.ones(8, 16))[1]
    1024
    """
    scope = _open()
    try:
        out = fn(*args, **kwargs)
    finally:
        _close(scope)
    return out, scope.flop


# -- signatures -------------------------------------------------------------------------------
class _Unknown(Exception):
    """An argument the signature cannot read (its FLOPs might change with it unseen)."""


_ATOMS = (int, float, str, bool, type(None), torch.dtype, torch.device)
_Tensor = torch.Tensor
_Module = torch.nn.Module
_grad_enabled = torch.is_grad_enabled
_any_autocast: Callable[[], bool] = getattr(torch._C, "_is_any_autocast_enabled", lambda: False)


_TENSOR, _ATOM = 1, 2
_KINDS: dict[type, int] = {
    torch.Tensor: _TENSOR,
    torch.nn.Parameter: _TENSOR,
    **dict.fromkeys(_ATOMS, _ATOM),
}


def _sig(x: Any, depth: int = 0) -> Any:
    if isinstance(x, _Tensor):
        return (x.shape, x.dtype)
    if isinstance(x, _ATOMS):
        return x
    if isinstance(x, _Module):  # a module's own forward gets it as self: the same each call
        return id(x)
    if isinstance(x, (tuple, list)) and depth < 2 and len(x) <= 16:
        return tuple(_sig(v, depth + 1) for v in x)
    if isinstance(x, dict) and depth < 2 and len(x) <= 16:
        return tuple((k, _sig(v, depth + 1)) for k, v in x.items())
    # A key-value cache (Hugging Face's Cache classes): the FLOPs of attention over it
    # follow its length (a decode step's changes every token, and is then sampled).
    length = getattr(type(x), "get_seq_length", None)
    if length is not None:
        try:
            return (type(x), int(length(x)))
        except Exception:  # a cache that cannot say: not read
            raise _Unknown from None
    raise _Unknown


def _autocast() -> Any:
    return tuple(
        (d, torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in ("cuda", "cpu")
    )


def signature(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """What a call's FLOPs depend on: its tensors' shapes and dtypes (and the other
    arguments' values), grad mode, autocast state; None when an argument cannot be read
    (an object of another type: that region's calls are sampled instead).

    >>> import torch
    >>> a = signature((torch.ones(2, 3),), {"scale": 2})
    >>> a == signature((torch.zeros(2, 3),), {"scale": 2}), a == signature((torch.ones(3),), {})
    (True, False)
    """
    # Written out for the common arguments (a module's self, tensors, None and flags): one
    # dict lookup of the type each, ~0.6 us for (self, tensor, 2 keywords) on a loaded CPU
    # host where a recursive walk took 1.8 us.
    key: list[Any] = [_grad_enabled()]
    add = key.append
    if _any_autocast():
        add(_autocast())
    kinds = _KINDS
    try:
        for a in args:
            kind = kinds.get(type(a))
            if kind is _TENSOR:
                add(a.shape)
                add(a.dtype)
            elif kind is _ATOM:
                add(a)
            elif isinstance(a, _Module):
                add(id(a))
            else:
                add(_sig(a))
        if kwargs:
            for name, v in kwargs.items():
                add(name)
                kind = kinds.get(type(v))
                if kind is _TENSOR:
                    add(v.shape)
                    add(v.dtype)
                elif kind is _ATOM:
                    add(v)
                else:
                    add(_sig(v))
    except _Unknown:
        return None
    return tuple(key)


# -- per Timer --------------------------------------------------------------------------------
class Entry:
    """One counted call: the values it adds to its row, the ops it could not count."""

    __slots__ = ("flop", "uncounted", "untimed", "values")

    def __init__(self, flop: int, peak: float | None, uncounted: frozenset[str]) -> None:
        self.flop = flop
        self.values: tuple[tuple[str, float], ...] = (("flop", float(flop)),) + (
            (("flop_peak", peak),) if peak is not None else ()
        )
        self.uncounted = uncounted
        # The same for a call that was counting, so left untimed (told apart from every=N).
        self.untimed: Entry | None = None

    def counting(self) -> Entry:
        """This count as a counting call adds it (with the ``flop_untimed`` mark)."""
        twin = self.untimed
        if twin is None:
            twin = self.untimed = Entry.__new__(Entry)
            twin.flop = self.flop
            twin.values = (*self.values, ("flop_untimed", 1.0))
            twin.uncounted = self.uncounted
            twin.untimed = twin
        return twin


_TIMED, _HOST, _UNTIMED = _core.TIMED, _core.HOST, _core.UNTIMED
_COUNTABLE = (_TIMED, _HOST, _UNTIMED)
# Distinct (row, step, count) keys held before they are folded into the values (each fold
# takes the recorder's lock): a few hundred rows a step, a fold every few steps.
_FLUSH_AT = 4096


def _untime(frame: Any) -> bool:
    """Keep the call of ``frame`` out of the time samples (it is being counted, and runs
    slower): it becomes an untimed call, counted in ``calls`` as ``every=N`` calls are.
    False when it was untimed already (an ``every=N`` call not sampled)."""
    kind = frame.kind
    if kind == _TIMED:
        rec, start = frame.rec, frame.start
        frame.dev = rec.device
        frame.kind = _UNTIMED
        frame.start = None
        rec.give(start)
        return True
    if kind == _HOST:
        frame.dev = -1
        frame.kind = _UNTIMED
        return True
    return False


def _row_dev(frame: Any) -> int:
    kind = frame.kind
    if kind == _TIMED:
        dev: int = frame.rec.device
        return dev
    if kind == _HOST:
        return -1
    if kind == _UNTIMED:
        d: int = frame.dev
        return d
    return -2


class FlopCalls:
    """This source's state for one recorder (``Recorder.flops``): the peaks, the sampling
    rate, the counts not folded yet, the ops left uncounted per row, the notes."""

    def __init__(self, host: Any) -> None:
        self.host = host  # the Recorder: store, tree, values
        self.override: _P | None = None  # Timer(peak_tflops=...) or CUDATIMER_PEAK_TFLOPS
        self.every = 64
        self.blocks: dict[str, int] = {}  # calls of `with` regions by name (the sampling)
        self.last: dict[str, Entry] = {}  # the last count of a `with` region, by name
        self._pending: dict[tuple[int, int, int, int, Entry], int] = {}
        self._uncounted: dict[int, set[str]] = {}
        self._names: dict[int, str] = {}  # device index -> name
        self._used: dict[str, str] = {}  # device -> the peaks used, for the meta
        self._unknown: set[str] = set()

    def configure(self, peak_tflops: object, every: object) -> None:
        """``Timer(peak_tflops=..., flop_every=...)``, checked; the environment's peaks where
        ``peak_tflops`` is None."""
        if isinstance(every, bool) or not isinstance(every, int):
            raise TypeError(f"flop_every must be an int, got {type(every).__name__}")
        if every < 1:
            raise ValueError(f"flop_every must be >= 1 (1: count every call), got {every}")
        override = parse_peak_tflops(peak_tflops)
        if override is None:
            raw = os.environ.get(ENV_PEAK)
            if raw is not None and raw.strip():
                override = parse_peak_env(raw)
        self.override = override
        self.every = every

    # -- peaks ------------------------------------------------------------------------------
    def peak(self, dev_type: str, index: int, dtype: str) -> float | None:
        """The peak of ``dtype`` on that device: the override's, else the table's; None (and
        one note) where neither knows it."""
        if dev_type == "cuda":
            name = self._names.get(index)
            if name is None:
                try:
                    name = torch.cuda.get_device_name(index if index >= 0 else None)
                except Exception:  # a note, never an error in a region's exit
                    name = f"cuda:{index}"
                self._names[index] = name
            label = f"cuda:{max(index, 0)} {name}"
        else:
            name = label = dev_type
        override = self.override
        if override is not None and dtype in override:
            self._used.setdefault(label, _peaks_text(override) + " (given)")
            return override[dtype]
        row = device_peaks(name) if dev_type == "cuda" else None
        if row is not None:
            key, peaks = row
            value = peaks.get(dtype)
            if value is None and dtype == "tf32":  # no TF32 mode (V100): fp32 math
                value = peaks.get("fp32")
            if value is not None:
                self._used.setdefault(label, f"{key}: " + _peaks_text(peaks))
                return value
        self._unknown.add(f"{label} ({dtype})")
        return None

    def entry(self, scope: _Scope) -> Entry:
        peak = None
        if scope.by:
            dev_type, index, dtype = max(scope.by, key=scope.by.__getitem__)
            peak = self.peak(dev_type, index, dtype)
        return Entry(scope.flop, peak, frozenset(scope.uncounted))

    # -- recording --------------------------------------------------------------------------
    def add(self, frame: Any, entry: Entry) -> None:
        """The count ``entry`` for the call of ``frame`` (folded later, in batches)."""
        dev = _row_dev(frame)
        if dev == -2:
            return
        key = (frame.slot, frame.gen, dev, self.host.store.step, entry)
        pending = self._pending
        pending[key] = pending.get(key, 0) + 1
        if len(pending) >= _FLUSH_AT:
            self.flush()

    def flush(self) -> None:
        pending, self._pending = self._pending, {}
        if not pending:
            return
        for (slot, _, _, _, entry), _n in pending.items():
            if entry.uncounted:
                self._uncounted.setdefault(slot, set()).update(entry.uncounted)
        self.host.values.add_counted(
            [
                (slot, gen, dev, step, entry.values, n)
                for (slot, gen, dev, step, entry), n in pending.items()
            ]
        )

    # -- Source -----------------------------------------------------------------------------
    def drain(self, timeout_s: float) -> None:
        self.flush()

    def pending(self) -> int:
        return 0

    def notes(self) -> tuple[tuple[str, str], ...]:
        out: list[tuple[str, str]] = []
        if self._used:
            out.append(
                ("flop_peaks", "; ".join(f"{d}: {p}" for d, p in sorted(self._used.items())))
            )
        if self._unknown:
            out.append(
                (
                    "flop_note",
                    "MFU unknown (no peak) for "
                    + ", ".join(sorted(self._unknown))
                    + f": pass Timer(peak_tflops=...) or set {ENV_PEAK} (docs/flops.md)",
                )
            )
        if self._uncounted:
            parts = []
            for slot, names in self._uncounted.items():
                try:
                    path = self.host.tree.path(slot)
                except KeyError:
                    continue
                parts.append(f"{path}: {', '.join(sorted(names))}")
            if parts:
                out.append(("flop_uncounted", "; ".join(sorted(parts))))
        return tuple(out)

    def reset(self) -> None:
        self._pending = {}
        self._uncounted = {}
        self._used = {}
        self._unknown = set()
        self.blocks = {}


def _peaks_text(peaks: Mapping[str, float]) -> str:
    return ",".join(f"{d}={peaks[d]:g}" for d in DTYPES if d in peaks)


def uncounted(meta: Mapping[str, str] | tuple[tuple[str, str], ...]) -> dict[str, tuple[str, ...]]:
    """The ops left uncounted per row, read back from a summary's meta (``flop_uncounted``).

    >>> uncounted({"flop_uncounted": "a/b: my::op, x::y; c: z::w"})
    {'a/b': ('my::op', 'x::y'), 'c': ('z::w',)}
    """
    text = dict(meta).get("flop_uncounted", "")
    out: dict[str, tuple[str, ...]] = {}
    for part in text.split("; ") if text else ():
        path, _, ops = part.rpartition(": ")
        out[path] = tuple(o for o in ops.split(", ") if o)
    return out


__all__ += ["uncounted"]


# -- per region -------------------------------------------------------------------------------
_is_compiling: Callable[[], bool] = torch.compiler.is_compiling


class RegionFlops:
    """A flops region's own state: the counts of the signatures seen (at most
    ``CACHE_SIZE``), the calls past them (sampled), the last count (for compiled calls)."""

    __slots__ = ("cache", "full", "last", "misses")

    def __init__(self) -> None:
        self.cache: dict[Any, Entry] = {}
        self.full = False  # the cache overflowed: new signatures are sampled
        self.misses = 0
        self.last: Entry | None = None


def counted(call: Callable[..., Any], region: Any) -> Callable[..., Any]:
    """``call`` (a decorated callable, inside its region's enter and exit) counted: once per
    signature, the others sampled."""
    state: RegionFlops = region.flop_state
    cache = state.cache
    rec = region.timer.recorder
    flops: FlopCalls = rec.flops
    store = rec.store
    local = _LOCAL

    def counted_call(*args: Any, **kwargs: Any) -> Any:
        top = store.stack().top()
        if top is None or top.region is not region or top.kind not in _COUNTABLE:
            return call(*args, **kwargs)
        sig = signature(args, kwargs)
        entry = cache.get(sig) if sig is not None else None
        if entry is not None and local.mode is None:
            out = call(*args, **kwargs)
            flops.add(top, entry)
            return out
        return _count_call(flops, state, top, sig, entry, call, args, kwargs)

    return counted_call


def _count_call(
    flops: FlopCalls,
    state: RegionFlops,
    top: Any,
    sig: Any,
    entry: Entry | None,
    call: Callable[..., Any],
    args: Any,
    kwargs: Any,
) -> Any:
    nested = _LOCAL.mode is not None
    if entry is not None:  # known, inside a call being counted: untimed, the known count
        untimed = _untime(top)
        out = call(*args, **kwargs)
        flops.add(top, entry.counting() if untimed else entry)
        return out
    if sig is None or state.full or len(state.cache) >= CACHE_SIZE:
        state.full = state.full or sig is not None
        n = state.misses
        state.misses = n + 1
        if not nested and n % flops.every:
            return call(*args, **kwargs)
        sig = None  # counted, not kept
    untimed = _untime(top)
    scope = _open()
    try:
        out = call(*args, **kwargs)
    finally:
        _close(scope)
    entry = flops.entry(scope)
    if sig is not None:
        state.cache[sig] = entry
    state.last = entry
    flops.add(top, entry.counting() if untimed else entry)
    return out


class FlopsProbe:
    """What ``flops=True`` adds around a ``with`` block's call (``sources._source.Probe``):
    one call in ``flop_every`` counted; inside compiled code, the region's last count."""

    option = "flops"
    #: The region options that made it (``Probe.options``).
    options: dict[str, Any] = {}  # noqa: RUF012 (read only; backward rows count no FLOPs)

    def enter(self, region: Any) -> None:
        if _is_compiling():
            return
        rec = region.timer.recorder
        top = rec.store.stack().top()
        blocks = _LOCAL.blocks
        if top is None or top.region is not region or top.kind not in _COUNTABLE:
            blocks.append((region, None, None))
            return
        flops: FlopCalls = rec.flops
        if region.compiled:  # run by the marks of compiled code: nothing to count here
            state: RegionFlops | None = region.flop_state
            last = state.last if state is not None else None
            blocks.append((region, top, last or flops.last.get(region.name)))
            return
        n = flops.blocks.get(region.name, 0)
        flops.blocks[region.name] = n + 1
        if _LOCAL.mode is None and n % flops.every:
            blocks.append((region, None, None))
            return
        blocks.append((region, top, (_open(), _untime(top))))

    def exit(self, region: Any, exc: BaseException | None) -> None:
        if _is_compiling():
            return
        blocks = _LOCAL.blocks
        for i in range(len(blocks) - 1, -1, -1):
            if blocks[i][0] is region:
                _, frame, what = blocks.pop(i)
                break
        else:
            return
        if what is None:
            return
        rec = region.timer.recorder
        flops: FlopCalls = rec.flops
        if isinstance(what, tuple):
            scope, untimed = what
            _close(scope)
            if exc is not None:
                return
            entry = flops.entry(scope)
            flops.last[region.name] = entry
            state: RegionFlops | None = region.flop_state
            if state is not None:
                state.last = entry
            if untimed:
                entry = entry.counting()
        else:
            entry = what
        flops.add(frame, entry)

    def detached(
        self, region: Any, open_: Callable[[], Any], close: Callable[[Any], None]
    ) -> tuple[Callable[[], Any], Callable[[Any], None]]:
        """Detached calls (backward rows, coroutines) are not counted: their ops run where
        no scope of theirs is open (docs/flops.md, "Limits")."""
        return open_, close


#: The probe of ``flops=True``.
FLOPS = FlopsProbe()
