"""IMPALA (Espeholt et al., 2018) with V-trace, SEED-style central inference."""

from trellis.agents.impala.builder import ImpalaBuilder
from trellis.agents.impala.config import ImpalaConfig

# The names agents/registry.py looks up.
Builder = ImpalaBuilder
Config = ImpalaConfig

__all__ = ["Builder", "Config", "ImpalaBuilder", "ImpalaConfig"]
