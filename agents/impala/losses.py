"""IMPALA losses: the actor-critic loss on one trajectory, on V-trace targets
(agents/common/vtrace.py, shared with APPO).

Espeholt et al., 2018, "IMPALA: Scalable Distributed Deep-RL with Importance Weighted
Actor-Learner Architectures", https://arxiv.org/abs/1802.01561 (Section 4, Remark 1 for
the recursive form of the V-trace targets used here).
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from trellis.agents.common.vtrace import vtrace


def impala_loss(
    logits: jax.Array,
    values: jax.Array,
    actions: jax.Array,
    behaviour_logits: jax.Array,
    rewards: jax.Array,
    discounts: jax.Array,
    mask: jax.Array,
    *,
    baseline_cost: float,
    entropy_cost: float | jax.Array,
    lambda_: float = 1.0,
    clip_rho_threshold: float = 1.0,
    clip_pg_rho_threshold: float = 1.0,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """IMPALA loss on one unroll of T transitions (T + 1 observations).

    Args:
      logits: [T+1, A] learner policy logits at x_0..x_T.
      values: [T+1] learner values at x_0..x_T.
      actions: [T] actions a_0..a_{T-1}.
      behaviour_logits: [T, A] the acting policy's logits at x_0..x_{T-1}.
      rewards: [T] reward of each transition.
      discounts: [T] gamma, or 0 where the transition terminated the episode.
      mask: [T] 1 for real transitions, 0 for the (ignored-action) autoreset step.
      baseline_cost, entropy_cost, lambda_, clip_*: see ImpalaConfig.

    Returns:
      (scalar loss, metrics). Losses are averaged over the unmasked transitions.
    """
    chex.assert_rank([logits, values, actions, behaviour_logits], [2, 1, 1, 2])
    chex.assert_equal_shape([actions, rewards, discounts, mask])

    log_pi = jax.nn.log_softmax(logits[:-1])  # [T, A]
    log_mu = jax.nn.log_softmax(behaviour_logits)  # [T, A]
    log_pi_a = jnp.take_along_axis(log_pi, actions[:, None], axis=-1)[:, 0]  # [T]
    log_mu_a = jnp.take_along_axis(log_mu, actions[:, None], axis=-1)[:, 0]  # [T]
    rhos = jnp.exp(jax.lax.stop_gradient(log_pi_a) - log_mu_a) * mask

    targets = vtrace(
        values[:-1], values[1:], rewards, discounts * mask, rhos,
        lambda_, clip_rho_threshold, clip_pg_rho_threshold,
    )
    n = jnp.maximum(mask.sum(), 1.0)
    pg_loss = -jnp.sum(log_pi_a * targets.pg_advantage * mask) / n
    vs = jax.lax.stop_gradient(values[:-1]) + targets.errors  # [T] V-trace targets.
    baseline_loss = 0.5 * jnp.sum(jnp.square(vs - values[:-1]) * mask) / n
    entropy = -jnp.sum(jnp.exp(log_pi) * log_pi, axis=-1)  # [T]
    entropy_loss = -jnp.sum(entropy * mask) / n
    loss = pg_loss + baseline_cost * baseline_loss + entropy_cost * entropy_loss
    return loss, {
        "pg_loss": pg_loss,
        "baseline_loss": baseline_loss,
        "entropy": -entropy_loss,
        "mean_rho": jnp.sum(rhos) / n,
    }
