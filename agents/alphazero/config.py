"""AlphaZero configuration."""

from __future__ import annotations

import dataclasses

from trellis.agents.presets import Preset
from trellis.builders.contract.config import AgentConfig, setting

# Who the evaluation games are played against (agents/alphazero/baselines.py).
OPPONENTS = ("random", "mcts", "minimax")
# The search: AlphaZero's PUCT with Dirichlet noise at the root (mctx.muzero_policy), or Gumbel
# MuZero's sequential halving at the root (mctx.gumbel_muzero_policy), which improves the
# policy with few simulations.
SEARCHES = ("muzero", "gumbel")
# The defaults that differ on a platform (run.py applies them). A compiled call is one
# self-play iteration, whose size unroll_length, batch_size and updates_per_iteration set; the
# host evaluates, checks the stop rule and logs after each, so
# builders/experiments/self_play_run.py refuses other values.
PLATFORM_DEFAULTS = {"anakin": {"updates_per_call": 1}}


@dataclasses.dataclass(frozen=True)
class AlphaZeroConfig(AgentConfig):
    """Hyper-parameters of AlphaZero (Silver et al., 2018) on a two-player pgx game.

    Self-play: `batch_size` games side by side, `unroll_length` moves of each per iteration,
    every move chosen by a search of `num_simulations`; then `updates_per_iteration` SGD steps
    on `sample_batch_size` positions drawn from the replay on the device.
    """

    # Self-play (the contract's T and B: moves per game per iteration, games side by side).
    unroll_length: int = 42  # A chunk as long as connect four's longest game.
    batch_size: int = 64
    max_queue_size: int = 1  # Unused: self-play, learning and replay are one program.
    hidden_sizes: tuple[int, ...] = (128, 128)
    learning_rate: float = 1e-3
    max_grad_norm: float = 1.0

    # Search.
    # Not `search`: a settings file's `search` section is tune.py's search space.
    search_policy: str = setting(
        "muzero", "the search: muzero (PUCT, Dirichlet noise at the root) or gumbel (Gumbel "
        "MuZero)", choices=SEARCHES)
    num_simulations: int = setting(32, "simulations of each move's search", ge=1)
    dirichlet_alpha: float = setting(0.3, "muzero search: the root noise's concentration", gt=0)
    dirichlet_fraction: float = setting(
        0.25, "muzero search: the root noise's weight in the prior", ge=0, le=1)
    pb_c_init: float = setting(1.25, "muzero search: PUCT's exploration constant", gt=0)
    max_considered_actions: int = setting(
        16, "gumbel search: actions sequential halving starts from at the root", ge=1)

    # Replay of positions (observation, search policy, outcome) on the device.
    replay_size: int = setting(100_000, "positions the replay holds", ge=1)
    min_replay_size: int = setting(1_000, "no updates before the replay holds this many "
                                   "positions", ge=1)
    sample_batch_size: int = setting(256, "positions per SGD step", ge=1)
    updates_per_iteration: int = setting(8, "SGD steps after each self-play iteration", ge=1)
    value_cost: float = setting(1.0, "weight of the value loss", ge=0)

    # Evaluation games against a baseline, written to metrics.jsonl.
    eval_every_updates: int = setting(
        200, "SGD steps between evaluations against eval_opponent (one also at the start); "
        "0: none", ge=0)
    eval_games: int = setting(100, "games per evaluation, half with each side to move first",
                              ge=2)
    eval_opponent: str = setting(
        "random", "who the evaluation plays: random, mcts (random roll-outs) or minimax "
        "(tic-tac-toe only)", choices=OPPONENTS)
    mcts_simulations: int = setting(200, "simulations of the roll-out MCTS baseline", ge=1)
    eval_simulations: int = setting(
        0, "simulations of each move's search when it plays a baseline (in-run evaluations, "
        "evaluate.py, benchmarks/alphazero.py); 0: num_simulations", ge=0)

    def check(self) -> None:
        if self.min_replay_size > self.replay_size:
            raise self.invalid("min_replay_size", f"<= replay_size = {self.replay_size}")
        if self.replay_size < self.positions_per_iteration:
            raise self.invalid("replay_size", f">= unroll_length * batch_size = "
                               f"{self.positions_per_iteration} (an iteration's positions)")
        if self.eval_games % 2:
            raise self.invalid("eval_games", "even (half the games with each side first)")

    @property
    def positions_per_iteration(self) -> int:
        """Positions self-play adds to the replay per iteration, T * B."""
        return self.unroll_length * self.batch_size


# Presets by pgx game (`--preset=auto` picks the game's: launch/flags/presets.py), the settings
# docs/alphazero.md measured meeting each game's target on the 2-core machine; the agent's own
# defaults are no game's. Gumbel MuZero's search (Danihelka et al., 2022) improves the policy
# with few simulations, where PUCT with 32 lost more games (docs/alphazero.md).
_MEASURED = "Trellis's own runs on a 2-core CPU, docs/alphazero.md"
_GUMBEL = "Danihelka et al. (2022), Policy improvement by planning with Gumbel"
# Tic-tac-toe: 10 minutes and no game lost to minimax. The rate falls linearly to 0 over a
# budget the run reaches, so it ends on the params the schedule settled, not wherever its time
# lands (later params flip on single positions): 300k moves, which the 2-core machine played
# in 8 minutes at load 17-24, where 10 minutes at load 30 gave 175-390k (1.5M, enough on an
# idle machine, left the rate high there and lost games); a replay of 1M moves keeps early
# games' blunders and their punishments, which a replay of 100,000 forgets.
TIC_TAC_TOE = Preset(
    source=f"{_MEASURED} (tic-tac-toe, 2026-11-26 to 11-29)",
    settings={"search_policy": "gumbel", "num_simulations": 64, "unroll_length": 9,
              "replay_size": 1_000_000, "total_env_steps": 300_000,
              "learning_rate_schedule": "linear", "eval_opponent": "minimax",
              "eval_every_updates": 2_000},
    sources={"search_policy": _GUMBEL})
# Connect four: 60 minutes, 88% against the roll-out MCTS with 200 simulations (2026-11-26);
# the search plays a baseline with the baseline's own simulations.
CONNECT_FOUR = Preset(
    source=f"{_MEASURED} (connect four, 2026-11-26)",
    settings={"search_policy": "gumbel", "hidden_sizes": (256, 256),
              "updates_per_iteration": 16, "replay_size": 2_000_000, "eval_simulations": 200},
    sources={"search_policy": _GUMBEL})
