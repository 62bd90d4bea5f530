"""SAC (Haarnoja et al., 2018): twin critics, Polyak-averaged targets, a learned temperature
and a tanh-squashed Gaussian policy, with uniform replay. SEED-style central inference."""

from trellis.agents.sac.builder import SACBuilder
from trellis.agents.sac.config import DMC, MUJOCO, SACConfig

# The names agents/registry.py looks up (PRESETS: run.py's --preset, docs/presets.md).
Builder = SACBuilder
Config = SACConfig
PRESETS = {"mujoco": MUJOCO, "dmc": DMC}

__all__ = ["PRESETS", "Builder", "Config", "SACBuilder", "SACConfig"]
