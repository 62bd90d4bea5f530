"""AlphaZero's targets and loss as pure functions (Silver et al., 2018, "A general
reinforcement learning algorithm that masters chess, shogi, and Go through self-play")."""

from __future__ import annotations

from collections.abc import Mapping

import chex
import jax
import jax.numpy as jnp
import optax


def value_targets(rewards: jax.Array, terminated: jax.Array, player: jax.Array
                  ) -> tuple[jax.Array, jax.Array]:
    """The outcome of each position's game for the player to move there, and whether known.

    Positions are consecutive moves of games side by side; a game that ends at move t
    (`terminated[t]`) is followed at t + 1 by a new one. A position's target is its game's
    final reward to the player who moves there; in a zero-sum game of alternating moves it
    flips sign from one ply to the next. The positions of games still going at the last move
    have no target yet (`known` False).

    Args:
      rewards: [T, B, 2] each player's reward for the move made at t (non-zero only at a
        game's end).
      terminated: [T, B] the move made at t ended the game.
      player: [T, B] who moves at t (0 or 1).

    Returns:
      (values [T, B] in the mover's view, known [T, B]).
    """
    chex.assert_rank([rewards, terminated, player], [3, 2, 2])

    def backward(carry: tuple[jax.Array, jax.Array], step: tuple[jax.Array, jax.Array]
                 ) -> tuple[tuple[jax.Array, jax.Array], tuple[jax.Array, jax.Array]]:
        outcome, known = carry  # [B, 2], [B]: of the game that position t + 1 belongs to.
        reward, ended = step
        outcome = jnp.where(ended[:, None], reward, outcome)
        known = ended | known
        return (outcome, known), (outcome, known)

    batch = rewards.shape[1]
    init = (jnp.zeros((batch, 2), rewards.dtype), jnp.zeros((batch,), bool))
    _, (outcomes, known) = jax.lax.scan(backward, init, (rewards, terminated), reverse=True)
    values = jnp.take_along_axis(outcomes, player[..., None].astype(jnp.int32), axis=-1)[..., 0]
    return values, known


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
