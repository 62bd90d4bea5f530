"""R2D2 (Kapturowski et al., 2019): recurrent replay with stored state and burn-in, n-step
double Q-learning with value rescaling, prioritized sequences. SEED-style central inference."""

from trellis.agents.r2d2.atari import ATARI
from trellis.agents.r2d2.builder import R2D2Builder
from trellis.agents.r2d2.config import R2D2Config

# The names agents/registry.py looks up (PRESETS: run.py's --preset, docs/presets.md).
Builder = R2D2Builder
Config = R2D2Config
PRESETS = {"atari": ATARI}

__all__ = ["PRESETS", "Builder", "Config", "R2D2Builder", "R2D2Config"]
