"""SAC networks: a tanh-squashed Gaussian policy and twin Q critics on MLP torsos.

The policy outputs a Gaussian over pre-squash actions u; the env gets
a = offset + scale * tanh(u), which maps the real line onto the env's bounds
(Haarnoja et al., 2018, Appendix C, "Enforcing Action Bounds").
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from trellis.agents.common import MLPTorso, diagonal_gaussian_log_prob
from trellis.agents.common.continuous import (
    Bounds,
    Critics,
    action_bounds,
    actor_critic_inits,
    continuous_action_dim,
)
from trellis.agents.common.params import Params, pure_apply
from trellis.envs.specs import EnvSpec


@dataclasses.dataclass(frozen=True)
class TanhGaussian(Bounds):
    """Diagonal Gaussian over u, squashed to a = offset + scale * tanh(u) in [low, high]."""

    def log_prob(self, mean: jax.Array, log_std: jax.Array, u: jax.Array) -> jax.Array:
        """log pi(a) of a = squash(u), [..., D] -> [...]: the Gaussian's log density at u minus
        log |da/du| = sum log(scale * (1 - tanh(u)^2)) (the paper's eq. 21).

        log(1 - tanh(u)^2) is computed as 2 (log 2 - u - softplus(-2u)), which stays finite
        where tanh(u) rounds to +-1.
        """
        log_det = jnp.log(self.scale) + 2.0 * (math.log(2.0) - u - jax.nn.softplus(-2.0 * u))
        return diagonal_gaussian_log_prob(mean, log_std, u) - jnp.sum(log_det, axis=-1)

    def sample(self, key: jax.Array, mean: jax.Array,
               log_std: jax.Array) -> tuple[jax.Array, jax.Array]:
        """A reparameterised sample (differentiable in mean and log_std) and its log-prob."""
        u = mean + jnp.exp(log_std) * jax.random.normal(key, mean.shape, mean.dtype)
        return self.squash(u), self.log_prob(mean, log_std, u)

    def mode(self, mean: jax.Array) -> jax.Array:
        """The squashed mean: the deterministic action used for evaluation."""
        return self.squash(mean)


class Policy(nn.Module):
    """obs -> (mean, log_std) of the pre-squash Gaussian, each [..., D]."""

    hidden_sizes: Sequence[int]
    action_dim: int
    log_std_min: float
    log_std_max: float

    @nn.compact
    def __call__(self, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        out = nn.Dense(2 * self.action_dim)(MLPTorso(tuple(self.hidden_sizes))(obs))
        mean, log_std = jnp.split(out, 2, axis=-1)
        # Starts near log_std 0: a broad policy, so the first data already covers the bounds.
        return mean, jnp.clip(log_std, self.log_std_min, self.log_std_max)


@dataclasses.dataclass(frozen=True)
class SACNetworks:
    """Pure functions and the action distribution.

    `init_policy(key)`, `init_critic(key)` -> params; `policy(params, obs)` -> (mean, log_std);
    `critic(params, obs, action)` -> Q [..., 2].
    """

    init_policy: Callable[[jax.Array], Params]
    init_critic: Callable[[jax.Array], Params]
    policy: Callable[[Params, jax.Array], tuple[jax.Array, jax.Array]]
    critic: Callable[[Params, jax.Array, jax.Array], jax.Array]
    distribution: TanhGaussian
    action_dim: int


def make_networks(spec: EnvSpec, hidden_sizes: Sequence[int], log_std_min: float,
                  log_std_max: float) -> SACNetworks:
    """Networks for flat vector observations and flat, bounded Box actions.

    Raises:
      ValueError: discrete or non-flat actions, infinite bounds, or pixel observations.
    """
    action_dim = continuous_action_dim(spec, "SAC")
    policy = Policy(tuple(hidden_sizes), action_dim, log_std_min, log_std_max)
    critic = Critics(tuple(hidden_sizes), num_critics=2)
    init_policy, init_critic = actor_critic_inits(spec, action_dim, policy, critic)
    return SACNetworks(
        init_policy=init_policy,
        init_critic=init_critic,
        policy=pure_apply(policy),
        critic=pure_apply(critic),
        distribution=TanhGaussian(*action_bounds(spec, "SAC")),
        action_dim=action_dim,
    )
