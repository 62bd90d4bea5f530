"""MPO networks: a diagonal Gaussian policy over actions in half-range units ([-1, 1] spans
the env's bounds; the env gets the sample clipped into them) and one Q critic on [obs, action]
(agents/common/continuous.py), as Acme's control networks with a non-distributional critic."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from trellis.agents.common import MLPTorso
from trellis.agents.common.continuous import (
    Bounds,
    Critics,
    action_bounds,
    actor_critic_inits,
    continuous_action_dim,
)
from trellis.agents.common.params import Params, pure_apply
from trellis.envs.specs import EnvSpec


class GaussianPolicy(nn.Module):
    """obs -> (mean, std) of the Gaussian over actions in half-range units, each [..., D].

    std = softplus(x) * init_scale / softplus(0) + min_scale, so a fresh policy (x near 0)
    starts at std `init_scale` (Acme's `MultivariateNormalDiagHead`: 0.7 for control) and no
    update reaches 0.
    """

    hidden_sizes: Sequence[int]
    action_dim: int
    init_scale: float
    min_scale: float

    @nn.compact
    def __call__(self, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        x = MLPTorso(tuple(self.hidden_sizes))(obs)
        mean = nn.Dense(self.action_dim)(x)
        raw_std = nn.Dense(self.action_dim)(x)
        std = jax.nn.softplus(raw_std) * (self.init_scale / math.log(2.0)) + self.min_scale
        return mean, std


@dataclasses.dataclass(frozen=True)
class MPONetworks:
    """Pure functions: `init_policy(key)`, `init_critic(key)` -> params;
    `policy(params, obs)` -> (mean, std) [..., D] in half-range units;
    `critic(params, obs, action)` -> Q [...] of an action in the env's units;
    `to_env(a)` -> the env's action, offset + scale * clip(a, -1, 1)."""

    init_policy: Callable[[jax.Array], Params]
    init_critic: Callable[[jax.Array], Params]
    policy: Callable[[Params, jax.Array], tuple[jax.Array, jax.Array]]
    critic: Callable[[Params, jax.Array, jax.Array], jax.Array]
    bounds: Bounds
    action_dim: int

    def to_env(self, action: jax.Array) -> jax.Array:
        """Half-range units -> the env's, clipped into its bounds (the critic sees only
        actions the env could take: Acme's critic clips to the spec too)."""
        return self.bounds.offset + self.bounds.scale * jnp.clip(action, -1.0, 1.0)


def make_networks(spec: EnvSpec, hidden_sizes: Sequence[int], init_scale: float,
                  min_scale: float) -> MPONetworks:
    """Networks for flat vector observations and flat, bounded Box actions.

    Raises:
      ValueError: discrete or non-flat actions, infinite bounds, or pixel observations.
    """
    action_dim = continuous_action_dim(spec, "MPO")
    policy = GaussianPolicy(tuple(hidden_sizes), action_dim, init_scale, min_scale)
    critic = Critics(tuple(hidden_sizes), num_critics=1)
    init_policy, init_critic = actor_critic_inits(spec, action_dim, policy, critic)
    return MPONetworks(
        init_policy=init_policy,
        init_critic=init_critic,
        policy=pure_apply(policy),
        critic=lambda params, obs, action: pure_apply(critic)(params, obs, action)[..., 0],
        bounds=Bounds(*action_bounds(spec, "MPO")),
        action_dim=action_dim,
    )
