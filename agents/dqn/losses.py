"""DQN losses: n-step double-Q TD errors and the importance-weighted Huber loss.

Pure functions on single transitions (vmap for batches), in rlax style.
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
    q_t_online: jax.Array,
) -> jax.Array:
    """TD error of an n-step double-Q target (van Hasselt et al., 2016).

    target = n_step_return + discount * q_t_target[argmax_a q_t_online[a]], where
    `discount` is gamma^k for a k-step transition that bootstraps, 0 after a termination.

    Args:
      q_tm1: [A] online Q-values at the start observation.
      a_tm1: [] action taken there.
      n_step_return: [] discounted sum of the k rewards that followed.
      discount: [] bootstrap discount.
      q_t_target: [A] target-network Q-values at the bootstrap observation.
      q_t_online: [A] online Q-values there (they select the action; the target evaluates it).

    Returns:
      [] target - q_tm1[a_tm1], with no gradient through the target.
    """
    chex.assert_rank([q_tm1, a_tm1, n_step_return, discount, q_t_target, q_t_online],
                     [1, 0, 0, 0, 1, 1])
    # rlax annotates its result as any array (numpy's too); from JAX inputs it is JAX's.
    return jnp.asarray(rlax.double_q_learning(q_tm1, a_tm1, n_step_return, discount,
                                              q_t_target, q_t_online))


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
