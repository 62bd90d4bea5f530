"""DQN losses: n-step (double-)Q TD errors with the importance-weighted Huber loss, and the
categorical (C51) cross-entropy of Rainbow's distributional head.

Pure functions on single transitions (vmap for batches), in rlax style. Each takes the
Q-values that select the bootstrap action, `q_t_selector`: the online network's for double
Q-learning (van Hasselt et al., 2016), the target network's own for plain Q-learning.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import rlax


def double_q_td_error(
    q_tm1: jax.Array,
    a_tm1: jax.Array,
    n_step_return: jax.Array,
    discount: jax.Array,
    q_t_target: jax.Array,
    q_t_selector: jax.Array,
) -> jax.Array:
    """TD error of an n-step (double-)Q target.

    target = n_step_return + discount * q_t_target[argmax_a q_t_selector[a]], where
    `discount` is gamma^k for a k-step transition that bootstraps, 0 after a termination.

    Args:
      q_tm1: [A] online Q-values at the start observation.
      a_tm1: [] action taken there.
      n_step_return: [] discounted sum of the k rewards that followed.
      discount: [] bootstrap discount.
      q_t_target: [A] target-network Q-values at the bootstrap observation.
      q_t_selector: [A] Q-values there that select the action the target evaluates (the
        online network's: double Q; `q_t_target` itself: plain Q-learning's max).

    Returns:
      [] target - q_tm1[a_tm1], with no gradient through the target.
    """
    chex.assert_rank([q_tm1, a_tm1, n_step_return, discount, q_t_target, q_t_selector],
                     [1, 0, 0, 0, 1, 1])
    # rlax annotates its result as any array (numpy's too); from JAX inputs it is JAX's.
    return jnp.asarray(rlax.double_q_learning(q_tm1, a_tm1, n_step_return, discount,
                                              q_t_target, q_t_selector))


def categorical_double_q_loss(
    atoms: jax.Array,
    logits_tm1: jax.Array,
    a_tm1: jax.Array,
    n_step_return: jax.Array,
    discount: jax.Array,
    logits_t_target: jax.Array,
    q_t_selector: jax.Array,
) -> jax.Array:
    """Cross-entropy of the C51 head against its projected n-step (double-)Q target
    (Bellemare et al., 2017, Algorithm 1; Hessel et al., 2018, eq. 3).

    The target distribution puts the target network's probabilities of the selected action
    a* = argmax q_t_selector on the shifted atoms n_step_return + discount * z, projected onto
    the support `atoms` (each shifted atom's mass split between its two neighbours, outside
    [z_1, z_K] clipped to the ends); the loss is -sum_k target_k log softmax(logits_tm1[a_tm1])_k.

    Args:
      atoms: [K] the support z, evenly spaced.
      logits_tm1: [A, K] online logits at the start observation.
      a_tm1: [] action taken there.
      n_step_return: [] discounted sum of the k rewards that followed.
      discount: [] bootstrap discount (0 after a termination).
      logits_t_target: [A, K] target-network logits at the bootstrap observation.
      q_t_selector: [A] Q-values that select a* (the online network's: double Q).

    Returns:
      [] the cross-entropy, with no gradient through the target (Rainbow's priority).
    """
    chex.assert_rank([atoms, logits_tm1, a_tm1, n_step_return, discount, logits_t_target,
                      q_t_selector], [1, 2, 0, 0, 0, 2, 1])
    return jnp.asarray(rlax.categorical_double_q_learning(
        atoms, logits_tm1, a_tm1, n_step_return, discount, atoms, logits_t_target,
        q_t_selector))


def weighted_huber_loss(td_errors: jax.Array, weights: jax.Array, delta: float) -> jax.Array:
    """mean_i weights_i * huber(td_errors_i), Huber quadratic within |x| <= delta.

    Args:
      td_errors: [B].
      weights: [B] importance weights (treated as constants).

    Returns:
      [] the loss.
    """
    chex.assert_equal_shape([td_errors, weights])
    return jnp.mean(jax.lax.stop_gradient(weights) * rlax.huber_loss(td_errors, delta))
