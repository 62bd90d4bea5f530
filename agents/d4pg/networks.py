"""D4PG networks: a deterministic policy squashed into the env's bounds and one critic whose
outputs are the logits of a categorical return distribution (agents/common/continuous.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import jax
import numpy as np

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
class D4PGNetworks:
    """Pure functions: `init_policy(key)`, `init_critic(key)` -> params;
    `policy(params, obs)` -> the action in bounds [..., D]; `critic(params, obs, action)` ->
    logits [..., K] over `atoms` [K]."""

    init_policy: Callable[[jax.Array], Params]
    init_critic: Callable[[jax.Array], Params]
    policy: Callable[[Params, jax.Array], jax.Array]
    critic: Callable[[Params, jax.Array, jax.Array], jax.Array]
    atoms: np.ndarray
    bounds: Bounds
    action_dim: int


def make_networks(spec: EnvSpec, hidden_sizes: Sequence[int], num_atoms: int, v_min: float,
                  v_max: float) -> D4PGNetworks:
    """Networks for flat vector observations and flat, bounded Box actions.

    Raises:
      ValueError: discrete or non-flat actions, infinite bounds, or pixel observations.
    """
    action_dim = continuous_action_dim(spec, "D4PG")
    bounds = Bounds(*action_bounds(spec, "D4PG"))
    policy = DeterministicPolicy(tuple(hidden_sizes), action_dim)
    critic = Critics(tuple(hidden_sizes), num_critics=1, num_outputs=num_atoms)
    init_policy, init_critic = actor_critic_inits(spec, action_dim, policy, critic)
    return D4PGNetworks(
        init_policy=init_policy,
        init_critic=init_critic,
        policy=lambda params, obs: bounds.squash(pure_apply(policy)(params, obs)),
        critic=lambda params, obs, action: pure_apply(critic)(params, obs, action)[..., 0, :],
        atoms=np.linspace(v_min, v_max, num_atoms, dtype=np.float32),
        bounds=bounds,
        action_dim=action_dim,
    )
