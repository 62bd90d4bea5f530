"""DQN (Mnih et al., 2015) with double Q-learning, a dueling head, n-step returns and
prioritized replay; Ape-X (Horgan et al., 2018) as a config. SEED-style central inference."""

from trellis.agents.dqn.builder import DQNBuilder
from trellis.agents.dqn.config import DQNConfig

# The names agents/registry.py looks up.
Builder = DQNBuilder
Config = DQNConfig

__all__ = ["Builder", "Config", "DQNBuilder", "DQNConfig"]
