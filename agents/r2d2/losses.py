"""R2D2 losses: n-step double-Q TD errors under the value rescaling h, sequence priorities,
importance weights and the weighted loss.

Pure functions on one sequence (vmap for batches), in rlax style. A sequence holds steps in
the unrolls' layout: step t holds the observation, how it was reached (`reward`,
`terminated`, `truncated`, `first`) and the action chosen at it.
"""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
import rlax


def value_rescaling(eps: float) -> rlax.TxPair:
    """h(x) = sign(x) (sqrt(|x| + 1) - 1) + eps x and its inverse (Pohlen et al., 2018;
    R2D2, Kapturowski et al., 2019, section 2): targets are h(G(h^-1(Q))), so rewards of any
    scale give Q-values of moderate size."""
    return rlax.TxPair(functools.partial(rlax.signed_hyperbolic, eps=eps),
                       functools.partial(rlax.signed_parabolic, eps=eps))


def sequence_td_errors(
    q_online: jax.Array,
    q_target: jax.Array,
    action: jax.Array,
    reward: jax.Array,
    terminated: jax.Array,
    truncated: jax.Array,
    first: jax.Array,
    discount: float,
    n_step: int,
    eps: float,
) -> tuple[jax.Array, jax.Array]:
    """TD errors of transformed n-step double-Q targets over one trace.

    For step t the target is h(G_t) with
      G_t = sum_{j=1..k} discount^(j-1) r_{t+j} + discount^k h^-1(q_target[t+k, a*]),
      a* = argmax_a q_online[t+k, a]   (double Q-learning: van Hasselt et al., 2016),
    where k <= n_step stops early at the end of an episode (termination: no bootstrap;
    truncation: bootstrap from the final observation) or of the trace (a shorter return).
    Step t is masked out when step t + 1 is `first`: with Gymnasium's next-step autoreset
    the action at a final observation is ignored, so it has no transition.

    Args:
      q_online: [T + 1, A] online Q-values (transformed scale).
      q_target: [T + 1, A] target-network Q-values.
      action, reward, terminated, truncated, first: [T + 1] the steps.
      discount: gamma.
      n_step: n.
      eps: of the value rescaling h.

    Returns:
      (td [T], mask [T]): target - q_online[t, action[t]] with no gradient through the
      target, and 1.0 where step t has a transition (0.0 elsewhere).
    """
    chex.assert_rank([q_online, q_target, action, reward, terminated, truncated, first],
                     [2, 2, 1, 1, 1, 1, 1])
    chex.assert_equal_shape([q_online, q_target])
    ended = terminated[1:] | truncated[1:]  # [T]
    bootstrap_action = jnp.argmax(q_online[1:], axis=-1)  # [T]
    v_t = jnp.take_along_axis(q_target[1:], bootstrap_action[:, None], axis=-1)[:, 0]  # [T]
    # lambda 0 at an episode's final observation: the return stops there (bootstrapping
    # from it after a truncation, its discount is 0 after a termination).
    target = rlax.transformed_n_step_returns(
        value_rescaling(eps), reward[1:].astype(jnp.float32),
        discount * (1.0 - terminated[1:].astype(jnp.float32)), v_t, n_step,
        lambda_t=1.0 - ended.astype(jnp.float32))
    q_taken = jnp.take_along_axis(q_online[:-1], action[:-1, None].astype(jnp.int32),
                                  axis=-1)[:, 0]  # [T]
    td = jax.lax.stop_gradient(target) - q_taken
    return td, 1.0 - first[1:].astype(jnp.float32)


def sequence_priority(td: jax.Array, mask: jax.Array, eta: float) -> jax.Array:
    """eta * max_t |td_t| + (1 - eta) * mean_t |td_t| over the masked-in steps (R2D2,
    section 2.3): the mean alone washes out the rare large errors of long sequences.

    Args:
      td, mask: [T] as `sequence_td_errors` gives them.
      eta: the mix.

    Returns:
      [] the priority (0 when every step is masked out).
    """
    chex.assert_equal_shape([td, mask])
    abs_td = jnp.abs(td) * mask
    mean = jnp.sum(abs_td) / jnp.maximum(jnp.sum(mask), 1.0)
    return eta * jnp.max(abs_td) + (1.0 - eta) * mean


def weighted_sequence_loss(td: jax.Array, mask: jax.Array, weights: jax.Array) -> jax.Array:
    """mean_b weights_b * sum_t mask_bt td_bt^2 / (2 T).

    The sum over a trace is divided by its fixed length T rather than by its unmasked
    steps, so every transition weighs the same whatever the episode boundaries.

    Args:
      td, mask: [B, T].
      weights: [B] importance weights (treated as constants).

    Returns:
      [] the loss.
    """
    chex.assert_equal_shape([td, mask])
    chex.assert_rank(weights, 1)
    per_sequence = 0.5 * jnp.sum(mask * jnp.square(td), axis=1) / td.shape[1]  # [B]
    return jnp.mean(jax.lax.stop_gradient(weights) * per_sequence)
