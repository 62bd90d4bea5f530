"""TD3 (Fujimoto et al., 2018): clipped double Q, delayed policy updates and target policy
smoothing on DDPG, with uniform replay; SEED-style central inference. `--agent=ddpg` is its
preset with the three tricks off (agents/td3/ddpg.py)."""

from trellis.agents.td3.builder import TD3Builder
from trellis.agents.td3.config import MUJOCO, TD3Config

# The names agents/registry.py looks up (PRESETS: run.py's --preset, docs/presets.md).
Builder = TD3Builder
Config = TD3Config
PRESETS = {"mujoco": MUJOCO}

__all__ = ["PRESETS", "Builder", "Config", "TD3Builder", "TD3Config"]
