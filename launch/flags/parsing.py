"""Parsing and validation: a command line (with its `--config` file or `--resume` run, the
agent's platform defaults and presets) into validated `RunSettings`; unknown settings named
with the agents that have them or the closest spelling; the env checked against the platform.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from typing import Any

from trellis.agents.registry import AGENTS, agent_module, agent_names
from trellis.builders.contract.config import ConfigError, ExperimentConfig, Setting, settings
from trellis.builders.experiments.pbt import PBTConfig
from trellis.builders.experiments.platforms import ANAKIN
from trellis.envs import UnknownEnvError
from trellis.envs.atari import is_atari_factory
from trellis.launch.flags.env_options import env_factory
from trellis.launch.flags.platform_choice import chosen_platform, given_options
from trellis.launch.flags.presets import ATARI, preset_settings, resolve_preset
from trellis.launch.flags.run_settings import (
    AtariConfig,
    RunOptions,
    RunSettings,
    agent_requirement,
)
from trellis.launch.flags.table import flag_parser, given_flags
from trellis.launch.flags.values import AUTO, UsageError, quoted


def _classes(agent_config: type) -> tuple[type, ...]:
    return RunOptions, ExperimentConfig, agent_config, PBTConfig, AtariConfig


def _settings_by_name(agent_config: type) -> dict[str, Setting]:
    return {s.name: s for cls in _classes(agent_config) for s in settings(cls)}


def _owners(name: str) -> list[str]:
    """The registered agents whose config has a field `name`."""
    return [agent for agent in sorted(AGENTS)
            if any(s.name == name for s in settings(agent_module(agent).Config))]


def _unknown(name: str, agent: str, known: Iterable[str], origin: str) -> UsageError:
    """The error for a setting `name` that the agent's settings lack; `origin` is "--" for a
    flag, "FILE: " for a settings file."""
    spelled = "--" if origin == "--" else ""
    owners = _owners(name)
    if owners:
        return UsageError(f"{origin}{name} is a setting of {', '.join(owners)}, not of {agent} "
                          f"(--agent={owners[0]} to use it)")
    close = difflib.get_close_matches(name, list(known), n=3)
    hint = f"; did you mean {', '.join(spelled + c for c in close)}?" if close else ""
    return UsageError(f"{origin}{name} is not a setting of --agent={agent}{hint} "
                      f"(--agent={agent} --help lists them)")


def _flag_name(token: str) -> str:
    return token.split("=", 1)[0].lstrip("-")


def _build(values: dict[str, Any], origin: dict[str, str], agent_config: type) -> RunSettings:
    """The three configs from values by name; a ConfigError names where the value came from."""
    if values.get("stop_at_return") == AUTO:
        values["stop_at_return"] = env_factory(
            values["env"], values.get("env_kwargs"), values.get("env_wrappers")).reward_threshold()
    try:
        built = [cls(**{s.name: values[s.name] for s in settings(cls) if s.name in values})
                 for cls in _classes(agent_config)]
    except ConfigError as e:
        where = origin.get(e.field, "")
        shown = quoted(e.value) if where == "--" else repr(e.value)
        allowed = e.requirement.replace(" or None", " or none") if where == "--" else (
            e.requirement)
        raise UsageError(f"{where}{e.field} must be {allowed}, got {shown}") from None
    return RunSettings(*built)


def parse(argv: Sequence[str], prog: str = "run.py", description: str = "",
          defaults: dict[str, Any] | None = None) -> RunSettings:
    """The run's settings: defaults, then the --resume run's or the --config file's, then flags.

    Args:
      argv: the command line's arguments (without the program).
      prog: the program's name in help and errors.
      description: the first line of --help.
      defaults: settings whose defaults differ for this command line (tune.py's platform);
        the agent's `PLATFORM_DEFAULTS` for the platform lie below them.

    Returns:
      The validated settings; with --resume, `options.logdir` is the resumed run's directory.

    Raises:
      UsageError: bad input, one line naming the setting and what is allowed.
      SystemExit: after printing --help.
    """
    given, base, origin = given_options(argv, prog)
    agent = given.get("agent", base.get("agent", RunOptions.agent))
    if agent not in agent_names():
        if "agent" in given:
            raise UsageError(f"--agent must be {agent_requirement()}, got {agent!r}")
        # A saved name no agent here has: most likely an agent object's, registered by the
        # process that trained it (trellis.train).
        raise UsageError(f"{origin.get('agent', '--')}agent must be {agent_requirement()}, got "
                         f"{agent!r} (an agent object's run: give the object, "
                         f"trellis.load(run_dir, agent=OBJECT))")
    agent_config = agent_module(agent).Config
    known = _settings_by_name(agent_config)
    # Below everything given: the agent's own defaults for the platform (e.g. PPO on anakin),
    # then its preset's (the env family's unless one is named), which --help shows too.
    platform = chosen_platform(given, base, defaults)
    preset = resolve_preset(agent, given.get("env", base.get("env", RunOptions.env)),
                            given.get("preset", base.get("preset", RunOptions.preset)))
    defaults = {**getattr(agent_module(agent), "PLATFORM_DEFAULTS", {}).get(platform, {}),
                **preset_settings(agent, preset), **(defaults or {})}

    titles = ("command line", "experiment (ExperimentConfig)",
              f"agent {agent} ({agent_config.__name__})",
              "population-based training (PBTConfig: tune.py --scheduler=pbt, run.py --pbt)",
              "Atari envs (AtariConfig: ALE/NAME-v5, envpool:NAME-v5; docs/atari.md)")
    parser = flag_parser(prog, description,
                         list(zip(titles, _classes(agent_config), strict=True)),
                         defaults=defaults)
    given, extra = given_flags(parser, argv, known)
    if extra:
        raise _unknown(_flag_name(extra[0]), agent, known, "--")
    for name in base:
        if name not in known:
            raise _unknown(name, agent, known, origin[name])
    if given.get("resume") is not None:
        given["logdir"] = given["resume"]
    origin.update(dict.fromkeys(given, "--"))
    values = {"env": RunOptions.env, "stop_at_return": AUTO, **defaults, **base, **given,
              "preset": preset}  # The one that applied: config.json records it.
    _check_env(values, platform)
    run = _build(values, origin, agent_config)
    run.population_hparams()  # Its errors here, before anything starts.
    return run


def _check_env(values: dict[str, Any], platform: str) -> None:
    """Checks the env the settings `values` name: that it exists, takes its options and its
    Atari settings, and runs on `platform`.

    Raises:
      UsageError: it does not; one line saying what would.
    """
    try:
        factory = env_factory(values["env"], values.get("env_kwargs"), values.get("env_wrappers"))
        factory.validate()
    except UnknownEnvError as e:
        raise UsageError(str(e)) from None
    atari = sorted(s.name for s in settings(AtariConfig) if values.get(s.name) is not None)
    if atari and not is_atari_factory(factory):
        what = (f"--preset={ATARI} is" if values.get("preset") == ATARI
                else f"the Atari settings ({', '.join(atari)}) are")
        raise UsageError(f"{what} for Atari envs (ALE/NAME-v5, envpool:NAME-v5), not "
                         f"--env={values['env']}")
    if factory.jax_native and platform != ANAKIN:
        raise UsageError(f"--env={values['env']} is written in JAX: it runs with "
                         f"--platform={ANAKIN}, not {platform}")
    if platform == ANAKIN and not factory.jax_native:
        raise UsageError(f"--platform={ANAKIN} needs an env written in JAX, e.g. "
                         f"--env=gymnax:CartPole-v1; {values['env']!r} is a Gymnasium id")


def parse_groups(argv: Sequence[str], prog: str,
                 groups: Sequence[tuple[str, type]]) -> tuple[list[Any], list[str]]:
    """Another command line's own settings (e.g. tune.py's), flags generated from `groups`
    of (title, Config class) as for run.py's: the built configs, and the arguments left for
    `parse`. With --help, prints these groups' flags first (`parse` prints the rest).

    Raises:
      UsageError: a value of these settings is bad; one line naming it.
    """
    known = {s.name: s for _, cls in groups for s in settings(cls)}
    parser = flag_parser(prog, "", groups, add_help=False)
    if "-h" in argv or "--help" in argv:
        print(parser.format_help().split("\n\n", 1)[1])  # Without the usage lines.
    given, rest = given_flags(parser, argv, known)
    try:
        built = [cls(**{s.name: given[s.name] for s in settings(cls) if s.name in given})
                 for _, cls in groups]
    except ConfigError as e:
        raise UsageError(f"--{e.field} must be {e.requirement.replace(' or None', ' or none')}"
                         f", got {quoted(e.value)}") from None
    return built, rest


def load_run(run_dir: str) -> RunSettings:
    """The settings a run directory's config.json saved (no flags, no defaults re-parsed).

    Raises:
      UsageError: the file is missing, unreadable or holds invalid settings.
    """
    return parse([f"--resume={run_dir}"])
