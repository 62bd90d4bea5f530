"""AlphaZero's loss as a pure function (Silver et al., 2018, "A general reinforcement
learning algorithm that masters chess, shogi, and Go through self-play"); its value targets
are `agents.common.self_play.value_targets`."""

from __future__ import annotations

from collections.abc import Mapping

import chex
import jax
import jax.numpy as jnp
import optax


def alphazero_loss(logits: jax.Array, value: jax.Array, batch: Mapping[str, jax.Array],
                   value_cost: float) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Cross-entropy to the search's policy plus `value_cost` times the squared error to the
    outcome, averaged over positions with `weight` (0 where the outcome is not known).

    Args:
      logits: [N, A] the network's policy logits.
      value: [N] its value.
      batch: policy [N, A] (the search's visit distribution), value [N] (the outcome for
        the player to move), weight [N].
      value_cost: weight of the value loss.

    Returns:
      (loss, {policy_loss, value_loss}).
    """
    chex.assert_rank([logits, value], [2, 1])
    weight = batch["weight"]
    total = jnp.maximum(weight.sum(), 1.0)
    policy_loss = (weight * optax.softmax_cross_entropy(logits, batch["policy"])).sum() / total
    value_loss = (weight * jnp.square(value - batch["value"])).sum() / total
    return policy_loss + value_cost * value_loss, {"policy_loss": policy_loss,
                                                   "value_loss": value_loss}
