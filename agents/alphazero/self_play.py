"""AlphaZero's self-play: the shared loop (agents/common/self_play.py: games side by side on
the device, replay, SGD in one jitted call) with the search over the game itself and positions
that hold the game's outcome for the player to move."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from trellis.agents.alphazero.config import AlphaZeroConfig
from trellis.agents.alphazero.search import make_search
from trellis.agents.common.self_play import (
    Made,
    Moves,
    SearchOutput,
    SelfPlayLoop,
    make_self_play_loop,
    value_targets,
)
from trellis.builders.contract.agent import Training


def outcome_positions(moves: Moves, valid: jax.Array) -> dict[str, jax.Array]:
    """AlphaZero's positions: observation, search policy, and the game's outcome for the
    player to move (weight 0 where the game has not ended yet)."""
    num_moves = moves.obs.shape[0] // 2
    values, known = value_targets(moves.rewards, moves.terminated, moves.player)
    return {"obs": moves.obs[:num_moves], "policy": moves.policy[:num_moves],
            "value": values[:num_moves],
            "weight": (known[:num_moves] & valid).astype(jnp.float32)}


def make_self_play(env: Any, network: Any, training: Training, config: AlphaZeroConfig
                   ) -> SelfPlayLoop:
    """AlphaZero's self-play loop on `env` (see the module's docstring)."""
    return make_self_play_loop(env, make_search(env, network, config), training, config,
                               record_moves, outcome_positions)


def record_moves(made: Made, action: jax.Array, out: SearchOutput) -> Moves:
    """What the outcomes read of a move: `Moves`. Without the action the state is the one
    AlphaZero's checkpoints held before MuZero shared the loop, so those still resume
    (docs/alphazero.md)."""
    del action, out
    return Moves(*made)
