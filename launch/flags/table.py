"""The flag table, generated from the config dataclasses: a `--name` flag per field of each
config class, with its declared default, one-line help and bounds; no flag is written by hand."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any, NoReturn

from trellis.builders.contract.config import Setting, settings
from trellis.launch.flags.values import AUTO, UsageError, from_text, requirement, shown


class _Parser(argparse.ArgumentParser):
    """argparse without its own exit on errors: they become UsageError."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def _metavar(s: Setting) -> str:
    if s.declaration.choices is not None:
        return "{" + ",".join(str(c) for c in s.declaration.choices) + "}"
    return {int: "INT", float: "FLOAT", bool: "BOOL", str: "STR"}[s.kind] + (
        ",..." if s.sequence else "")


def flag_parser(prog: str, description: str, groups: Sequence[tuple[str, type]],
                add_help: bool = True, defaults: dict[str, Any] | None = None
                ) -> argparse.ArgumentParser:
    """A flag per field of each (title, config class) group; each given flag parses to its
    text (every default is SUPPRESS, so the namespace holds only the flags given). Help shows
    `defaults` where this command line has its own (tune.py's platform)."""
    parser = _Parser(prog=prog, description=description, allow_abbrev=False, add_help=add_help,
                     epilog="Flags are --name=value; booleans also --name (true) and "
                     "--name=false; none sets an optional setting to None. "
                     "`--agent=X --help` lists agent X's settings.")
    for title, cls in groups:
        group = parser.add_argument_group(title)
        for s in settings(cls):
            default = AUTO if s.name == "stop_at_return" else shown(
                (defaults or {}).get(s.name, s.default))
            group.add_argument(
                f"--{s.name}", default=argparse.SUPPRESS, metavar=_metavar(s),
                nargs="?" if s.kind is bool and not s.sequence else None,
                const="true" if s.kind is bool else None,
                help=f"{s.help} (default: {default}; {requirement(s)})".replace("%", "%%"))
    return parser


def given_flags(parser: argparse.ArgumentParser, argv: Sequence[str],
                known: dict[str, Setting]) -> tuple[dict[str, Any], list[str]]:
    """The flags of `parser` given in `argv`, as values; and the arguments it does not know."""
    flags, extra = parser.parse_known_args(argv)
    return {name: from_text(known[name], text) for name, text in vars(flags).items()}, extra
