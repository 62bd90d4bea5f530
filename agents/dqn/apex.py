"""Ape-X (Horgan et al., 2018) for the command line (`--agent=apex`): DQN's builder with the
Ape-X preset of its config; nothing of DQN is copied."""

from trellis.agents.dqn.builder import DQNBuilder
from trellis.agents.dqn.config import ApexConfig

# The names agents/registry.py looks up.
Builder = DQNBuilder
Config = ApexConfig

__all__ = ["ApexConfig", "Builder", "Config"]
