"""V-trace (Espeholt et al., 2018, "IMPALA: Scalable Distributed Deep-RL with Importance
Weighted Actor-Learner Architectures", Section 4, Remark 1 for the recursive form used here):
off-policy corrected value targets and policy-gradient advantages on one trajectory, for
IMPALA's loss and APPO's (PPO's clipped surrogate on V-trace advantages)."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

__all__ = ["VTraceOutput", "vtrace"]


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

    def backward(acc: jax.Array, xs: tuple[jax.Array, jax.Array, jax.Array]
                 ) -> tuple[jax.Array, jax.Array]:  # acc = v_{s+1} - V(x_{s+1})
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
