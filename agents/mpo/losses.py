"""MPO losses (Abdolmaleki et al., 2018, "Maximum a Posteriori Policy Optimisation", and its
decoupled KL constraints of "Relative Entropy Regularized Policy Iteration", 2018), as Acme's
Gaussian MPO sets them up: pure functions on a minibatch whose sampled actions lie on a
leading sample axis, [N, B, ...].

The E-step reweights N actions sampled at each state from the target policy by
softmax(Q / temperature); the temperature is a Lagrange multiplier learned by its convex dual
so that the reweighted policy stays within KL `epsilon` of the target policy. The M-step fits
the online Gaussian to the weighted samples, its mean and its std each against the target's
other half (the decoupled update), each under its own KL bound with its own multiplier.
Actions are in units of the env's half-range: [-1, 1] spans its bounds.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

# The dual variables are softplus(raw) + this (Acme's parameterisation), so none reaches 0.
MIN_DUAL = 1e-8


class Duals(NamedTuple):
    """The raw (pre-softplus) Lagrange multipliers: `dual(raw)` is each one's value.

    Attributes:
      temperature: [] the E-step's temperature.
      alpha_mean: [D] (or [] when not per dimension) the mean's KL multiplier.
      alpha_std: [D] (or []) the std's KL multiplier.
      penalty_temperature: [] the temperature of the out-of-bounds action penalty.
    """

    temperature: jax.Array
    alpha_mean: jax.Array
    alpha_std: jax.Array
    penalty_temperature: jax.Array


class Epsilons(NamedTuple):
    """The bounds of the constraints (Acme's `GaussianPolicyLossConfig` names)."""

    epsilon: float  # KL of the E-step's reweighted policy from the target policy.
    epsilon_mean: float  # KL of the online mean's Gaussian from the target policy.
    epsilon_stddev: float  # KL of the online std's Gaussian from the target policy.
    epsilon_penalty: float  # The action penalty's KL (its own temperature's bound).


def dual(raw: jax.Array) -> jax.Array:
    """A multiplier's value, softplus(raw) + MIN_DUAL: positive whatever Adam does to raw."""
    return jax.nn.softplus(raw) + MIN_DUAL


def weights_and_temperature_loss(q: jax.Array, temperature: jax.Array,
                                 epsilon: float) -> tuple[jax.Array, jax.Array]:
    """The E-step: the sampled actions' weights and the temperature's dual loss.

    weights[i, b] = softmax_i(q[i, b] / temperature); the dual (the paper's eq. 9, per state,
    averaged over the batch) is
    temperature * (epsilon + mean_b(log mean_i exp(q[i, b] / temperature))),
    whose minimum over the temperature bounds the KL of the reweighted policy from the one
    that sampled the actions by `epsilon`.

    Args:
      q: [N, B] the critic's values of the N sampled actions at each of the B states.
      temperature: [] positive; gradients flow into it through the loss only.
      epsilon: the KL bound.

    Returns:
      ([N, B] the weights, no gradient; [] the dual loss).
    """
    chex.assert_rank([q, temperature], [2, 0])
    scaled = jax.lax.stop_gradient(q) / temperature
    log_normaliser = jax.scipy.special.logsumexp(scaled, axis=0)  # [B]
    weights = jax.lax.stop_gradient(jax.nn.softmax(scaled, axis=0))
    loss = temperature * (epsilon + jnp.mean(log_normaliser) - math.log(q.shape[0]))
    return weights, loss


def gaussian_kl(mean_p: jax.Array, std_p: jax.Array, mean_q: jax.Array,
                std_q: jax.Array) -> jax.Array:
    """KL(N(mean_p, std_p^2) || N(mean_q, std_q^2)) per dimension, elementwise."""
    return (jnp.log(std_q / std_p) + (jnp.square(std_p) + jnp.square(mean_p - mean_q))
            / (2.0 * jnp.square(std_q)) - 0.5)


def decoupled_kl(target_mean: jax.Array, target_std: jax.Array, online_mean: jax.Array,
                 online_std: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The decoupled KLs from the target policy, per dimension [..., D]: of the Gaussian with
    the online mean and the target's std, (mu_t - mu)^2 / (2 sigma_t^2), and of the one with
    the target's mean and the online std, which depends on the std alone."""
    kl_mean = gaussian_kl(target_mean, target_std, online_mean, target_std)
    kl_std = gaussian_kl(target_mean, target_std, target_mean, online_std)
    return kl_mean, kl_std


def kl_penalty_and_dual_loss(kl: jax.Array, alpha: jax.Array,
                             epsilon: float) -> tuple[jax.Array, jax.Array]:
    """One KL constraint's two terms (the paper's eq. 12 as a Lagrangian): the policy's penalty
    mean_b(sum_d alpha_d kl[b, d]) (alpha a constant), and the multiplier's dual loss
    mean_b(sum_d alpha_d (epsilon - kl[b, d])) (kl a constant), which raises alpha while the
    KL exceeds its bound and lowers it while the KL is within.

    Args:
      kl: [B, D] the KL per state and action dimension.
      alpha: [D] one multiplier per dimension, or [] one for all.
      epsilon: the bound, per dimension when alpha is.

    Returns:
      ([] the penalty, [] the dual loss).
    """
    chex.assert_rank(kl, 2)
    penalty = jnp.mean(jnp.sum(jax.lax.stop_gradient(alpha) * kl, axis=-1))
    dual_loss = jnp.mean(jnp.sum(alpha * (epsilon - jax.lax.stop_gradient(kl)), axis=-1))
    return penalty, dual_loss


def gaussian_log_prob(mean: jax.Array, std: jax.Array, x: jax.Array) -> jax.Array:
    """log N(x; mean, diag(std^2)), [..., D] -> [...]."""
    return jnp.sum(-0.5 * jnp.square((x - mean) / std) - jnp.log(std)
                   - 0.5 * math.log(2.0 * math.pi), axis=-1)


def policy_loss(actions: jax.Array, q: jax.Array, online_mean: jax.Array,
                online_std: jax.Array, target_mean: jax.Array, target_std: jax.Array,
                duals: Duals, epsilons: Epsilons, action_penalization: bool
                ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """MPO's policy and dual loss on one minibatch: E-step weights, the decoupled weighted
    maximum likelihood of the samples, the two KL penalties and every multiplier's dual loss.

    With `action_penalization` (Acme's default, from MO-MPO, Abdolmaleki et al., 2020), a
    second E-step weighs the same samples by how little they leave [-1, 1] (the cost
    -||a - clip(a, -1, 1)||), with its own temperature under `epsilon_penalty`, and its
    weights add to the critic's: the Gaussian is kept within the bounds without a squash.

    Args:
      actions: [N, B, D] the actions sampled from the target policy at the B states.
      q: [N, B] the target critic's values of them.
      online_mean, online_std: [B, D] the online policy at the states (differentiable).
      target_mean, target_std: [B, D] the target policy that sampled the actions.
      duals: the raw multipliers (differentiable).
      epsilons: the constraints' bounds.
      action_penalization: add the out-of-bounds E-step.

    Returns:
      ([] the loss to minimise in both the policy's params and the duals, metrics).
    """
    chex.assert_rank([actions, q, online_mean, online_std, target_mean, target_std],
                     [3, 2, 2, 2, 2, 2])
    temperature = dual(duals.temperature)
    weights, temperature_loss = weights_and_temperature_loss(q, temperature, epsilons.epsilon)
    if action_penalization:
        cost = -jnp.linalg.norm(actions - jnp.clip(actions, -1.0, 1.0), axis=-1)  # [N, B]
        penalty_weights, penalty_loss = weights_and_temperature_loss(
            cost, dual(duals.penalty_temperature), epsilons.epsilon_penalty)
        weights, temperature_loss = weights + penalty_weights, temperature_loss + penalty_loss
    # The decoupled M-step: each half of the online Gaussian is fitted with the other half
    # held at the target's, so each moves within its own KL bound.
    target_mean, target_std, actions = jax.lax.stop_gradient((target_mean, target_std, actions))
    log_prob_mean = gaussian_log_prob(online_mean, target_std, actions)  # [N, B]
    log_prob_std = gaussian_log_prob(target_mean, online_std, actions)
    fit_mean = -jnp.mean(jnp.sum(weights * log_prob_mean, axis=0))
    fit_std = -jnp.mean(jnp.sum(weights * log_prob_std, axis=0))
    kl_mean, kl_std = decoupled_kl(target_mean, target_std, online_mean, online_std)
    penalty_mean, alpha_mean_loss = kl_penalty_and_dual_loss(
        kl_mean, dual(duals.alpha_mean), epsilons.epsilon_mean)
    penalty_std, alpha_std_loss = kl_penalty_and_dual_loss(
        kl_std, dual(duals.alpha_std), epsilons.epsilon_stddev)
    loss = (fit_mean + fit_std + penalty_mean + penalty_std
            + temperature_loss + alpha_mean_loss + alpha_std_loss)
    metrics = {"policy_loss": fit_mean + fit_std, "temperature": temperature,
               "temperature_loss": temperature_loss, "kl_mean": jnp.mean(jnp.sum(kl_mean, -1)),
               "kl_std": jnp.mean(jnp.sum(kl_std, -1)),
               "alpha_mean": jnp.mean(dual(duals.alpha_mean)),
               "alpha_std": jnp.mean(dual(duals.alpha_std)),
               "policy_std": jnp.mean(online_std)}
    return loss, metrics


def critic_target(r_t: jax.Array, discount_t: jax.Array, q_t: jax.Array) -> jax.Array:
    """The n-step target r_t + discount_t * mean_i Q'(s_t, a_i), a_i ~ pi'(. | s_t): the
    target critic's expected value under the target policy, estimated by the E-step's samples.

    Args:
      r_t: [B] the n-step rewards.
      discount_t: [B] the bootstrap discounts (0 after a termination).
      q_t: [N, B] the target critic at the samples.

    Returns:
      [B] the targets, no gradient.
    """
    chex.assert_rank([r_t, discount_t, q_t], [1, 1, 2])
    return jax.lax.stop_gradient(r_t + discount_t * jnp.mean(q_t, axis=0))
