"""D4PG (Barth-Maron et al., 2018): a distributional (categorical) critic, N-step returns and
a deterministic policy, with Ape-X-style distributed acting into uniform or prioritized
replay; SEED-style central inference."""

from trellis.agents.d4pg.builder import D4PGBuilder
from trellis.agents.d4pg.config import MUJOCO, D4PGConfig

# The names agents/registry.py looks up (PRESETS: run.py's --preset, docs/presets.md).
Builder = D4PGBuilder
Config = D4PGConfig
PRESETS = {"mujoco": MUJOCO}

__all__ = ["PRESETS", "Builder", "Config", "D4PGBuilder", "D4PGConfig"]
