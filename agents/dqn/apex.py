"""Ape-X (Horgan et al., 2018) for the command line (`--agent=apex`): DQN's builder with the
Ape-X preset of its config; nothing of DQN is copied."""

from agents.dqn.builder import DQNBuilder
from agents.dqn.config import ApexConfig

# The names agents/registry.py looks up.
Builder = DQNBuilder
Config = ApexConfig

__all__ = ["ApexConfig", "Builder", "Config"]
