"""The settings of the self-play search agents (AlphaZero's and MuZero's), and their builder's
stand-in where the search extra is missing.

This module imports neither mctx nor pgx (pyproject's `search` extra): an agent's package
imports it first, so that the command lines parse its settings without the extra
(`--agent=alphazero --help` lists them); its `Builder` is then `missing_search_extra`'s
stand-in, whose construction fails in one line naming the extra (run.py: exit 2). The pieces
that search (agents/common/self_play.py, agents/common/baselines.py) need the extra.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NoReturn

from trellis.builders.contract.config import AgentConfig, setting

SEARCH_PACKAGES = ("mctx", "pgx")
INSTALL = "pip install -e '.[search]'"
# Who the evaluation games are played against (agents/common/baselines.py).
OPPONENTS = ("random", "mcts", "minimax")
# The search: AlphaZero's PUCT with Dirichlet noise at the root (mctx.muzero_policy), or Gumbel
# MuZero's sequential halving at the root (mctx.gumbel_muzero_policy), which improves the
# policy with few simulations.
SEARCHES = ("muzero", "gumbel")
# The source of presets that search with Gumbel MuZero's policy (AlphaZero's and MuZero's).
GUMBEL_SOURCE = "Danihelka et al. (2022), Policy improvement by planning with Gumbel"
# The defaults that differ on a platform (run.py applies them). A compiled call is one
# self-play iteration, whose size unroll_length, batch_size and updates_per_iteration set; the
# host evaluates, checks the stop rule and logs after each, so
# builders/experiments/self_play_run.py refuses other values.
PLATFORM_DEFAULTS = {"anakin": {"updates_per_call": 1}}


@dataclasses.dataclass(frozen=True)
class SelfPlayConfig(AgentConfig):
    """Hyper-parameters of self-play with search on a two-player pgx game (AlphaZero's, which
    MuZero extends with its model's).

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
    random_opening_moves: int = setting(
        0, "self-play: the first moves of each game uniformly among the legal ones rather than "
        "the search's (its policy stays the target), so that the network sees openings its own "
        "play rarely makes", ge=0)
    random_move_probability: float = setting(
        0.0, "self-play: the chance of each later move being drawn uniformly among the legal "
        "ones rather than the search's (its policy stays the target), so that the network sees "
        "what follows moves its own play rejects", ge=0, le=1)

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


def missing_search_extra(package: str, agent: str) -> type:
    """A stand-in for the builder of `agent` (alphazero, muzero) where `package` (one of
    SEARCH_PACKAGES) is not installed: building it raises ValueError, one line naming the
    extra."""

    class SearchExtraMissing:
        def __init__(self, config: Any) -> NoReturn:
            del config
            raise ValueError(f"--agent={agent} needs the search extra ({package} is not "
                             f"installed): {INSTALL}")

    return SearchExtraMissing
