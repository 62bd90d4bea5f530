"""Command-line settings generated from the config dataclasses (docs/configuration.md).

One flat namespace of `--field_name=value` flags: the command line's own options
(`RunOptions`), the experiment's (`builders.contract.config.ExperimentConfig`) and the chosen
agent's config (`--agent=X`). Every field is a flag, with its declared default, one-line help and
bounds; no flag is written by hand. A settings file (`--config=FILE`, JSON or YAML; a run
directory's config.json too) sets any of them and flags override it; `--resume=RUN_DIR`
starts from the run's saved settings instead. Bad input raises `UsageError`, one line naming
the setting and what is allowed.

Only light imports here: run.py imports this module at its top level, which every node
process of local_mp re-runs (multiprocessing's preparation), and env workers must not load
JAX. Agent packages (which import JAX) are imported by name when a command line is parsed.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import os
import re
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import yaml

from trellis.agents.registry import AGENTS, agent_module
from trellis.builders.contract.config import (
    Config,
    ConfigError,
    ExperimentConfig,
    Setting,
    setting,
    settings,
)
from trellis.builders.experiments.pbt import Dimension, PBTConfig, PopulationPBT
from trellis.builders.experiments.platforms import ANAKIN, HostPlatform, PopulationSettings
from trellis.builders.experiments.rundir import (
    AGENT_CONFIG,
    COMMAND_LINE,
    CONFIG,
    EXPERIMENT,
    RUN_RECORD,
)
from trellis.envs import EnvFactory, UnknownEnvError, make_env_factory
from trellis.envs.atari import is_atari_factory
from trellis.envs.atari import with_settings as with_atari_settings
from trellis.envs.options import KWARGS_FAMILIES, with_env_options
from trellis.launch.runtime import PLATFORMS
from trellis.reverb_tables import reverb_available

# stop_at_return's command-line value for the env's Gymnasium reward_threshold; resolved here
# (the library's ExperimentConfig knows no env, so its default is None: no target).
AUTO = "auto"
# What a resumed run may not change: the checkpoint holds this agent's state on this env.
FIXED_ON_RESUME = ("agent", "env")
# How this invocation was started, not a setting of the run: not saved in config.json (the run
# directory is where the file lies); config and resume cannot be set from a file.
_NOT_SAVED = ("config", "resume", "logdir")
_COMMAND_LINE_ONLY = ("config", "resume")
_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no")
# A settings file's section that tune.py searches over (docs/tuning.md); run.py ignores it.
SEARCH = "search"
# The presets an agent may offer (`PRESETS` of its package: {name: {setting: value}}), each a
# set of settings from a published source for a family of envs (docs/atari.md).
PRESET_NAMES = ("atari",)


@dataclasses.dataclass(frozen=True)
class RunOptions(Config):
    """The command line's own options (neither the experiment's nor the agent's)."""

    agent: str = setting("impala", "the agent to train", choices=sorted(AGENTS))
    env: str = setting(
        "CartPole-v1", "the env's id: a Gymnasium id (MODULE:ID imports MODULE first, in every "
        "process), or a family's, e.g. gymnax:CartPole-v1")
    env_kwargs: str | None = setting(
        None, "keyword arguments of the env: a JSON object or KEY=VALUE,... (each VALUE read as "
        f"JSON where it parses, else as a string), for {KWARGS_FAMILIES}")
    env_wrappers: tuple[str, ...] | None = setting(
        None, "Gymnasium envs: MODULE:NAME,... of callables that take an env and return one, "
        "applied in order to every env, in every process")
    platform: str = setting(
        "local_mp", "where the nodes run: threads, local processes or Ray; anakin: one jitted "
        "program for JAX envs (docs/anakin.md)", choices=(*PLATFORMS, ANAKIN))
    ray_address: str | None = setting(
        None, "--platform=ray: 'auto' or HOST:PORT joins a running Ray cluster; none starts a "
        "local Ray instance for this run (docs/cluster.md)")
    logdir: str | None = setting(
        None, "run directory, not one holding a run (--resume continues those); none: "
        "runs/AGENT-ENV-TIME")
    quiet: bool = setting(False, "no progress output")
    preset: str | None = setting(
        None, "a published source's settings for the agent on a family of envs (atari: "
        "docs/atari.md); settings given in a --config file or as flags override them",
        choices=PRESET_NAMES)
    no_compile_cache: bool = setting(
        False, "compile every jitted program afresh instead of using JAX's persistent "
        "compilation cache, kept beside the run directory (runs/.jax_cache)")
    config: str | None = setting(
        None, "a JSON or YAML file of settings (a run's config.json too); flags override it")
    resume: str | None = setting(
        None, "continue the run in this directory from its newest checkpoint, with its "
        "settings (flags given here override them, except agent and env)")
    # The anakin platform's population (docs/anakin.md).
    num_seeds: int = setting(
        1, "anakin: members trained in one program, each with its own params, optimizer "
        "state, envs and RNG", ge=1)
    member_hparams: str | None = setting(
        None, "anakin: the members' hyper-parameters, NAME=V1,V2,... (one value per member, "
        "or one for all) or NAME=LOW:HIGH (log-uniform per member), several joined by ';', "
        "e.g. learning_rate=1e-3:1e-2;entropy_cost=0.01")
    updates_per_call: int = setting(
        32, "anakin: updates per compiled call; between calls the host logs, checkpoints and "
        "checks the stop rule", ge=1)
    pbt: bool = setting(
        False, "anakin: population-based training of the members inside the program, "
        "perturbing the --member_hparams (the --pbt_* settings; docs/anakin.md)")

    def check(self) -> None:
        if self.ray_address is not None and self.platform != "ray":
            raise self.invalid("ray_address", "none unless --platform=ray")
        if self.platform != ANAKIN:
            if self.num_seeds != 1:
                raise self.invalid("num_seeds", "1 unless --platform=anakin")
            if self.member_hparams is not None:
                raise self.invalid("member_hparams", "none unless --platform=anakin")
            if self.pbt:
                raise self.invalid("pbt", f"false unless --platform={ANAKIN} (PBT of host "
                                   "platforms' runs: launch/tune.py --scheduler=pbt)")
        if self.pbt and self.num_seeds < 2:
            raise self.invalid("num_seeds", "at least 2 with --pbt")
        if self.pbt and self.member_hparams is None:
            raise self.invalid("member_hparams", "the hyper-parameters that --pbt perturbs, "
                               "e.g. learning_rate=1e-5:1e-1")


@dataclasses.dataclass(frozen=True)
class AtariConfig(Config):
    """The frame handling of Atari envs (ALE/NAME-v5 or envpool:NAME-v5 ids; envs/atari.py);
    each left at None keeps the env id's own. Rewards are clipped by the agents' learners
    (their reward_clip), so the returns a run reports are the game's score."""

    episodic_life: bool | None = setting(
        None, "Atari: a lost life ends an episode (the game goes on; returns are then per "
        "life); none: the id's own (off)")
    frame_skip: int | None = setting(
        None, "Atari: frames each action repeats (the last two max-pooled); none: 4", ge=1)
    frame_stack: int | None = setting(
        None, "Atari: frames stacked in an observation; none: 4", ge=1)
    frame_size: int | None = setting(
        None, "Atari: the grey frames' side in pixels; none: 84", ge=8)
    noop_max: int | None = setting(
        None, "Atari: at most this many no-op actions start each game; none: 30", ge=0)
    repeat_action_probability: float | None = setting(
        None, "Atari: sticky actions, the probability of repeating the previous action; "
        "none: the id's own (0.25 for ALE/*-v5, 0 for envpool:*)", ge=0, le=1)
    full_action_space: bool | None = setting(
        None, "Atari: all 18 actions instead of the game's minimal set; none: off")

    def given(self) -> dict[str, Any]:
        """The settings that are not None, by name."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """Everything a run is built from: the validated configs."""

    options: RunOptions
    experiment: ExperimentConfig
    agent: Any  # The agent's Config.
    pbt: PBTConfig = PBTConfig()  # Used with --pbt (anakin); tune.py's PBT reads it too.
    atari: AtariConfig = AtariConfig()

    def build(self) -> tuple[Any, Any]:
        """(the agent's builder, the env factory) these settings name.

        Raises:
          ValueError: the settings need what this installation lacks (dm-reverb).
        """
        if self.experiment.replay_backend == "reverb" and not reverb_available():
            raise ValueError("--replay_backend=reverb needs dm-reverb, which is not installed "
                             "here (`make test-reverb` builds .venv-reverb with it); use native")
        builder = agent_module(self.options.agent).Builder(self.agent)
        o = self.options
        return builder, with_atari_settings(env_factory(o.env, o.env_kwargs, o.env_wrappers),
                                            self.atari.given())

    def platform(self) -> HostPlatform | PopulationSettings:
        """The platform's typed settings: a program graph's, or anakin's population."""
        o = self.options
        if o.platform == ANAKIN:
            return PopulationSettings(o.num_seeds, self.population_hparams(), o.updates_per_call,
                                      self.population_pbt())
        return HostPlatform(o.platform, o.ray_address if o.platform == "ray" else None)

    def population_hparams(self) -> dict[str, list[float]]:
        """The anakin members' hyper-parameters, {name: one value per member}."""
        return member_hparams(self.options.member_hparams, self.options.num_seeds,
                              self.experiment.seed)

    def population_pbt(self) -> PopulationPBT | None:
        """With --pbt, its settings and what it resamples each --member_hparams name from."""
        if not self.options.pbt:
            return None
        return PopulationPBT(self.pbt, member_search(self.options.member_hparams))

    def saved_options(self) -> dict[str, Any]:
        """The options config.json records: all but those that say how this invocation was
        started (config, resume, logdir: the run directory is where the file lies); with
        --pbt, the --pbt_* settings too; the Atari settings that are not None."""
        saved = {k: v for k, v in dataclasses.asdict(self.options).items() if k not in _NOT_SAVED}
        saved.update(self.atari.given())
        return {**saved, **dataclasses.asdict(self.pbt)} if self.options.pbt else saved


class UsageError(Exception):
    """Bad command-line or settings-file input: one line for the user, exit code 2."""


class _Parser(argparse.ArgumentParser):
    """argparse without its own exit on errors: they become UsageError."""

    def error(self, message: str):
        raise UsageError(message)


def _classes(agent_config: type) -> tuple[type, ...]:
    return RunOptions, ExperimentConfig, agent_config, PBTConfig, AtariConfig


def _settings_by_name(agent_config: type) -> dict[str, Setting]:
    return {s.name: s for cls in _classes(agent_config) for s in settings(cls)}


def _requirement(s: Setting) -> str:
    """What the command line allows for `s`, in its own spelling (none, auto)."""
    text = s.requirement().replace(" or None", " or none")
    return text.replace(" or none", ", none or auto") if s.name == "stop_at_return" else text


def _metavar(s: Setting) -> str:
    if s.declaration.choices is not None:
        return "{" + ",".join(str(c) for c in s.declaration.choices) + "}"
    return {int: "INT", float: "FLOAT", bool: "BOOL", str: "STR"}[s.kind] + (
        ",..." if s.sequence else "")


def _quoted(value: Any) -> str:
    """A value for an error message: numbers as they are, anything else quoted."""
    plain = isinstance(value, (int, float)) and not isinstance(value, bool)
    return _shown(value) if plain else repr(_shown(value))


def _shown(value: Any) -> str:
    """A value as it is written on the command line."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple):
        return ",".join(_shown(v) for v in value)
    return str(value)


def _parser(prog: str, description: str, groups: Sequence[tuple[str, type]],
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
            default = AUTO if s.name == "stop_at_return" else _shown(
                (defaults or {}).get(s.name, s.default))
            group.add_argument(
                f"--{s.name}", default=argparse.SUPPRESS, metavar=_metavar(s),
                nargs="?" if s.kind is bool and not s.sequence else None,
                const="true" if s.kind is bool else None,
                help=f"{s.help} (default: {default}; {_requirement(s)})".replace("%", "%%"))
    return parser


def _given(parser: argparse.ArgumentParser, argv: Sequence[str],
           known: dict[str, Setting]) -> tuple[dict[str, Any], list[str]]:
    """The flags of `parser` given in `argv`, as values; and the arguments it does not know."""
    flags, extra = parser.parse_known_args(argv)
    return {name: from_text(known[name], text) for name, text in vars(flags).items()}, extra


def from_text(s: Setting, text: str) -> Any:
    """A setting's value from its command-line text.

    Raises:
      UsageError: the text is not a value of the setting's type.
    """
    if s.optional and text.lower() == "none":
        return None
    if s.name == "stop_at_return" and text == AUTO:  # Resolved once the env is known.
        return AUTO
    if s.sequence:
        return tuple(_scalar(s, item.strip()) for item in text.split(",") if item.strip())
    return _scalar(s, text)


def _scalar(s: Setting, text: str) -> Any:
    try:
        if s.kind is bool:
            if text.lower() not in _TRUE + _FALSE:
                raise ValueError(text)
            return text.lower() in _TRUE
        return s.kind(text)
    except ValueError:
        raise UsageError(f"--{s.name} must be {_requirement(s)}, got {text!r}") from None


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


def member_search(text: str | None) -> dict[str, Dimension]:
    """`--member_hparams` as {name: Dimension}: LOW:HIGH a loguniform range, V1,V2,... a
    choice of the values (what the members are given, and what --pbt resamples from).

    Raises:
      UsageError: the text is not of that form.
    """
    out: dict[str, Dimension] = {}
    for item in filter(None, (part.strip() for part in (text or "").split(";"))):
        name, _, values = (x.strip() for x in item.partition("="))
        try:
            if ":" in values:
                low, high = (float(x) for x in values.split(":"))
                if not 0 < low <= high:
                    raise ValueError
                out[name] = Dimension("loguniform", (low, high))
            else:
                out[name] = Dimension("choice", tuple(float(x) for x in values.split(",")))
        except ValueError:
            raise UsageError(f"--member_hparams: {item!r} must be NAME=V1,V2,... or "
                             "NAME=LOW:HIGH with 0 < LOW <= HIGH") from None
        if not name.isidentifier():
            raise UsageError(f"--member_hparams: {item!r} must start with a setting's name")
    return out


def member_hparams(text: str | None, num_seeds: int, seed: int) -> dict[str, list[float]]:
    """`--member_hparams` as {name: num_seeds values}: a list of one value per member (or one
    for all), or LOW:HIGH drawn log-uniformly per member from a generator seeded by `seed`.

    Raises:
      UsageError: the text is not of that form, or a list has neither 1 nor num_seeds values.
    """
    rng = np.random.default_rng([seed, 0x4A4B])  # Its own stream: not the run's other draws.
    out: dict[str, list[float]] = {}
    for name, dimension in member_search(text).items():
        if dimension.kind == "loguniform":
            low, high = dimension.values
            out[name] = np.exp(rng.uniform(np.log(low), np.log(high), num_seeds)).tolist()
            continue
        given = list(dimension.values)
        if len(given) not in (1, num_seeds):
            raise UsageError(f"--member_hparams: {name} has {len(given)} values; give "
                             f"1 or --num_seeds={num_seeds}")
        out[name] = given * (num_seeds // len(given))
    return out


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
        shown = _quoted(e.value) if where == "--" else repr(e.value)
        requirement = e.requirement.replace(" or None", " or none") if where == "--" else (
            e.requirement)
        raise UsageError(f"{where}{e.field} must be {requirement}, got {shown}") from None
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
    given, base, origin = _options(argv, prog)
    agent = given.get("agent", base.get("agent", RunOptions.agent))
    if agent not in AGENTS:
        where = origin.get("agent", "--") if "agent" not in given else "--"
        agent_setting = next(s for s in settings(RunOptions) if s.name == "agent")
        raise UsageError(f"{where}agent must be {_requirement(agent_setting)}, got {agent!r}")
    agent_config = agent_module(agent).Config
    known = _settings_by_name(agent_config)
    # Below everything given: the agent's own defaults for the platform (e.g. PPO on anakin),
    # then its preset's, which --help shows too.
    platform = _platform(given, base, defaults)
    defaults = {**getattr(agent_module(agent), "PLATFORM_DEFAULTS", {}).get(platform, {}),
                **preset_settings(agent, given.get("preset", base.get("preset"))),
                **(defaults or {})}

    titles = ("command line", "experiment (ExperimentConfig)",
              f"agent {agent} ({agent_config.__name__})",
              "population-based training (PBTConfig: tune.py --scheduler=pbt, run.py --pbt)",
              "Atari envs (AtariConfig: ALE/NAME-v5, envpool:NAME-v5; docs/atari.md)")
    parser = _parser(prog, description, list(zip(titles, _classes(agent_config), strict=True)),
                     defaults=defaults)
    given, extra = _given(parser, argv, known)
    if extra:
        raise _unknown(_flag_name(extra[0]), agent, known, "--")
    for name in base:
        if name not in known:
            raise _unknown(name, agent, known, origin[name])
    if given.get("resume") is not None:
        given["logdir"] = given["resume"]
    origin.update(dict.fromkeys(given, "--"))
    values = {"env": RunOptions.env, "stop_at_return": AUTO, **defaults, **base, **given}
    try:
        factory = env_factory(values["env"], values.get("env_kwargs"), values.get("env_wrappers"))
        factory.validate()
    except UnknownEnvError as e:
        raise UsageError(str(e)) from None
    atari = sorted(s.name for s in settings(AtariConfig) if values.get(s.name) is not None)
    if atari and not is_atari_factory(factory):
        preset = values.get("preset")
        what = (f"--preset={preset} is" if preset is not None
                else f"the Atari settings ({', '.join(atari)}) are")
        raise UsageError(f"{what} for Atari envs (ALE/NAME-v5, envpool:NAME-v5), not "
                         f"--env={values['env']}")
    if factory.jax_native and platform != ANAKIN:
        raise UsageError(f"--env={values['env']} is written in JAX: it runs with "
                         f"--platform={ANAKIN}, not {platform}")
    if platform == ANAKIN and not factory.jax_native:
        raise UsageError(f"--platform={ANAKIN} needs an env written in JAX, e.g. "
                         f"--env=gymnax:CartPole-v1; {values['env']!r} is a Gymnasium id")
    run = _build(values, origin, agent_config)
    run.population_hparams()  # Its errors here, before anything starts.
    return run


def preset_settings(agent: str, preset: str | None) -> dict[str, Any]:
    """The settings of `agent`'s preset `preset` ({} for None).

    Raises:
      UsageError: an unknown preset, or one the agent does not have.
    """
    if preset is None:
        return {}
    if preset not in PRESET_NAMES:
        raise UsageError(f"--preset must be one of {', '.join(PRESET_NAMES)} or none, got "
                         f"{preset!r}")
    presets = getattr(agent_module(agent), "PRESETS", {})
    if preset not in presets:
        having = [a for a in sorted(AGENTS) if preset in getattr(agent_module(a), "PRESETS", {})]
        raise UsageError(f"--agent={agent} has no --preset={preset}; the agents that have it: "
                         f"{', '.join(having)}")
    return dict(presets[preset])


def platform_of(argv: Sequence[str]) -> str:
    """The platform `argv` names (on the command line, in its --config file or its --resume
    run), read before anything imports JAX; bad input is left for `parse` to report."""
    try:
        given, base, _ = _options(argv, "run.py")
    except UsageError:
        return RunOptions.platform
    return _platform(given, base)


def _platform(given: dict[str, Any], base: dict[str, Any],
              defaults: dict[str, Any] | None = None) -> str:
    """The platform the flags give, else the --config file or --resume run, else `defaults`'
    (tune.py's), else RunOptions'."""
    return given.get("platform", base.get("platform", (defaults or {}).get(
        "platform", RunOptions.platform)))


def _options(argv: Sequence[str], prog: str
             ) -> tuple[dict[str, Any], dict[str, Any], dict[str, str]]:
    """The command line's options given in `argv`, and `_base`'s settings and origins."""
    options = {s.name: s for s in settings(RunOptions)}
    given, _ = _given(_parser(prog, "", [("", RunOptions)], add_help=False), argv, options)
    return (given, *_base(given))


def _base(given: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
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


def parse_groups(argv: Sequence[str], prog: str,
                 groups: Sequence[tuple[str, type]]) -> tuple[list[Any], list[str]]:
    """Another command line's own settings (e.g. tune.py's), flags generated from `groups`
    of (title, Config class) as for run.py's: the built configs, and the arguments left for
    `parse`. With --help, prints these groups' flags first (`parse` prints the rest).

    Raises:
      UsageError: a value of these settings is bad; one line naming it.
    """
    known = {s.name: s for _, cls in groups for s in settings(cls)}
    parser = _parser(prog, "", groups, add_help=False)
    if "-h" in argv or "--help" in argv:
        print(parser.format_help().split("\n\n", 1)[1])  # Without the usage lines.
    given, rest = _given(parser, argv, known)
    try:
        built = [cls(**{s.name: given[s.name] for s in settings(cls) if s.name in given})
                 for _, cls in groups]
    except ConfigError as e:
        raise UsageError(f"--{e.field} must be {e.requirement.replace(' or None', ' or none')}"
                         f", got {_quoted(e.value)}") from None
    return built, rest


def load_run(run_dir: str) -> RunSettings:
    """The settings a run directory's config.json saved (no flags, no defaults re-parsed).

    Raises:
      UsageError: the file is missing, unreadable or holds invalid settings.
    """
    return parse([f"--resume={run_dir}"])
