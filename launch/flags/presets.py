"""Presets: settings from a published source for an agent on a family of envs, offered by the
agent's package (`PRESETS`: {name: {setting: value}}; docs/atari.md)."""

from __future__ import annotations

from typing import Any

from trellis.agents.registry import AGENTS, agent_module
from trellis.launch.flags.values import UsageError

# The presets an agent may offer, each a set of settings from a published source for a family
# of envs.
PRESET_NAMES = ("atari",)


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
