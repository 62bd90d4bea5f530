"""TD3 (Fujimoto et al., 2018): clipped double Q, delayed policy updates and target policy
smoothing on DDPG, with uniform replay; SEED-style central inference. `--agent=ddpg` is its
preset with the three tricks off (agents/td3/ddpg.py)."""

from trellis.agents.td3.builder import TD3Builder
from trellis.agents.td3.config import TD3Config

# The names agents/registry.py looks up.
Builder = TD3Builder
Config = TD3Config

__all__ = ["Builder", "Config", "TD3Builder", "TD3Config"]
