"""IMPALA networks: a shared torso with a policy head (logits) and a value head."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from trellis.agents.common import make_torso
from trellis.envs.specs import EnvSpec


class PolicyValueNet(nn.Module):
    num_actions: int
    torso: nn.Module

    @nn.compact
    def __call__(self, obs):
        h = self.torso(obs)
        logits = nn.Dense(self.num_actions, kernel_init=nn.initializers.orthogonal(0.01))(h)
        value = nn.Dense(1, kernel_init=nn.initializers.orthogonal(1.0))(h)[..., 0]
        return logits, value


@dataclasses.dataclass(frozen=True)
class ImpalaNetworks:
    """Pure functions: `init(key) -> params`, `apply(params, obs) -> (logits, value)`."""

    init: Callable[[jax.Array], dict]
    apply: Callable[[dict, jax.Array], tuple[jax.Array, jax.Array]]


def make_networks(spec: EnvSpec, hidden_sizes: Sequence[int]) -> ImpalaNetworks:
    if not spec.discrete:
        raise ValueError("IMPALA here handles discrete actions; use --agent=sac or ppo for Box.")
    net = PolicyValueNet(spec.num_actions, make_torso(spec, hidden_sizes))
    dummy = jnp.zeros((1,) + spec.observation_shape, spec.observation_dtype)
    return ImpalaNetworks(init=lambda key: net.init(key, dummy), apply=net.apply)
