"""Settings files: `--config=FILE` (JSON or YAML, flat or with config.json's sections), tune.py's
`search` section, and the saved settings a `--resume` run starts from."""

from __future__ import annotations

import json
import os
from typing import Any

import yaml

from trellis.builders.experiments.rundir import (
    AGENT_CONFIG,
    COMMAND_LINE,
    CONFIG,
    EXPERIMENT,
    RUN_RECORD,
)
from trellis.launch.flags.values import UsageError

# A settings file's section that tune.py searches over (docs/tuning.md); run.py ignores it.
SEARCH = "search"
# What a resumed run may not change: the checkpoint holds this agent's state on this env.
FIXED_ON_RESUME = ("agent", "env")
# How this invocation was started, not a setting of the run: config and resume cannot be set
# from a file.
_COMMAND_LINE_ONLY = ("config", "resume")


def _load(path: str) -> dict[str, Any]:
    try:
        with open(path) as f:
            data = yaml.safe_load(f) if path.endswith((".yaml", ".yml")) else json.load(f)
    except (OSError, ValueError, yaml.YAMLError) as e:
        raise UsageError(f"cannot read settings from {path}: {type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else ''}") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path}: expected a mapping of settings, got {type(data).__name__}")
    return data


def read_search(path: str) -> dict[str, str]:
    """A settings file's `search` section, {name: "KIND:ARGS"} (tune.py's search space).

    Raises:
      UsageError: the file cannot be read, or the section is not such a mapping.
    """
    section = _load(path).get(SEARCH) or {}
    if not isinstance(section, dict) or not all(isinstance(v, str) for v in section.values()):
        raise UsageError(f"{path}: the {SEARCH} section must map setting names to specs "
                         "such as 'loguniform:1e-4:1e-2'")
    return section


def read_file(path: str) -> dict[str, Any]:
    """The settings in a JSON or YAML file, by name (sections of a config.json merged).

    A file is either flat ({"agent": "ppo", "clip_epsilon": 0.1}) or has config.json's
    sections (command_line, experiment, agent_config, and the ignored run record). Either
    may hold tune.py's `search` section, which is not a setting (`read_search`).

    Raises:
      UsageError: the file cannot be read or has neither form.
    """
    data = _load(path)
    data.pop(SEARCH, None)
    sections = (COMMAND_LINE, EXPERIMENT, AGENT_CONFIG)
    if not any(k in data for k in sections + (RUN_RECORD,)):
        return data
    extra = sorted(set(data) - set(sections) - {RUN_RECORD})
    if extra:
        raise UsageError(f"{path}: unknown section {extra[0]!r}; a sectioned settings file has "
                         f"{', '.join(sections)} (and {RUN_RECORD}, ignored)")
    flat: dict[str, Any] = {}
    for section in sections:
        values = data.get(section) or {}
        if not isinstance(values, dict):
            raise UsageError(f"{path}: section {section!r} must map setting names to values, "
                             f"got {type(values).__name__}")
        flat.update(values)
    return flat


def _saved(run_dir: str) -> dict[str, Any]:
    path = os.path.join(run_dir, CONFIG)
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise UsageError(f"cannot read the run's settings from {path}: "
                         f"{type(e).__name__}: {e}") from None
    if not isinstance(data, dict) or EXPERIMENT not in data or AGENT_CONFIG not in data:
        raise UsageError(f"{path} holds no saved settings (no {EXPERIMENT!r} and "
                         f"{AGENT_CONFIG!r} sections)")
    return read_file(path)


def base_settings(given: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """The settings the flags start from (the resumed run's, then the --config file's), and
    where each came from ("FILE: ")."""
    base: dict[str, Any] = {}
    origin: dict[str, str] = {}
    if given.get("resume") is not None:
        base.update(_saved(given["resume"]))
        origin.update(dict.fromkeys(base, f"{os.path.join(given['resume'], CONFIG)}: "))
        for name in FIXED_ON_RESUME:
            if name in given and given[name] != base.get(name):
                raise UsageError(f"--{name} cannot change on --resume (the run used "
                                 f"{base.get(name)!r})")
    if given.get("config") is not None:
        from_file = read_file(given["config"])
        base.update(from_file)
        origin.update(dict.fromkeys(from_file, f"{given['config']}: "))
    for name in _COMMAND_LINE_ONLY:
        if name in base:
            raise UsageError(f"{origin[name]}{name} can only be given on the command line")
    return base, origin
