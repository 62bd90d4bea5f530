"""PPO (Schulman et al., 2017) with GAE, SEED-style central inference."""

from trellis.agents.ppo.atari import PPO_ATARI
from trellis.agents.ppo.builder import PPOBuilder
from trellis.agents.ppo.config import DMC, MUJOCO, PLATFORM_DEFAULTS, PPOConfig
from trellis.agents.presets import MINATAR

# The names agents/registry.py looks up (PRESETS: run.py's --preset, docs/presets.md).
Builder = PPOBuilder
Config = PPOConfig
PRESETS = {"atari": PPO_ATARI, "mujoco": MUJOCO, "minatar": MINATAR, "dmc": DMC}

__all__ = ["PLATFORM_DEFAULTS", "PRESETS", "Builder", "Config", "PPOBuilder", "PPOConfig"]
