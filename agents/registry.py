"""Agent names for the command line: each maps to a package exporting `Builder` and `Config`.

Adding an agent is one line here; `launch/` needs no change.
"""

from __future__ import annotations

import importlib
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


def agent_module(name: str) -> Any:
    """The agent's package (with `Builder` and `Config`, and `PLATFORM_DEFAULTS` where some
    platform changes its defaults).

    Raises:
      ValueError: unknown agent, naming the valid ones.
    """
    if name not in AGENTS:
        raise ValueError(f"unknown agent {name!r}; choose one of: {', '.join(sorted(AGENTS))}")
    return importlib.import_module(AGENTS[name])
