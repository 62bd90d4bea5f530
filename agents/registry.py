"""Agent names for the command line: each maps to a package exporting `Builder` and `Config`.

Adding an agent is one line here; `launch/` needs no change.
"""

from __future__ import annotations

import importlib
from typing import Any

AGENTS = {
    "apex": "agents.dqn.apex",
    "dqn": "agents.dqn",
    "impala": "agents.impala",
    "ppo": "agents.ppo",
    "sac": "agents.sac",
}


def agent_module(name: str) -> Any:
    """The agent's package (with `Builder` and `Config`).

    Raises:
      ValueError: unknown agent, naming the valid ones.
    """
    if name not in AGENTS:
        raise ValueError(f"unknown agent {name!r}; choose one of: {', '.join(sorted(AGENTS))}")
    return importlib.import_module(AGENTS[name])
