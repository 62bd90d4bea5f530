"""Rainbow (Hessel et al., 2018) for the command line (`--agent=rainbow`): DQN's builder with
all of Rainbow's parts on in its config (`RainbowConfig`); nothing of DQN is copied."""

from trellis.agents.dqn.builder import DQNBuilder
from trellis.agents.dqn.config import RAINBOW_MINATAR, RainbowConfig

# The names agents/registry.py looks up (PRESETS: run.py's --preset, docs/presets.md).
Builder = DQNBuilder
Config = RainbowConfig
PRESETS = {"minatar": RAINBOW_MINATAR}

__all__ = ["PRESETS", "Builder", "Config", "RainbowConfig"]
