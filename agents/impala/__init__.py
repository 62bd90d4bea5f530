"""IMPALA (Espeholt et al., 2018) with V-trace, SEED-style central inference."""

from trellis.agents.impala.atari import ATARI
from trellis.agents.impala.builder import ImpalaBuilder
from trellis.agents.impala.config import ImpalaConfig

# The names agents/registry.py looks up (PRESETS: run.py's --preset, docs/atari.md).
Builder = ImpalaBuilder
Config = ImpalaConfig
PRESETS = {"atari": ATARI}

__all__ = ["PRESETS", "Builder", "Config", "ImpalaBuilder", "ImpalaConfig"]
