"""PQN (Gallici et al., 2024): parallel Q-learning with Q(lambda) targets and layer norm, no
replay buffer and no target network."""

from trellis.agents.pqn.builder import PQNBuilder
from trellis.agents.pqn.config import PQNConfig

# The names agents/registry.py looks up.
Builder = PQNBuilder
Config = PQNConfig

__all__ = ["Builder", "Config", "PQNBuilder", "PQNConfig"]
