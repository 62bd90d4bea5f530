"""DQN (Mnih et al., 2015) with Rainbow's parts as settings (double Q-learning, prioritized
replay, a dueling head, n-step returns, C51, noisy nets); Rainbow (Hessel et al., 2018) and
Ape-X (Horgan et al., 2018) as configs. SEED-style central inference."""

from trellis.agents.dqn.builder import DQNBuilder
from trellis.agents.dqn.config import DQN_MINATAR, DQNConfig, RainbowConfig

# The names agents/registry.py looks up (PRESETS: run.py's --preset, docs/presets.md).
Builder = DQNBuilder
Config = DQNConfig
PRESETS = {"minatar": DQN_MINATAR}

__all__ = ["PRESETS", "Builder", "Config", "DQNBuilder", "DQNConfig", "RainbowConfig"]
