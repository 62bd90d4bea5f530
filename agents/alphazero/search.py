"""AlphaZero's search: mctx over the game's own JAX dynamics (pgx's `step`) and the network.

mctx (DeepMind's JAX search) takes a `RecurrentFn`; here it steps the real game, so the tree
holds exact positions, and the network gives each new node's prior and value. The value is
for the player to move: a move's reward is the mover's, and the discount of -1 hands the next
node's value over to the other player (0 once the game is over). `run_search`
(agents/common/self_play.py) is the search's call, MuZero's too.
"""

from __future__ import annotations

from typing import Any

import chex
import jax
import jax.numpy as jnp
import mctx

from trellis.agents.alphazero.config import AlphaZeroConfig
from trellis.agents.common.params import Params
from trellis.agents.common.self_play import Games, Search, SearchOutput, masked_logits, run_search


def make_recurrent_fn(env: Any, network: Any) -> mctx.RecurrentFn:
    """`recurrent_fn(params, key, action[B], state) -> (RecurrentFnOutput, state)` of a game
    whose embedding is pgx's batched state."""

    def recurrent_fn(params: Params, key: jax.Array, action: chex.Array, state: Games
                     ) -> tuple[mctx.RecurrentFnOutput, Games]:
        del key  # pgx's games here are deterministic.
        mover = state.current_player
        state = jax.vmap(env.step)(state, action)
        logits, value = network.apply(params, state.observation)
        reward = jnp.take_along_axis(state.rewards, mover[:, None], axis=-1)[:, 0]
        over = state.terminated
        output = mctx.RecurrentFnOutput(
            reward=reward, discount=jnp.where(over, 0.0, -1.0),
            prior_logits=masked_logits(logits, state.legal_action_mask),
            value=jnp.where(over, 0.0, value))
        return output, state

    return recurrent_fn


def make_search(env: Any, network: Any, config: AlphaZeroConfig, evaluation: bool = False
                ) -> Search:
    """`search(params, key, state) -> mctx.PolicyOutput` for a batch of pgx states, the tree
    over the game itself (`agents.common.self_play.run_search` says how it explores)."""
    recurrent_fn = make_recurrent_fn(env, network)

    def search(params: Params, key: jax.Array, state: Games) -> SearchOutput:
        logits, value = network.apply(params, state.observation)
        root = mctx.RootFnOutput(prior_logits=masked_logits(logits, state.legal_action_mask),
                                 value=value, embedding=state)
        return run_search(config, params, key, root, recurrent_fn, ~state.legal_action_mask,
                          evaluation)

    return search
