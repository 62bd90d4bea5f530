"""A2C (Mnih et al., 2016) as PPO with one gradient step per batch, for the command line
(`--agent=a2c`): PPO's builder with the preset of its config (agents/ppo/config.py's
A2CConfig, which says why); nothing of PPO is copied."""

from trellis.agents.ppo.builder import PPOBuilder
from trellis.agents.ppo.config import A2CConfig
from trellis.agents.presets import MINATAR

# The names agents/registry.py looks up (PRESETS: run.py's --preset, docs/presets.md).
Builder = PPOBuilder
Config = A2CConfig
PRESETS = {"minatar": MINATAR}

__all__ = ["PRESETS", "A2CConfig", "Builder", "Config"]
