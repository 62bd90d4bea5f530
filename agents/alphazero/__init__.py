"""AlphaZero (Silver et al., 2018) with mctx's search on pgx's two-player games."""

from trellis.agents.alphazero.builder import AlphaZeroBuilder
from trellis.agents.alphazero.config import AlphaZeroConfig

# The names agents/registry.py looks up.
Builder = AlphaZeroBuilder
Config = AlphaZeroConfig

__all__ = ["AlphaZeroBuilder", "AlphaZeroConfig", "Builder", "Config"]
