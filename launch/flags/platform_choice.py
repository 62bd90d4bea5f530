"""Which platform a command line runs on, read before anything imports JAX (run.py picks
its XLA settings from it): from the flags, else the `--config` file or the `--resume` run,
else the command line's default."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trellis.builders.contract.config import settings
from trellis.launch.flags.files import base_settings
from trellis.launch.flags.run_settings import RunOptions
from trellis.launch.flags.table import flag_parser, given_flags
from trellis.launch.flags.values import UsageError


def platform_of(argv: Sequence[str]) -> str:
    """The platform `argv` names (on the command line, in its --config file or its --resume
    run), read before anything imports JAX; bad input is left for `parse` to report."""
    try:
        given, base, _ = given_options(argv, "run.py")
    except UsageError:
        return RunOptions.platform
    return chosen_platform(given, base)


def chosen_platform(given: dict[str, Any], base: dict[str, Any],
                    defaults: dict[str, Any] | None = None) -> str:
    """The platform the flags give, else the --config file or --resume run, else `defaults`'
    (tune.py's), else RunOptions'."""
    platform: str = given.get("platform", base.get("platform", (defaults or {}).get(
        "platform", RunOptions.platform)))
    return platform


def given_options(argv: Sequence[str], prog: str
                  ) -> tuple[dict[str, Any], dict[str, Any], dict[str, str]]:
    """The command line's own options given in `argv`, and the settings they start from
    (`files.base_settings`: the --resume run's, the --config file's) with their origins."""
    options = {s.name: s for s in settings(RunOptions)}
    parser = flag_parser(prog, "", [("", RunOptions)], add_help=False)
    given, _ = given_flags(parser, argv, options)
    return (given, *base_settings(given))
