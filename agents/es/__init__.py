"""Evolution strategies: OpenAI-ES (Salimans et al., 2017) and evosax's strategies."""

from trellis.agents.es.builder import ESBuilder
from trellis.agents.es.config import ESConfig

# The names agents/registry.py looks up.
Builder = ESBuilder
Config = ESConfig

__all__ = ["Builder", "Config", "ESBuilder", "ESConfig"]
