"""PPO losses: GAE on one trajectory and the clipped-surrogate actor-critic loss.

Schulman et al., 2017, "Proximal Policy Optimization Algorithms",
https://arxiv.org/abs/1707.06347 (Eq. 7 for the clipped surrogate, Eq. 9 for the combined
objective, Eqs. 11-12 for truncated GAE); Schulman et al., 2016, "High-Dimensional
Continuous Control Using Generalized Advantage Estimation", https://arxiv.org/abs/1506.02438.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp


def transition_discounts(
    first_t: jax.Array,
    terminated_t: jax.Array,
    truncated_t: jax.Array,
    discount: float,
    lambda_: float,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Per-transition discount, trace factor and mask from how each observation was reached.

    Transition s goes from x_s to x_{s+1}; the arguments describe x_{s+1} (the recorded
    fields of steps 1..T of an unroll). Gymnasium's next-step autoreset makes the transition
    into a `first` observation fake (its action is ignored, x_s belongs to the old episode):
    it is masked out, and no trace runs into it, so nothing after it (the next episode)
    reaches an earlier advantage. A terminated episode neither bootstraps nor traces past
    its end; a truncated one bootstraps from its last observation (still real data) with
    its trace cut.

    Args:
      first_t: [T] x_{s+1} starts an episode.
      terminated_t: [T] x_{s+1} is terminal.
      truncated_t: [T] the episode was cut off at x_{s+1}.
      discount: gamma.
      lambda_: the GAE lambda.

    Returns:
      (discount_t, lambda_t, mask_t), each [T] float32, for
      `generalized_advantage_estimation` and the loss.
    """
    chex.assert_rank([first_t, terminated_t, truncated_t], 1)
    chex.assert_equal_shape([first_t, terminated_t, truncated_t])
    mask_t = 1.0 - first_t.astype(jnp.float32)
    # Whether transition s + 1 is real; past the end the bootstrap value stands in for it.
    next_mask_t = jnp.concatenate([mask_t[1:], jnp.ones_like(mask_t[:1])])
    discount_t = discount * (1.0 - terminated_t.astype(jnp.float32))
    lambda_t = lambda_ * (1.0 - truncated_t.astype(jnp.float32)) * next_mask_t
    return discount_t, lambda_t, mask_t


def generalized_advantage_estimation(
    r_t: jax.Array,
    discount_t: jax.Array,
    lambda_t: jax.Array | float,
    values: jax.Array,
) -> jax.Array:
    """Truncated GAE(lambda) advantages of one trajectory (argument order of rlax's).

    A_s = delta_s + discount_s lambda_s A_{s+1}, delta_s = r_s + discount_s V(x_{s+1}) - V(x_s),
    with A_T = 0 beyond the trajectory, so the last transition bootstraps from V(x_T).

    Args:
      r_t: [T] rewards.
      discount_t: [T] discounts (0 where the transition terminated the episode).
      lambda_t: [T] (or scalar) trace factors; 0 cuts the trace while keeping the
        bootstrap (truncated episodes).
      values: [T + 1] V(x_0)..V(x_T).

    Returns:
      [T] advantages, wrapped in stop_gradient (they are targets).
    """
    chex.assert_rank([r_t, discount_t, values], 1)
    chex.assert_equal_shape([r_t, discount_t])
    chex.assert_shape(values, (r_t.shape[0] + 1,))
    lambda_t = jnp.broadcast_to(jnp.asarray(lambda_t, r_t.dtype), r_t.shape)
    delta_t = r_t + discount_t * values[1:] - values[:-1]

    def backward(acc: jax.Array, xs: tuple[jax.Array, jax.Array]
                 ) -> tuple[jax.Array, jax.Array]:  # acc = A_{s+1}
        delta, trace = xs
        acc = delta + trace * acc
        return acc, acc

    _, advantages = jax.lax.scan(
        backward, jnp.zeros_like(r_t[-1]), (delta_t, discount_t * lambda_t), reverse=True
    )
    return jax.lax.stop_gradient(advantages)


def _masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
    return jnp.sum(x * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def clipped_surrogate_loss(
    ratio_t: jax.Array, adv_t: jax.Array, epsilon: float, mask_t: jax.Array
) -> jax.Array:
    """Negated clipped surrogate objective (Eq. 7), averaged over the unmasked samples.

    L = -mean(min(ratio A, clip(ratio, 1 - epsilon, 1 + epsilon) A)).

    Args:
      ratio_t: [N] pi(a|x) / pi_old(a|x).
      adv_t: [N] advantages (treated as constants).
      epsilon: the clipping range.
      mask_t: [N] 1 for samples to learn from, 0 to ignore.
    """
    chex.assert_rank([ratio_t, adv_t, mask_t], 1)
    chex.assert_equal_shape([ratio_t, adv_t, mask_t])
    adv_t = jax.lax.stop_gradient(adv_t)
    clipped = jnp.clip(ratio_t, 1.0 - epsilon, 1.0 + epsilon)
    return -_masked_mean(jnp.minimum(ratio_t * adv_t, clipped * adv_t), mask_t)


def value_loss(
    v_t: jax.Array,
    behaviour_v_t: jax.Array,
    returns_t: jax.Array,
    mask_t: jax.Array,
    clip_epsilon: float | None = None,
) -> jax.Array:
    """Half squared error to the returns, optionally clipped around the behaviour values.

    With clipping (as in OpenAI baselines' PPO2): the larger of the plain error and the
    error of V_old + clip(V - V_old, -epsilon, epsilon), so the value cannot profit from
    moving further than epsilon from where it was when the data was collected.

    Args:
      v_t: [N] current values.
      behaviour_v_t: [N] values recorded when acting.
      returns_t: [N] regression targets.
      mask_t: [N] 1 for samples to learn from.
      clip_epsilon: None for no clipping.
    """
    chex.assert_rank([v_t, behaviour_v_t, returns_t, mask_t], 1)
    returns_t = jax.lax.stop_gradient(returns_t)
    error = jnp.square(v_t - returns_t)
    if clip_epsilon is not None:
        clipped_v = behaviour_v_t + jnp.clip(v_t - behaviour_v_t, -clip_epsilon, clip_epsilon)
        error = jnp.maximum(error, jnp.square(clipped_v - returns_t))
    return 0.5 * _masked_mean(error, mask_t)


def ppo_loss(
    log_prob_t: jax.Array,
    behaviour_log_prob_t: jax.Array,
    entropy_t: jax.Array,
    v_t: jax.Array,
    behaviour_v_t: jax.Array,
    adv_t: jax.Array,
    returns_t: jax.Array,
    mask_t: jax.Array,
    *,
    clip_epsilon: float,
    value_cost: float,
    entropy_cost: float | jax.Array,
    value_clip_epsilon: float | None = None,
    normalize_advantages: bool = True,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The PPO objective (Eq. 9, negated) on one minibatch of N transitions.

    Transitions are independent once their advantages are known, so this takes a flat
    minibatch; advantages are normalised over its unmasked samples (zero mean, unit std).

    Args:
      log_prob_t: [N] log pi(a|x) under the params being optimised.
      behaviour_log_prob_t: [N] log pi_old(a|x) recorded when acting.
      entropy_t: [N] entropy of pi(.|x).
      v_t: [N] current values.
      behaviour_v_t: [N] values recorded when acting.
      adv_t: [N] GAE advantages.
      returns_t: [N] value targets (advantage + behaviour value).
      mask_t: [N] 1 for real transitions, 0 for the ignored-action autoreset step.
      clip_epsilon, value_cost, entropy_cost, value_clip_epsilon, normalize_advantages:
        see PPOConfig.

    Returns:
      (scalar loss, metrics).
    """
    chex.assert_rank(
        [log_prob_t, behaviour_log_prob_t, entropy_t, v_t, behaviour_v_t, adv_t, returns_t,
         mask_t], 1)
    chex.assert_equal_shape(
        [log_prob_t, behaviour_log_prob_t, entropy_t, v_t, behaviour_v_t, adv_t, returns_t,
         mask_t])
    if normalize_advantages:
        mean = _masked_mean(adv_t, mask_t)
        std = jnp.sqrt(_masked_mean(jnp.square(adv_t - mean), mask_t))
        adv_t = (adv_t - mean) / (std + 1e-8)
    log_ratio = log_prob_t - behaviour_log_prob_t
    ratio = jnp.exp(log_ratio)
    pg_loss = clipped_surrogate_loss(ratio, adv_t, clip_epsilon, mask_t)
    v_loss = value_loss(v_t, behaviour_v_t, returns_t, mask_t, value_clip_epsilon)
    entropy = _masked_mean(entropy_t, mask_t)
    loss = pg_loss + value_cost * v_loss - entropy_cost * entropy
    log_ratio = jax.lax.stop_gradient(log_ratio)
    return loss, {
        "pg_loss": pg_loss,
        "value_loss": v_loss,
        "entropy": entropy,
        # KL(pi_old || pi) estimated as E[(r - 1) - log r] (non-negative, low variance).
        "approx_kl": _masked_mean(jnp.expm1(log_ratio) - log_ratio, mask_t),
        "clip_fraction": _masked_mean(
            (jnp.abs(jnp.exp(log_ratio) - 1.0) > clip_epsilon).astype(jnp.float32), mask_t),
    }
