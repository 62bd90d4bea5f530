"""DDPG (Lillicrap et al., 2016) for the command line (`--agent=ddpg`): TD3's builder with the
DDPG preset of its config (agents/td3/config.py); nothing of TD3 is copied."""

from trellis.agents.td3.builder import TD3Builder
from trellis.agents.td3.config import DDPGConfig

# The names agents/registry.py looks up.
Builder = TD3Builder
Config = DDPGConfig

__all__ = ["Builder", "Config", "DDPGConfig"]
