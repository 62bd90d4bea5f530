"""IMPALA (Espeholt et al., 2018) with V-trace, SEED-style central inference."""

from trellis.agents.impala.atari import ATARI
from trellis.agents.impala.builder import ImpalaBuilder
from trellis.agents.impala.config import ImpalaConfig
from trellis.agents.impala.minatar import IMPALA_MINATAR

# The names agents/registry.py looks up (PRESETS: run.py's --preset, docs/presets.md).
Builder = ImpalaBuilder
Config = ImpalaConfig
PRESETS = {"atari": ATARI, "minatar": IMPALA_MINATAR}

__all__ = ["PRESETS", "Builder", "Config", "ImpalaBuilder", "ImpalaConfig"]
