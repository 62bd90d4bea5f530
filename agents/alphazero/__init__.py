"""AlphaZero (Silver et al., 2018) with mctx's search on pgx's two-player games."""

from trellis.agents.alphazero.config import CONNECT_FOUR, TIC_TAC_TOE, AlphaZeroConfig
from trellis.agents.common.self_play_config import (
    PLATFORM_DEFAULTS,
    SEARCH_PACKAGES,
    missing_search_extra,
)

# The names agents/registry.py looks up. Without the search extra, Builder is a stand-in that
# says what to install when built (agents/common/self_play_config.py).
Config = AlphaZeroConfig
PRESETS = {"tic_tac_toe": TIC_TAC_TOE, "connect_four": CONNECT_FOUR}
try:
    from trellis.agents.alphazero.builder import AlphaZeroBuilder
except ModuleNotFoundError as e:
    if e.name not in SEARCH_PACKAGES:
        raise
    Builder = missing_search_extra(e.name, "alphazero")
else:
    Builder = AlphaZeroBuilder

__all__ = ["PLATFORM_DEFAULTS", "PRESETS", "AlphaZeroBuilder", "AlphaZeroConfig", "Builder",
           "Config"]
