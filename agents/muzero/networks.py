"""MuZero's learned model (Schrittwieser et al., 2020): representation h(obs) -> latent,
dynamics g(latent, action) -> (latent', reward), prediction f(latent) -> (policy, value).

Each is a ReLU MLP. The latent is min-max scaled to [0, 1] per position wherever it is made
(the paper's appendix G: it keeps the dynamics' inputs in the range of the representation's).
Reward and value are tanh scalars in [-1, 1], for the player who moved and the player to move:
a board game's outcomes (the paper's board games use a scalar value in [-1, 1] too).
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from trellis.envs.specs import EnvSpec


def scale_latent(latent: jax.Array) -> jax.Array:
    """`latent` [N, L] min-max scaled to [0, 1] per position (a constant one to 0)."""
    low = latent.min(axis=-1, keepdims=True)
    high = latent.max(axis=-1, keepdims=True)
    return (latent - low) / jnp.maximum(high - low, 1e-8)


class _Mlp(nn.Module):
    """ReLU layers of `hidden_sizes`, then a linear layer of `size` units."""

    hidden_sizes: Sequence[int]
    size: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        for width in self.hidden_sizes:
            x = nn.relu(nn.Dense(width)(x))
        return nn.Dense(self.size)(x)


class MuZeroNet(nn.Module):
    """The three networks; `initial_inference` and `recurrent_inference` are the paper's
    (apply them with `method=`), `__call__` both, to initialize every parameter."""

    num_actions: int
    hidden_sizes: Sequence[int]
    latent_size: int

    def setup(self) -> None:
        self.representation = _Mlp(self.hidden_sizes, self.latent_size)
        self.dynamics = _Mlp(self.hidden_sizes, self.latent_size + 1)  # Latent', reward.
        self.prediction = _Mlp(self.hidden_sizes, self.num_actions + 1)  # Logits, value.

    def predict(self, latent: jax.Array) -> tuple[jax.Array, jax.Array]:
        """f: (policy logits [N, A], value [N] for the player to move)."""
        out = self.prediction(latent)
        return out[:, :-1], jnp.tanh(out[:, -1])

    def initial_inference(self, obs: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """h then f: (latent [N, L], logits [N, A], value [N]) of observations [N, ...]."""
        latent = scale_latent(self.representation(
            obs.reshape(obs.shape[0], -1).astype(jnp.float32)))
        return (latent, *self.predict(latent))

    def recurrent_inference(self, latent: jax.Array, action: jax.Array
                            ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
        """g then f: (latent' [N, L], reward [N] for the mover, logits [N, A], value [N])
        after `action` [N] from `latent` [N, L]."""
        moved = jax.nn.one_hot(action, self.num_actions, dtype=latent.dtype)
        out = self.dynamics(jnp.concatenate([latent, moved], axis=-1))
        after = scale_latent(out[:, :-1])
        return (after, jnp.tanh(out[:, -1]), *self.predict(after))

    def __call__(self, obs: jax.Array, action: jax.Array
                 ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
        latent, _, _ = self.initial_inference(obs)
        return self.recurrent_inference(latent, action)


def make_networks(spec: EnvSpec, hidden_sizes: Sequence[int], latent_size: int) -> MuZeroNet:
    """The model for a game with `spec` (batched inputs [N, *observation_shape])."""
    assert spec.num_actions is not None  # pgx's games have discrete actions.
    return MuZeroNet(spec.num_actions, tuple(hidden_sizes), latent_size)
