"""Where a run ran, for its summary's metadata: the device its regions were timed on and the
host. The performance gate refuses to compare runs of different devices.

Read once per process and device (a few microseconds after that): a summary never initialises
CUDA for it, and a process whose parent initialised CUDA before forking names its CPU (its
regions run on the host clock).
"""

from __future__ import annotations

import functools
import platform
import socket

import torch

__all__ = ["machine_meta"]


@functools.lru_cache(maxsize=1)
def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


@functools.lru_cache(maxsize=64)
def _gpu_name(index: int) -> str:
    return str(torch.cuda.get_device_name(index))


def _device() -> str:
    try:
        if torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
            return _gpu_name(torch.cuda.current_device())
    except (RuntimeError, AssertionError):  # a forked child, a build without CUDA
        pass
    return f"CPU {_cpu_name()}"


def machine_meta() -> tuple[tuple[str, str], ...]:
    """``(("device", ...), ("host", ...))``: the GPU's name where CUDA is in use (``NVIDIA
    H200``), else ``CPU <model>``; the host name."""
    return (("device", _device()), ("host", socket.gethostname()))
