"""IMPALA losses: V-trace targets and the actor-critic loss on one trajectory.

Espeholt et al., 2018, "IMPALA: Scalable Distributed Deep-RL with Importance Weighted
Actor-Learner Architectures", https://arxiv.org/abs/1802.01561 (Section 4, Remark 1 for
the recursive form of the V-trace targets used here).
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp


@chex.dataclass(frozen=True)
class VTraceOutput:
    errors: jax.Array  # [T] v_s - V(x_s): the baseline's regression error.
    pg_advantage: jax.Array  # [T] rho_s (r_s + gamma_s v_{s+1} - V(x_s)).
    q_estimate: jax.Array  # [T] r_s + gamma_s v_{s+1}.


def vtrace(
    v_tm1: jax.Array,
    v_t: jax.Array,
    r_t: jax.Array,
    discount_t: jax.Array,
    rho_tm1: jax.Array,
    lambda_: float = 1.0,
    clip_rho_threshold: float = 1.0,
    clip_pg_rho_threshold: float = 1.0,
) -> VTraceOutput:
    """V-trace targets for one trajectory (same argument order as rlax.vtrace).

    v_s = V(x_s) + delta_s + gamma_s c_s (v_{s+1} - V(x_{s+1})),
    delta_s = min(rho_bar, rho_s) (r_s + gamma_s V(x_{s+1}) - V(x_s)), c_s = lambda min(1, rho_s).

    Args:
      v_tm1: [T] values V(x_s) at the start of each transition.
      v_t: [T] values V(x_{s+1}) after each transition.
      r_t: [T] rewards.
      discount_t: [T] discounts (0 at termination).
      rho_tm1: [T] importance weights pi(a_s|x_s) / mu(a_s|x_s). A weight of 0 removes a
        transition entirely (no TD error and no trace through it): used to mask the
        transition into the first observation of a new episode.
      lambda_: trace mixing parameter.
      clip_rho_threshold: rho_bar.
      clip_pg_rho_threshold: clip on rho for the policy-gradient advantage.

    Returns:
      VTraceOutput; targets are wrapped in stop_gradient.
    """
    chex.assert_rank([v_tm1, v_t, r_t, discount_t, rho_tm1], 1)
    chex.assert_equal_shape([v_tm1, v_t, r_t, discount_t, rho_tm1])

    clipped_rhos = jnp.minimum(clip_rho_threshold, rho_tm1)
    c_tm1 = lambda_ * jnp.minimum(1.0, rho_tm1)
    td_errors = clipped_rhos * (r_t + discount_t * v_t - v_tm1)

    def backward(acc, xs):  # acc = v_{s+1} - V(x_{s+1})
        td, discount, c = xs
        acc = td + discount * c * acc
        return acc, acc

    _, vs_minus_v = jax.lax.scan(
        backward, jnp.zeros_like(v_t[-1]), (td_errors, discount_t, c_tm1), reverse=True
    )
    vs = vs_minus_v + v_tm1
    vs_t = jnp.concatenate([vs[1:], v_t[-1:]])  # v_{s+1}, bootstrapping from V at the end.
    q_estimate = r_t + discount_t * vs_t
    pg_rhos = jnp.minimum(clip_pg_rho_threshold, rho_tm1)
    return VTraceOutput(
        errors=jax.lax.stop_gradient(vs_minus_v),
        pg_advantage=jax.lax.stop_gradient(pg_rhos * (q_estimate - v_tm1)),
        q_estimate=jax.lax.stop_gradient(q_estimate),
    )


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
