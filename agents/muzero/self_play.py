"""MuZero's self-play: the shared loop (agents/common/self_play.py: games side by side on the
device, replay, SGD in one jitted call) with the search over the learned model and
positions that hold their K-step targets (`losses.unroll_targets`)."""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from trellis.agents.common.self_play import (
    Made,
    Moves,
    Positions,
    Record,
    SearchOutput,
    SelfPlayLoop,
    make_self_play_loop,
)
from trellis.agents.muzero.config import MuZeroConfig
from trellis.agents.muzero.losses import unroll_targets
from trellis.agents.muzero.networks import MuZeroNet
from trellis.agents.muzero.search import make_search
from trellis.builders.contract.agent import Training


@flax.struct.dataclass
class ActedMoves(Moves):
    """`Moves` with the move made at each, `action` [T, B]: what the K-step targets read.

    A subclass, not a field of `Moves` that AlphaZero would leave empty: its state then holds
    the arrays, and orbax's tree, it held before MuZero shared the loop (a66810b), so its
    checkpoints from before resume and evaluate (docs/alphazero.md).
    """

    action: jax.Array


@flax.struct.dataclass
class SearchedMoves(ActedMoves):
    """`ActedMoves` with the search's root value at each, `value` [T, B] for the player to
    move: what value targets bootstrapped n moves on read (`td_steps`; without them MuZero's
    state, and so its checkpoints, are those from before)."""

    value: jax.Array


def make_record(td_steps: int) -> Record:
    """What MuZero's positions read of a move: `SearchedMoves` with `td_steps`, else
    `ActedMoves`."""

    def record(made: Made, action: jax.Array, out: SearchOutput) -> ActedMoves:
        if td_steps:
            return SearchedMoves(*made, action, jnp.asarray(out.search_tree.summary().value))
        return ActedMoves(*made, action)

    return record


def make_positions(num_unroll_steps: int, td_steps: int) -> Positions:
    """`positions(moves [2T, B], valid)`: the replay's items of the first T moves, their
    observation and K-step targets (`agents.common.self_play.Positions`), the value targets
    bootstrapped `td_steps` moves on from the search's root value there."""

    def positions(moves: Moves, valid: jax.Array) -> dict[str, jax.Array]:
        assert isinstance(moves, ActedMoves)  # make_record's.
        predicted = moves.value if isinstance(moves, SearchedMoves) else None
        targets = unroll_targets(moves.action, moves.policy, moves.rewards, moves.terminated,
                                 moves.player, num_unroll_steps, td_steps, predicted)
        return {**targets, "obs": moves.obs[:moves.obs.shape[0] // 2],
                "weight": targets["weight"] * valid}

    return positions


def make_self_play(env: Any, network: MuZeroNet, training: Training, config: MuZeroConfig
                   ) -> SelfPlayLoop:
    """MuZero's self-play loop on `env` (see the module's docstring)."""
    return make_self_play_loop(env, make_search(network, config), training, config,
                               make_record(config.td_steps),
                               make_positions(config.num_unroll_steps, config.td_steps))
