"""MuZero (Schrittwieser et al., 2020): a learned model searched by mctx, trained by self-play
on pgx's two-player games."""

from trellis.agents.common.self_play_config import (
    PLATFORM_DEFAULTS,
    SEARCH_PACKAGES,
    missing_search_extra,
)
from trellis.agents.muzero.config import TIC_TAC_TOE, MuZeroConfig

# The names agents/registry.py looks up. Without the search extra, Builder is a stand-in that
# says what to install when built (agents/common/self_play_config.py).
Config = MuZeroConfig
PRESETS = {"tic_tac_toe": TIC_TAC_TOE}
try:
    from trellis.agents.muzero.builder import MuZeroBuilder
except ModuleNotFoundError as e:
    if e.name not in SEARCH_PACKAGES:
        raise
    Builder = missing_search_extra(e.name, "muzero")
else:
    Builder = MuZeroBuilder

__all__ = ["PLATFORM_DEFAULTS", "PRESETS", "Builder", "Config", "MuZeroBuilder", "MuZeroConfig"]
