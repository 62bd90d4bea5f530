"""SAC (Haarnoja et al., 2018): twin critics, Polyak-averaged targets, a learned temperature
and a tanh-squashed Gaussian policy, with uniform replay. SEED-style central inference."""

from trellis.agents.sac.builder import SACBuilder
from trellis.agents.sac.config import SACConfig

# The names agents/registry.py looks up.
Builder = SACBuilder
Config = SACConfig

__all__ = ["Builder", "Config", "SACBuilder", "SACConfig"]
