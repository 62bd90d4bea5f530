"""Presets by env family: settings from a published source for an agent on a family of envs,
offered by the agent's package (`PRESETS`: {name: `agents.presets.Preset`}), chosen by
the env's family unless --preset names one (docs/presets.md, docs/atari.md).

`--preset=auto` (the default) takes the env family's preset where the agent has one (MuJoCo's
for SAC on HalfCheetah-v5, the Atari one for IMPALA on ALE/Pong-v5), else none; the preset that
applied is what config.json records, so a resumed run keeps it. `--preset=none` turns it off.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import gymnasium as gym

from trellis.agents.presets import Preset
from trellis.agents.registry import AGENTS, agent_module
from trellis.envs import UnknownEnvError, make_env_factory
from trellis.envs.atari import is_atari_factory
from trellis.envs.gymnax_envs import PREFIX as GYMNAX_PREFIX
from trellis.envs.minatar_envs import PREFIX as MINATAR_PREFIX
from trellis.envs.pgx_envs import PREFIX as PGX_PREFIX
from trellis.envs.playground_envs import is_dm_control
from trellis.launch.flags.values import AUTO, UsageError, shown

ATARI, CLASSIC = "atari", "classic"
# The env families with a preset, and an id of each (for --list_presets).
FAMILIES = {
    ATARI: "ALE/Pong-v5, envpool:Pong-v5 (Atari games: ALE's and envpool's)",
    "mujoco": "HalfCheetah-v5, Hopper-v5, Walker2d-v5, Ant-v5, Humanoid-v5 (Gymnasium's MuJoCo "
              "envs)",
    "minatar": "minatar:Breakout, gymnax:Breakout-MinAtar (MinAtar's 10 x 10 games)",
    "dmc": "playground:CartpoleBalance, playground:HumanoidWalk (Playground's DeepMind Control "
           "Suite tasks)",
    CLASSIC: "CartPole-v1, Pendulum-v1, gymnax:CartPole-v1 (Gymnasium's classic control: every "
             "agent's own defaults, tuned there)",
    # A pgx game is a family of its own: what a game needs differs from game to game.
    "tic_tac_toe": "pgx:tic_tac_toe (pgx's tic-tac-toe)",
    "connect_four": "pgx:connect_four (pgx's connect four)",
}
PRESET_NAMES = (AUTO, *FAMILIES)
# Gymnasium's entry-point packages of the families found through its registry.
_GYMNASIUM_FAMILIES = {"gymnasium.envs.mujoco": "mujoco",
                       "gymnasium.envs.classic_control": CLASSIC}
# What --list_presets and docs/presets.md say of the classic preset: no settings of its own.
CLASSIC_SOURCE = "the agent's own defaults (agents/NAME/config.py), tuned on CartPole-v1 or " \
    "Pendulum-v1"


def _gymnasium_family(env_id: str) -> str | None:
    """The family of a Gymnasium id by its registered entry point; None if unregistered."""
    try:
        entry_point = gym.spec(env_id).entry_point
    except gym.error.Error:
        return None
    if not isinstance(entry_point, str):
        return None
    return next((family for package, family in _GYMNASIUM_FAMILIES.items()
                 if entry_point.startswith(package)), None)


def env_family(env: str) -> str | None:
    """The family of env id `env` that has a preset (a key of `FAMILIES`), or None: an Atari
    game (ALE's or envpool's), a MinAtar game (MinAtar's or gymnax's), a Gymnasium MuJoCo or
    classic control env (gymnax's classic control too), a DeepMind Control Suite task of
    Playground, a pgx game that has presets (its own family). An id that names no env has none
    (the env's own check says what is wrong)."""
    if env.startswith(MINATAR_PREFIX) or (env.startswith(GYMNAX_PREFIX) and "MinAtar" in env):
        return "minatar"
    if env.startswith(GYMNAX_PREFIX):
        return _gymnasium_family(env.removeprefix(GYMNAX_PREFIX))
    if is_dm_control(env):
        return "dmc"
    if env.startswith(PGX_PREFIX):
        game = env.removeprefix(PGX_PREFIX)
        return game if game in FAMILIES else None
    try:
        factory = make_env_factory(env)
    except (UnknownEnvError, ValueError, ImportError):
        return None
    if is_atari_factory(factory):
        return ATARI
    return _gymnasium_family(env.rsplit(":", 1)[-1])


def agent_presets(agent: str) -> dict[str, Preset]:
    """The presets `agent` offers, by name; the classic one every agent has (no settings)."""
    offered = getattr(agent_module(agent), "PRESETS", {})
    return {CLASSIC: Preset(CLASSIC_SOURCE, {}), **offered}


def resolve_preset(agent: str, env: str, preset: str | None) -> str | None:
    """The preset that applies: `preset` itself unless it is "auto", which is the env's family's
    where `agent` has that preset, else None.

    Raises:
      UsageError: an unknown preset name.
    """
    if preset is not None and preset not in PRESET_NAMES:
        raise UsageError(f"--preset must be one of {', '.join(PRESET_NAMES)} or none, got "
                         f"{preset!r}")
    if preset != AUTO:
        return preset
    family = env_family(env)
    return family if family in agent_presets(agent) else None


def preset_settings(agent: str, preset: str | None) -> dict[str, Any]:
    """The settings of `agent`'s preset `preset` ({} for None).

    Raises:
      UsageError: an unknown preset, or one the agent does not have.
    """
    if preset is None:
        return {}
    if preset not in FAMILIES:
        raise UsageError(f"--preset must be one of {', '.join(PRESET_NAMES)} or none, got "
                         f"{preset!r}")
    presets = agent_presets(agent)
    if preset not in presets:
        having = [a for a in sorted(AGENTS) if preset in agent_presets(a)]
        raise UsageError(f"--agent={agent} has no --preset={preset}; the agents that have it: "
                         f"{', '.join(having)}")
    return dict(presets[preset])


@dataclasses.dataclass(frozen=True)
class PresetRow:
    """One setting of one agent's preset, with its published source (docs/presets.md)."""

    preset: str
    agent: str
    setting: str
    value: Any
    source: str


def preset_rows() -> list[PresetRow]:
    """Every setting of every agent's presets (the classic ones have none), by preset, agent
    and setting."""
    return [PresetRow(name, agent, setting, preset[setting], preset.source_of(setting))
            for name in FAMILIES for agent in sorted(AGENTS)
            for preset in [agent_presets(agent).get(name)] if preset is not None
            for setting in preset]


def preset_table() -> str:
    """docs/presets.md's table of every preset setting with its source (markdown; the tests
    read it back and check that each preset resolves to it)."""
    lines = ["| preset | agent | setting | value | source |", "|---|---|---|---|---|"]
    lines += [f"| {r.preset} | {r.agent} | {r.setting} | {shown(r.value)} | {r.source} |"
              for r in preset_rows()]
    return "\n".join(lines) + "\n"


def preset_line(agent: str, preset: str | None) -> str | None:
    """The line a run prints at its start where a preset with settings applies (None
    otherwise): which, how many settings, where they are listed, how to override or drop them."""
    settings = agent_presets(agent).get(preset) if preset is not None else None
    if not settings:
        return None
    count = f"{len(settings)} setting{'s' if len(settings) > 1 else ''}"
    return (f"preset {preset}: {count} of --agent={agent} (each with its "
            f"source: docs/presets.md); flags given override them, --preset=none drops them")


def list_presets() -> str:
    """What `run.py --list_presets` prints: the env families, the preset of each and the agents
    that have it, each with its source; docs/presets.md has every setting."""
    lines = ["Presets by env family (--preset=auto picks the env's; --preset=none turns it off; "
             "every setting: docs/presets.md):"]
    for name, envs in FAMILIES.items():
        lines.append(f"\n{name}: {envs}")
        for agent in sorted(AGENTS):
            preset = agent_presets(agent).get(name)
            if preset is not None and (preset or name != CLASSIC):
                lines.append(f"  --agent={agent}: {len(preset)} settings from {preset.source}")
        if name == CLASSIC:
            lines.append(f"  every agent: {CLASSIC_SOURCE}")
    return "\n".join(lines)
