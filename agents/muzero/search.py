"""MuZero's search: mctx over the learned model (agents/muzero/networks.py).

The root's latent is the representation of the real position, whose illegal moves are masked
(`invalid_actions`, and no prior on them); inside the tree the dynamics steps latents, and no
move is masked: the model knows no rules (as the paper's search, and mctx's MuZero examples).
Values are for the player to move and rewards for the mover, so every edge's discount is -1
(mctx's two-player convention): a node's value is its reward minus its child's value. The
model itself learns that nothing follows a game's end (zero rewards and values there).
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import mctx

from trellis.agents.common.params import Params, pure_apply
from trellis.agents.common.self_play import Games, Search, SearchOutput, masked_logits, run_search
from trellis.agents.muzero.config import MuZeroConfig
from trellis.agents.muzero.networks import MuZeroNet


def make_recurrent_fn(network: MuZeroNet) -> mctx.RecurrentFn:
    """`recurrent_fn(params, key, action[B], latent[B, L]) -> (RecurrentFnOutput, latent')`
    of the learned model."""

    def recurrent_fn(params: Params, key: jax.Array, action: chex.Array, latent: jax.Array
                     ) -> tuple[mctx.RecurrentFnOutput, jax.Array]:
        del key  # The model is deterministic.
        latent, reward, logits, value = pure_apply(network)(
            params, latent, action, method=MuZeroNet.recurrent_inference)
        output = mctx.RecurrentFnOutput(reward=reward, discount=-jnp.ones_like(reward),
                                        prior_logits=logits, value=value)
        return output, latent

    return recurrent_fn


def make_search(network: MuZeroNet, config: MuZeroConfig, evaluation: bool = False) -> Search:
    """`search(params, key, games) -> mctx.PolicyOutput` for a batch of pgx states, the tree
    over the learned model from each game's observation (exploration as
    `agents.common.self_play.run_search`)."""
    recurrent_fn = make_recurrent_fn(network)

    def search(params: Params, key: jax.Array, games: Games) -> SearchOutput:
        latent, logits, value = pure_apply(network)(params, games.observation,
                                                    method=MuZeroNet.initial_inference)
        legal = games.legal_action_mask
        root = mctx.RootFnOutput(prior_logits=masked_logits(logits, legal), value=value,
                                 embedding=latent)
        return run_search(config, params, key, root, recurrent_fn, ~legal, evaluation)

    return search
