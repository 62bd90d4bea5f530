"""TD3 networks: a deterministic policy squashed into the env's bounds and one or two
critics on MLP torsos (agents/common/continuous.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import jax

from trellis.agents.common.continuous import (
    Bounds,
    Critics,
    DeterministicPolicy,
    action_bounds,
    actor_critic_inits,
    continuous_action_dim,
)
from trellis.agents.common.params import Params, pure_apply
from trellis.envs.specs import EnvSpec


@dataclasses.dataclass(frozen=True)
class TD3Networks:
    """Pure functions: `init_policy(key)`, `init_critic(key)` -> params;
    `policy(params, obs)` -> the action in bounds [..., D]; `critic(params, obs, action)` ->
    Q [..., N] (N = 2 with clipped double Q, else 1)."""

    init_policy: Callable[[jax.Array], Params]
    init_critic: Callable[[jax.Array], Params]
    policy: Callable[[Params, jax.Array], jax.Array]
    critic: Callable[[Params, jax.Array, jax.Array], jax.Array]
    bounds: Bounds
    action_dim: int


def make_networks(spec: EnvSpec, hidden_sizes: Sequence[int], num_critics: int,
                  agent: str = "TD3") -> TD3Networks:
    """Networks for flat vector observations and flat, bounded Box actions.

    Raises:
      ValueError: discrete or non-flat actions, infinite bounds, or pixel observations.
    """
    action_dim = continuous_action_dim(spec, agent)
    bounds = Bounds(*action_bounds(spec, agent))
    policy = DeterministicPolicy(tuple(hidden_sizes), action_dim)
    critic = Critics(tuple(hidden_sizes), num_critics=num_critics)
    init_policy, init_critic = actor_critic_inits(spec, action_dim, policy, critic)
    return TD3Networks(
        init_policy=init_policy,
        init_critic=init_critic,
        policy=lambda params, obs: bounds.squash(pure_apply(policy)(params, obs)),
        critic=pure_apply(critic),
        bounds=bounds,
        action_dim=action_dim,
    )
