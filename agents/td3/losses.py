"""TD3 losses (Fujimoto et al., 2018): pure functions on single transitions (vmap for
batches), in rlax style; `_tm1` is the transition's start, `_t` its bootstrap observation."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp


def smoothed_target_action(key: jax.Array, u_t: jax.Array, scale: jax.Array,
                           noise: float, noise_clip: float,
                           low: jax.Array, high: jax.Array) -> jax.Array:
    """Target policy smoothing (Section 5.3): the target policy's action at s_t plus clipped
    Gaussian noise, kept in bounds, a' = clip(mu'(s_t) + clip(noise * scale * N(0, 1),
    -noise_clip * scale, noise_clip * scale), low, high).

    Args:
      key: the noise's key.
      u_t: [D] the target policy's action mu'(s_t), already in bounds.
      scale: [D] the action range's half-width.
      noise, noise_clip: in half-widths.
      low, high: [D] the bounds.

    Returns:
      [D] the smoothed action.
    """
    chex.assert_rank([u_t, scale, low, high], 1)
    eps = noise * scale * jax.random.normal(key, u_t.shape, u_t.dtype)
    eps = jnp.clip(eps, -noise_clip * scale, noise_clip * scale)
    return jnp.clip(u_t + eps, low, high)


def td3_target(r_t: jax.Array, discount_t: jax.Array, q_t: jax.Array) -> jax.Array:
    """The clipped double Q target r_t + discount_t * min_i Q'_i(s_t, a'_t) (eq. 10); with one
    critic (DDPG) the min is that critic.

    Args:
      r_t: [] (n-step) reward.
      discount_t: [] bootstrap discount (0 after a termination).
      q_t: [N] the target critics at (s_t, a'_t), N = 1 or 2.

    Returns:
      [] the target, with no gradient through it.
    """
    chex.assert_rank([r_t, discount_t, q_t], [0, 0, 1])
    return jax.lax.stop_gradient(r_t + discount_t * jnp.min(q_t))


def critic_loss(q_tm1: jax.Array, target: jax.Array) -> jax.Array:
    """Every critic's squared Bellman residual, sum_i 0.5 (Q_i(s, a) - target)^2.

    Args:
      q_tm1: [N] the online critics at (s_tm1, a_tm1).
      target: [] `td3_target`.

    Returns:
      [] the loss.
    """
    chex.assert_rank([q_tm1, target], [1, 0])
    return 0.5 * jnp.sum(jnp.square(q_tm1 - jax.lax.stop_gradient(target)))


def actor_loss(q1: jax.Array) -> jax.Array:
    """The deterministic policy gradient's objective, -Q_1(s, mu(s)) (Silver et al., 2014):
    TD3 follows the first critic only.

    Args:
      q1: [] the first critic at (s, mu(s)), differentiable in mu(s).

    Returns:
      [] the loss.
    """
    chex.assert_rank(q1, 0)
    return -q1
