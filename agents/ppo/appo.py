"""APPO (Petrenko et al., 2020, Sample Factory): PPO's clipped surrogate on V-trace
advantages, for the command line (`--agent=appo`): PPO's builder with the preset of its config
(agents/ppo/config.py's APPOConfig, which says why); nothing of PPO is copied."""

from trellis.agents.ppo.atari import APPO_ATARI
from trellis.agents.ppo.builder import PPOBuilder
from trellis.agents.ppo.config import APPOConfig
from trellis.agents.presets import MINATAR

# The names agents/registry.py looks up (PRESETS: run.py's --preset, docs/presets.md).
Builder = PPOBuilder
Config = APPOConfig
PRESETS = {"atari": APPO_ATARI, "minatar": MINATAR}

__all__ = ["PRESETS", "APPOConfig", "Builder", "Config"]
