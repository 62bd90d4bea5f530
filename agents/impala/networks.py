"""IMPALA networks: a shared torso with a policy head (logits) and a value head."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from envs.specs import EnvSpec


class MLPTorso(nn.Module):
    hidden_sizes: Sequence[int]

    @nn.compact
    def __call__(self, x):  # [..., D]
        x = x.reshape(x.shape[: x.ndim - 1] + (-1,)).astype(jnp.float32)
        for size in self.hidden_sizes:
            x = nn.tanh(nn.Dense(size)(x))
        return x


class ConvTorso(nn.Module):
    """The small DQN-style conv torso for uint8 frames, [H, W, C] or [C, H, W]."""

    channels_first: bool = False
    hidden_size: int = 256

    @nn.compact
    def __call__(self, x):  # [..., H, W, C] or [..., C, H, W]
        batch_shape = x.shape[:-3]
        x = x.reshape((-1,) + x.shape[-3:]).astype(jnp.float32) / 255.0
        if self.channels_first:
            x = jnp.moveaxis(x, 1, -1)
        x = nn.relu(nn.Conv(16, (8, 8), strides=(4, 4))(x))
        x = nn.relu(nn.Conv(32, (4, 4), strides=(2, 2))(x))
        x = x.reshape((x.shape[0], -1))
        x = nn.relu(nn.Dense(self.hidden_size)(x))
        return x.reshape(batch_shape + (self.hidden_size,))


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
    if spec.pixels:
        # Frames are wider than deep: ALE's vector env stacks [4, 84, 84], wrappers give HWC.
        channels_first = spec.observation_shape[0] < spec.observation_shape[-1]
        torso = ConvTorso(channels_first=channels_first)
    else:
        torso = MLPTorso(tuple(hidden_sizes))
    net = PolicyValueNet(spec.num_actions, torso)
    dummy = jnp.zeros((1,) + spec.observation_shape, spec.observation_dtype)
    return ImpalaNetworks(init=lambda key: net.init(key, dummy), apply=net.apply)
