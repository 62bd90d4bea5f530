"""Agent names for the command line: each maps to a package exporting `Builder` and `Config`.

Adding an agent is one line here; `launch/` needs no change. An agent object of one's own (a
builder of any kind: docs/your_own_agent.md) is registered in the running process under a name
of its own (`register`: `trellis.train(agent=OBJECT)` does it, launch/api.py), as an env object
is (envs.register).
"""

from __future__ import annotations

import dataclasses
import importlib
import types
from typing import Any

AGENTS = {
    "a2c": "trellis.agents.ppo.a2c",
    "alphazero": "trellis.agents.alphazero",
    "apex": "trellis.agents.dqn.apex",
    "appo": "trellis.agents.ppo.appo",
    "d4pg": "trellis.agents.d4pg",
    "ddpg": "trellis.agents.td3.ddpg",
    "dqn": "trellis.agents.dqn",
    "es": "trellis.agents.es",
    "iimpala": "trellis.agents.impala.iimpala",
    "impala": "trellis.agents.impala",
    "ippo": "trellis.agents.ppo.ippo",
    "mappo": "trellis.agents.ppo.mappo",
    "muzero": "trellis.agents.muzero",
    "mpo": "trellis.agents.mpo",
    "ppo": "trellis.agents.ppo",
    "pqn": "trellis.agents.pqn",
    "qmix": "trellis.agents.qmix",
    "r2d2": "trellis.agents.r2d2",
    "rainbow": "trellis.agents.dqn.rainbow",
    "sac": "trellis.agents.sac",
    "td3": "trellis.agents.td3",
    "vdn": "trellis.agents.qmix.vdn",
}


# The agent objects registered in this process, by name: each as an agent's package would be
# (`Builder`, `Config`).
_REGISTERED: dict[str, types.SimpleNamespace] = {}


def agent_names() -> list[str]:
    """The agents a run may name, sorted: Trellis's and those registered in this process."""
    return sorted({*AGENTS, *_REGISTERED})


def register(name: str, agent: Any) -> None:
    """Registers the agent object `agent` (a builder whose `config` is a dataclass on
    builders.contract.config.Config) under `name` in this process: `agent_module(name)` then
    gives `Config`, its config's class, and `Builder`, which gives `agent` itself for its own
    config (a run of an object trains it as it was made). Registering a name again replaces it.

    Raises:
      ValueError: `name` is one of Trellis's agents.
    """
    if name in AGENTS:
        raise ValueError(f"an agent object cannot be registered as {name!r}, the name of "
                         f"Trellis's own {name}; name its class otherwise")
    _REGISTERED[name] = types.SimpleNamespace(Builder=_as_made(name, agent),
                                              Config=type(agent.config))


def _as_made(name: str, agent: Any) -> Any:
    """`Builder` of a registered agent object: the object, for the config it was made with."""

    def builder(config: Any) -> Any:
        if config != agent.config:
            differ = [f.name for f in dataclasses.fields(config)
                      if getattr(config, f.name) != getattr(agent.config, f.name)]
            raise ValueError(f"agent {name} runs with the config it was made with, and these "
                             f"settings differ from it: {', '.join(differ)} (set them in its "
                             f"config, {type(config).__name__}(...))")
        return agent

    return builder


def agent_module(name: str) -> Any:
    """The agent's package (with `Builder` and `Config`, and `PLATFORM_DEFAULTS` where some
    platform changes its defaults), or a registered agent object's (`register`).

    Raises:
      ValueError: unknown agent, naming the valid ones.
    """
    if name in _REGISTERED:
        return _REGISTERED[name]
    if name not in AGENTS:
        raise ValueError(f"unknown agent {name!r}; choose one of: {', '.join(agent_names())}")
    return importlib.import_module(AGENTS[name])
