"""SAC losses (Haarnoja et al., 2018, "Soft Actor-Critic Algorithms and Applications").

Pure functions on single transitions (vmap for batches), in rlax style; `_tm1` is the
transition's start, `_t` its bootstrap observation.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp


def soft_q_target(
    r_t: jax.Array,
    discount_t: jax.Array,
    q_t: jax.Array,
    log_prob_t: jax.Array,
    alpha: jax.Array,
) -> jax.Array:
    """The soft Bellman target with clipped double Q (eqs. 2-3 and Section 5).

    target = r_t + discount_t * (min_i Q_target_i(s_t, a_t) - alpha * log pi(a_t | s_t)),
    with a_t drawn from the current policy at s_t.

    Args:
      r_t: [] (n-step) reward.
      discount_t: [] bootstrap discount (0 after a termination).
      q_t: [2] the target critics' Q-values at (s_t, a_t).
      log_prob_t: [] log pi(a_t | s_t).
      alpha: [] temperature.

    Returns:
      [] the target, with no gradient through it.
    """
    chex.assert_rank([r_t, discount_t, q_t, log_prob_t, alpha], [0, 0, 1, 0, 0])
    soft_value = jnp.min(q_t) - alpha * log_prob_t
    return jax.lax.stop_gradient(r_t + discount_t * soft_value)


def critic_loss(q_tm1: jax.Array, target: jax.Array) -> jax.Array:
    """Both critics' soft Bellman residual, sum_i 0.5 (Q_i(s, a) - target)^2 (eq. 5).

    Args:
      q_tm1: [2] the online critics' Q-values at (s_tm1, a_tm1).
      target: [] `soft_q_target`.

    Returns:
      [] the loss.
    """
    chex.assert_rank([q_tm1, target], [1, 0])
    return 0.5 * jnp.sum(jnp.square(q_tm1 - jax.lax.stop_gradient(target)))


def actor_loss(q: jax.Array, log_prob: jax.Array, alpha: jax.Array) -> jax.Array:
    """The policy's KL objective, alpha * log pi(a | s) - min_i Q_i(s, a) (eq. 7).

    Args:
      q: [2] the critics' Q-values at (s, a), a a reparameterised sample from pi(. | s)
        (the gradient flows through a into the policy).
      log_prob: [] log pi(a | s).
      alpha: [] temperature (a constant here).

    Returns:
      [] the loss.
    """
    chex.assert_rank([q, log_prob, alpha], [1, 0, 0])
    return jax.lax.stop_gradient(alpha) * log_prob - jnp.min(q)


def temperature_loss(log_alpha: jax.Array, log_prob: jax.Array,
                     target_entropy: float) -> jax.Array:
    """J(alpha) = alpha * (-log pi(a | s) - target_entropy) (eq. 18), alpha = exp(log_alpha).

    Its gradient lowers alpha while the policy's entropy (estimated by -log pi) is above the
    target and raises it while below; learning log alpha keeps alpha positive.

    Args:
      log_alpha: [] the learned log temperature.
      log_prob: [] log pi(a | s) of a fresh sample (a constant here).
      target_entropy: the entropy target, -action_dim by default.

    Returns:
      [] the loss.
    """
    chex.assert_rank([log_alpha, log_prob], 0)
    return jnp.exp(log_alpha) * jax.lax.stop_gradient(-log_prob - target_entropy)
