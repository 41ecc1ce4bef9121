"""The `cudatimer` commands the README and docs show exist, with the options they show."""

from __future__ import annotations

import argparse
import re

from cudatimer._cli import _parser
from tests.helpers.docs_blocks import blocks, documents

COMMAND = re.compile(r"^(?:\$ )?(?:python3? -m )?cudatimer(\.distributed)?\s+(.*)$")


def _documented() -> list[tuple[str, bool, str]]:
    """(where, distributed?, rest of the line) for every documented `cudatimer ...` line of a
    bash or text block."""
    out = []
    for path in documents():
        for b in blocks(path):
            if b.lang not in {"bash", "text", ""}:
                continue
            for line in re.sub(r"\\\n\s*", " ", b.code).splitlines():
                m = COMMAND.match(line.split(" # ")[0].strip())
                if m:
                    out.append((b.id, bool(m.group(1)), m.group(2)))
    return out


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("no subcommands")


def test_documented_commands_and_options_exist() -> None:
    """Each documented `cudatimer CMD --opt` names a real command and real options."""
    parser = _parser()
    commands = _subparsers(parser)
    top = {s for a in parser._actions for s in a.option_strings}
    seen = 0
    for where, distributed, rest in _documented():
        if distributed:
            continue  # checked below
        words = rest.split()
        if words[0].startswith("-"):
            assert words[0] in top, f"{where}: cudatimer {words[0]} is not an option"
            continue
        assert words[0] in commands, f"{where}: no command `cudatimer {words[0]}`"
        options = {s for a in commands[words[0]]._actions for s in a.option_strings}
        for flag in re.findall(r"(?<![\w-])(--?[a-z][a-z-]*)", rest):
            assert flag in options, f"{where}: `cudatimer {words[0]}` has no option {flag}"
        seen += 1
    assert seen >= 8  # the synopsis of docs/cli.md and the examples


def test_documented_distributed_commands_parse() -> None:
    """Each documented `python -m cudatimer.distributed CMD` is a command it knows."""
    found = [(w, rest) for w, distributed, rest in _documented() if distributed]
    assert found
    for where, rest in found:
        assert rest.split()[0] in {"show", "merge"}, where


def test_version_is_documented() -> None:
    """`cudatimer --version` is in the docs and in the parser."""
    assert any(rest.startswith("--version") for _, _, rest in _documented())
