"""The one writer: rendered text or bytes put where an output was asked to go.

Every output ends here: the report's text (stdout, a text stream or a logger), JSON, CSV,
traces, PNG and HTML (a path, written atomically, or a stream). A ``Target`` is made from the
user's arguments before anything is rendered, so a bad ``path=``, ``file=`` or ``logger=``
fails at once instead of after a report's wait for the GPU (up to ``timeout_s``, 60 s).

>>> import io
>>> out = io.StringIO()
>>> to_file(out).write("a,b\\n")
>>> out.getvalue()
'a,b\\n'
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import os
import sys
from dataclasses import dataclass
from typing import Any

__all__ = ["Target", "check_path", "to_file", "to_path", "to_print", "write_atomic"]

_TMP_SEQ = itertools.count()


def check_path(path: object) -> str:
    """``path`` as a str, or a TypeError naming what a path must be."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a file path (str or os.PathLike), got {type(path).__name__}")
    return os.fspath(path)  # type: ignore[arg-type]


def write_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to a temporary file next to ``path``, then rename it to ``path``: on any
    failure the temporary file is removed and a previous ``path`` is left as it was.

    A missing folder is created (as ``mkdir -p`` would): per-rank files such as
    ``timings/rank3.json`` are written by every rank of a job, and a job that fails at its
    last line for want of a folder loses the run. An error opening the file names ``path``,
    never the temporary file the user did not ask for."""
    target = check_path(path)
    tmp = f"{target}.tmp{os.getpid()}.{next(_TMP_SEQ)}"
    folder = os.path.dirname(target)
    try:
        if folder and not os.path.isdir(folder):
            try:
                os.makedirs(folder, exist_ok=True)
            except FileExistsError:  # a part of the folder's path is a file
                raise NotADirectoryError(errno.ENOTDIR, "Not a directory", folder) from None
        file = open(tmp, "wb")  # noqa: SIM115 (closed by the with below; opening errors name path)
    except OSError as exc:
        raise type(exc)(exc.errno, exc.strerror, target) from None
    try:
        with file as f:
            f.write(data)
        try:
            os.replace(tmp, target)
        except OSError as exc:  # onto a folder, say: name the path given, not the temporary
            raise type(exc)(exc.errno, exc.strerror, target) from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


@dataclass(frozen=True)
class Target:
    """Where one output goes: a path (written atomically), a stream, a logger, or stdout.

    ``line``: the report's way, as ``print``: a newline after the text, stdout when no stream
    is given; a logger gets the text as one record, so handlers keep a table whole."""

    path: str | None = None
    stream: Any = None
    logger: logging.Logger | None = None
    level: int = logging.INFO
    line: bool = False

    def write(self, content: str | bytes) -> None:
        """Write ``content`` (the rendered text, or bytes for a PNG) to this target."""
        if self.logger is not None:
            self.logger.log(self.level, "%s", content)
        elif self.path is not None:
            # Bytes, so no newline translation: a file reads the same on every platform.
            data = content.encode("utf-8") if isinstance(content, str) else content
            write_atomic(self.path, data)
        elif self.line:
            print(content, file=sys.stdout if self.stream is None else self.stream)
        else:
            self.stream.write(content)


def to_path(path: object) -> Target:
    """A target that is a file path only (``save``: JSON is written to disk)."""
    return Target(path=check_path(path))


def to_file(path: object, *, binary: bool = False) -> Target:
    """A file path, or a stream with ``.write()`` (a binary one for ``binary`` content)."""
    if callable(getattr(path, "write", None)):
        return Target(stream=path)
    if not isinstance(path, (str, os.PathLike)):
        kind = "binary" if binary else "text"
        raise TypeError(f"path must be a file path or a {kind} stream, got {type(path).__name__}")
    return Target(path=os.fspath(path))


def to_print(file: object = None, logger: object = None, level: object = logging.INFO) -> Target:
    """The report's target: stdout, ``file`` (a text stream) or ``logger`` (at ``level``)."""
    if file is not None and logger is not None:
        raise ValueError("give either file= or logger=, not both")
    if file is not None and not callable(getattr(file, "write", None)):
        raise TypeError(
            f"file must be a text stream with .write() (e.g. sys.stderr or an open file), got "
            f"{type(file).__name__}; to save results to a path use save(path)"
        )
    if logger is not None and not isinstance(logger, logging.Logger):
        raise TypeError(f"logger must be a logging.Logger, got {type(logger).__name__}")
    if isinstance(level, bool) or not isinstance(level, int):
        raise TypeError(f"level must be a logging level (int), got {type(level).__name__}")
    return Target(stream=file, logger=logger, level=level, line=True)
