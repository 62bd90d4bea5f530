"""IMPALA (Espeholt et al., 2018) with V-trace, SEED-style central inference."""

from agents.impala.builder import ImpalaBuilder
from agents.impala.config import ImpalaConfig

# The names agents/registry.py looks up.
Builder = ImpalaBuilder
Config = ImpalaConfig

__all__ = ["Builder", "Config", "ImpalaBuilder", "ImpalaConfig"]
