"""AlphaZero configuration."""

from __future__ import annotations

import dataclasses

from trellis.agents.common.self_play_config import GUMBEL_SOURCE, SelfPlayConfig
from trellis.agents.presets import Preset


@dataclasses.dataclass(frozen=True)
class AlphaZeroConfig(SelfPlayConfig):
    """Hyper-parameters of AlphaZero (Silver et al., 2018) on a two-player pgx game: the
    self-play settings MuZero shares (agents/common/self_play_config.py), its network an MLP
    of `hidden_sizes` with a policy and a value head.
    """


# Presets by pgx game (`--preset=auto` picks the game's: launch/flags/presets.py), the settings
# docs/alphazero.md measured meeting each game's target on the 2-core machine; the agent's own
# defaults are no game's. Gumbel MuZero's search (Danihelka et al., 2022) improves the policy
# with few simulations, where PUCT with 32 lost more games (docs/alphazero.md).
_MEASURED = "Trellis's own runs on a 2-core CPU, docs/alphazero.md"
# Tic-tac-toe: 10 minutes and no game lost to minimax. The rate falls linearly to 0 over a
# budget the run reaches, so it ends on the params the schedule settled, not wherever its time
# lands (later params flip on single positions): 300k moves, which the 2-core machine played
# in 8 minutes at load 17-24, where 10 minutes at load 30 gave 175-390k (1.5M, enough on an
# idle machine, left the rate high there and lost games); a replay of 1M moves keeps early
# games' blunders and their punishments, which a replay of 100,000 forgets. The first move of
# each self-play game is drawn at random, as minimax's opening on an edge is one self-play
# rarely plays, and the search plays a baseline with 200 simulations: with both, seeds 0-8's
# final params lose on none of minimax's lines; with neither, seeds 2 and 3 lost on one.
TIC_TAC_TOE = Preset(
    source=f"{_MEASURED} (tic-tac-toe, 2026-11-26 to 12-07)",
    settings={"search_policy": "gumbel", "num_simulations": 64, "unroll_length": 9,
              "replay_size": 1_000_000, "total_env_steps": 300_000,
              "learning_rate_schedule": "linear", "eval_opponent": "minimax",
              "eval_every_updates": 2_000, "random_opening_moves": 1,
              "eval_simulations": 200},
    sources={"search_policy": GUMBEL_SOURCE})
# Connect four: 60 minutes, 88% against the roll-out MCTS with 200 simulations (2026-11-26);
# the search plays a baseline with the baseline's own simulations.
CONNECT_FOUR = Preset(
    source=f"{_MEASURED} (connect four, 2026-11-26)",
    settings={"search_policy": "gumbel", "hidden_sizes": (256, 256),
              "updates_per_iteration": 16, "replay_size": 2_000_000, "eval_simulations": 200},
    sources={"search_policy": GUMBEL_SOURCE})
