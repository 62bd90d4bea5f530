"""D4PG (Barth-Maron et al., 2018): a distributional (categorical) critic, N-step returns and
a deterministic policy, with Ape-X-style distributed acting into uniform or prioritized
replay; SEED-style central inference."""

from trellis.agents.d4pg.builder import D4PGBuilder
from trellis.agents.d4pg.config import D4PGConfig

# The names agents/registry.py looks up.
Builder = D4PGBuilder
Config = D4PGConfig

__all__ = ["Builder", "Config", "D4PGBuilder", "D4PGConfig"]
