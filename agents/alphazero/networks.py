"""AlphaZero's network: one torso, a policy head (logits over the game's actions) and a value
head (tanh: the expected outcome for the player to move, in [-1, 1])."""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from trellis.envs.specs import EnvSpec


class PolicyValueNet(nn.Module):
    """A ReLU MLP on the flattened observation (from the player to move), two heads."""

    num_actions: int
    hidden_sizes: Sequence[int]

    @nn.compact
    def __call__(self, obs: jax.Array) -> tuple[jax.Array, jax.Array]:  # [..., *obs_shape]
        x = obs.reshape(obs.shape[0], -1).astype(jnp.float32)
        for size in self.hidden_sizes:
            x = nn.relu(nn.Dense(size)(x))
        logits = nn.Dense(self.num_actions)(x)  # [N, A]
        value = jnp.tanh(nn.Dense(1)(x))[:, 0]  # [N]
        return logits, value


def make_networks(spec: EnvSpec, hidden_sizes: Sequence[int]) -> PolicyValueNet:
    """The network for a game with `spec` (batched inputs [N, *observation_shape])."""
    assert spec.num_actions is not None  # pgx's games have discrete actions.
    return PolicyValueNet(spec.num_actions, tuple(hidden_sizes))
