"""The search: mctx over the game's own JAX dynamics (pgx's `step`) and the network.

mctx (DeepMind's JAX search) takes a `RecurrentFn`; here it steps the real game, so the tree
holds exact positions, and the network gives each new node's prior and value. The value is
for the player to move: a move's reward is the mover's, and the discount of -1 hands the next
node's value over to the other player (0 once the game is over).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import chex
import jax
import jax.numpy as jnp
import mctx

from trellis.agents.alphazero.config import AlphaZeroConfig
from trellis.agents.common.params import Params

# pgx's game state, batched ([B] leaves): pgx ships no annotations, so to a type checker it is
# Any; the name says what it is.
Games = Any
# What a search gives for a batch of games: its action [B] and the visit-count targets
# `action_weights` [B, A], and its extra data (Gumbel MuZero's; none for MuZero's).
SearchOutput = mctx.PolicyOutput[None] | mctx.PolicyOutput[mctx.GumbelMuZeroExtraData]
# search(params, key, games) -> the search's output for each game.
Search = Callable[[Params, jax.Array, Games], SearchOutput]


def masked_logits(logits: jax.Array, legal: jax.Array) -> jax.Array:
    """Logits with illegal actions at the lowest float: they get no probability."""
    logits = logits - jnp.max(logits, axis=-1, keepdims=True)
    return jnp.where(legal, logits, jnp.finfo(logits.dtype).min)


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


def run_search(config: AlphaZeroConfig, params: Params, key: jax.Array,
               root: mctx.RootFnOutput, recurrent_fn: mctx.RecurrentFn, invalid: jax.Array,
               evaluation: bool = False) -> SearchOutput:
    """mctx's search from `root` as `config` sets it (AlphaZero's and MuZero's alike).

    Self-play explores: Dirichlet noise at the root and moves sampled from the visit counts
    (muzero), or Gumbel noise (gumbel). Evaluation does not: the most visited move (muzero),
    sequential halving without noise (gumbel), with `eval_simulations` where it is set.

    Args:
      config: the search's settings.
      params, key: the search's params (passed to `recurrent_fn`) and key.
      root: the root's prior logits [B, A], value [B] and embedding.
      recurrent_fn: the model the tree steps.
      invalid: [B, A] the root's illegal actions, never searched nor chosen.
      evaluation: without exploration noise.
    """
    simulations = (config.eval_simulations or config.num_simulations if evaluation
                   else config.num_simulations)
    if config.search_policy == "gumbel":
        return mctx.gumbel_muzero_policy(
            params, key, root, recurrent_fn, simulations, invalid_actions=invalid,
            max_num_considered_actions=config.max_considered_actions,
            gumbel_scale=0.0 if evaluation else 1.0)
    return mctx.muzero_policy(
        params, key, root, recurrent_fn, simulations, invalid_actions=invalid,
        dirichlet_fraction=0.0 if evaluation else config.dirichlet_fraction,
        dirichlet_alpha=config.dirichlet_alpha, pb_c_init=config.pb_c_init,
        temperature=0.0 if evaluation else 1.0)


def make_search(env: Any, network: Any, config: AlphaZeroConfig, evaluation: bool = False
                ) -> Search:
    """`search(params, key, state) -> mctx.PolicyOutput` for a batch of pgx states, the tree
    over the game itself (`run_search` says how it explores)."""
    recurrent_fn = make_recurrent_fn(env, network)

    def search(params: Params, key: jax.Array, state: Games) -> SearchOutput:
        logits, value = network.apply(params, state.observation)
        root = mctx.RootFnOutput(prior_logits=masked_logits(logits, state.legal_action_mask),
                                 value=value, embedding=state)
        return run_search(config, params, key, root, recurrent_fn, ~state.legal_action_mask,
                          evaluation)

    return search
