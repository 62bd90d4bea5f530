"""DQN networks: a torso from agents.common and a dueling head (Wang et al., 2016)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from trellis.agents.common import make_torso
from trellis.agents.common.params import Params, pure_apply
from trellis.envs.specs import EnvSpec


class DuelingQNet(nn.Module):
    """Q(s, a) = V(s) + A(s, a) - mean_a A(s, a).

    Subtracting the mean advantage makes V and A identifiable without changing the greedy
    action (Wang et al., 2016, eq. 9).
    """

    num_actions: int
    torso: nn.Module

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:  # [..., *obs_shape] -> [..., A]
        h = self.torso(obs)
        value = nn.Dense(1)(h)  # [..., 1]
        advantages = nn.Dense(self.num_actions)(h)  # [..., A]
        return value + advantages - jnp.mean(advantages, axis=-1, keepdims=True)


@dataclasses.dataclass(frozen=True)
class DQNNetworks:
    """Pure functions: `init(key) -> params`, `apply(params, obs) -> q_values [..., A]`."""

    init: Callable[[jax.Array], Params]
    apply: Callable[[Params, jax.Array], jax.Array]
    num_actions: int


def make_networks(spec: EnvSpec, hidden_sizes: Sequence[int]) -> DQNNetworks:
    """Raises ValueError for continuous actions (Q-learning needs a finite action set)."""
    if spec.num_actions is None:
        raise ValueError("DQN needs discrete actions; use --agent=ppo or sac for Box actions.")
    net = DuelingQNet(spec.num_actions, make_torso(spec, hidden_sizes))
    dummy = np.zeros((1,) + spec.observation_shape, spec.observation_dtype)
    return DQNNetworks(init=lambda key: net.init(key, dummy), apply=pure_apply(net),
                       num_actions=spec.num_actions)
