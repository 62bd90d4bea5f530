"""MPO (Abdolmaleki et al., 2018), as Acme's: an E-step over actions sampled from the target
policy with a temperature dual, decoupled KL constraints on the Gaussian policy's mean and
std, an n-step critic and target networks, with uniform replay. SEED-style central inference
on the host platforms; the device replay on anakin."""

from trellis.agents.mpo.builder import MPOBuilder
from trellis.agents.mpo.config import MUJOCO, MPOConfig

# The names agents/registry.py looks up (PRESETS: run.py's --preset, docs/presets.md).
Builder = MPOBuilder
Config = MPOConfig
PRESETS = {"mujoco": MUJOCO}

__all__ = ["PRESETS", "Builder", "Config", "MPOBuilder", "MPOConfig"]
