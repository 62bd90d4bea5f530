"""Evolution strategies: OpenAI-ES (Salimans et al., 2017) and evosax's strategies."""

from trellis.agents.es.builder import ESBuilder
from trellis.agents.es.config import PLATFORM_DEFAULTS, ESConfig

# The names agents/registry.py looks up.
Builder = ESBuilder
Config = ESConfig

__all__ = ["PLATFORM_DEFAULTS", "Builder", "Config", "ESBuilder", "ESConfig"]
