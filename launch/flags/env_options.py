"""The env's options on the command line: `--env_kwargs` (keyword arguments of the env) and
`--env_wrappers`, applied to the factory `--env` names."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from trellis.envs import EnvFactory, make_env_factory
from trellis.envs.options import with_env_options
from trellis.launch.flags.values import UsageError

# A --env_kwargs item's start: a comma before KEY= ends the item before it (so that a JSON
# VALUE may hold commas: sizes=[64,64],gravity=9.8).
_NEXT_KWARG = re.compile(r",(?=\s*[A-Za-z_]\w*\s*=)")


ENV_KWARGS = "a JSON object or KEY=VALUE,..."


def env_kwargs(text: str | None) -> dict[str, Any]:
    """`--env_kwargs` as {name: value}: a JSON object, or KEY=VALUE,... with each VALUE read
    as JSON where it parses (5, 0.5, true, [1, 2], "a b"), else as the string it is.

    Raises:
      UsageError: the text is neither.
    """
    if text is None:
        return {}
    error = UsageError(f"--env_kwargs must be {ENV_KWARGS}, got {text!r}")
    if text.lstrip().startswith("{"):
        try:
            kwargs = json.loads(text)
        except ValueError:
            raise error from None
        if not isinstance(kwargs, dict):
            raise error
        return kwargs
    out: dict[str, Any] = {}
    for item in _NEXT_KWARG.split(text):
        key, equals, value = (part.strip() for part in item.partition("="))
        if not equals or not key.isidentifier():
            raise error
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out


def env_factory(env: str, kwargs: str | None = None,
                wrappers: Sequence[str] | None = None) -> EnvFactory:
    """The factory of `--env`, with `--env_kwargs` and `--env_wrappers` (not validated).

    Raises:
      UsageError: bad --env_kwargs text.
      UnknownEnvError: an env family that takes no such options.
    """
    return with_env_options(make_env_factory(env), env_kwargs(kwargs), tuple(wrappers or ()))
