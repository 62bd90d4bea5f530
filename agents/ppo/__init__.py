"""PPO (Schulman et al., 2017) with GAE, SEED-style central inference."""

from trellis.agents.ppo.builder import PPOBuilder
from trellis.agents.ppo.config import PLATFORM_DEFAULTS, PPOConfig

# The names agents/registry.py looks up.
Builder = PPOBuilder
Config = PPOConfig

__all__ = ["PLATFORM_DEFAULTS", "Builder", "Config", "PPOBuilder", "PPOConfig"]
