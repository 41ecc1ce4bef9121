"""The fenced code blocks of the README and docs/*.md, with their snippet markers.

A marker is an HTML comment on the line just before a fence (invisible on GitHub):

    <!-- snippet: gpu -->               needs CUDA: skipped without it
    <!-- snippet: needs=lightning -->   needs that package (of an extra): skipped without it
    <!-- snippet: define=run -->        the setup named "run", for other blocks of the file
    <!-- snippet: setup=run -->         run the setup "run" of the same file first
    <!-- snippet: skip REASON -->       not run, for the reason given (say why)

Tokens combine (``gpu setup=train``); ``skip`` takes the rest of the comment as its reason.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"^<!--\s*snippet:\s*(.*?)\s*-->\s*$")
FENCE = re.compile(r"^```(\S*)\s*$")


@dataclass
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    gpu: bool = False
    needs: list[str] = field(default_factory=list)
    define: str | None = None
    setup: list[str] = field(default_factory=list)
    skip: str | None = None

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT).as_posix()}:{self.line}"


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _apply(block: Block, marker: str) -> None:
    tokens = marker.split()
    while tokens:
        token = tokens.pop(0)
        if token == "gpu":
            block.gpu = True
        elif token.startswith("needs="):
            block.needs += token.removeprefix("needs=").split(",")
        elif token.startswith("define="):
            block.define = token.removeprefix("define=")
        elif token.startswith("setup="):
            block.setup += token.removeprefix("setup=").split(",")
        elif token == "skip":
            block.skip = " ".join(tokens)
            if not block.skip:
                raise ValueError(f"{block.id}: 'skip' needs a reason")
            tokens = []
        else:
            raise ValueError(f"{block.id}: unknown snippet marker {token!r}")


def blocks(path: Path) -> list[Block]:
    """Every fenced block of ``path``; a ValueError for a marker that is not understood or
    not followed by a fence."""
    found: list[Block] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    marker: tuple[int, str] | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        m = MARKER.match(line)
        if m:
            marker = (i + 1, m.group(1))
            i += 1
            continue
        fence = FENCE.match(line)
        if fence:
            end = i + 1
            while end < len(lines) and not lines[end].startswith("```"):
                end += 1
            block = Block(path, i + 1, fence.group(1), "\n".join(lines[i + 1 : end]) + "\n")
            if marker is not None:
                if marker[0] != i:
                    raise ValueError(
                        f"{path.name}:{marker[0]}: a snippet marker must be the line before a fence"
                    )
                _apply(block, marker[1])
            found.append(block)
            marker = None
            i = end + 1
            continue
        if marker is not None and line.strip():
            raise ValueError(
                f"{path.name}:{marker[0]}: a snippet marker must be the line before a fence"
            )
        i += 1
    return found


def python_blocks() -> list[Block]:
    return [b for p in documents() for b in blocks(p) if b.lang == "python"]


def shell_lines() -> list[tuple[Block, str]]:
    """Each command of the documents' bash blocks (continuation lines joined)."""
    out = []
    for path in documents():
        for b in blocks(path):
            if b.lang != "bash":
                continue
            text = re.sub(r"\\\n\s*", " ", b.code)
            out += [(b, line.strip()) for line in text.splitlines() if line.strip()]
    return out
