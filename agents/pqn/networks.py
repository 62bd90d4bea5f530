"""PQN's Q-networks: layer norm after every hidden layer, the paper's replacement for a
target network (Gallici et al., 2024, section 4: it keeps TD stable without one)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from trellis.agents.common.params import Params, pure_apply
from trellis.envs.specs import EnvSpec


class LayerNormMLP(nn.Module):
    """Dense, layer norm, relu per hidden layer, on flattened vector observations
    (purejaxql's gymnax network: HIDDEN_SIZE x NUM_LAYERS, NORM_TYPE layer_norm)."""

    hidden_sizes: Sequence[int]

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:  # [..., D] -> [..., H]
        x = x.reshape(x.shape[: x.ndim - 1] + (-1,)).astype(jnp.float32)
        for size in self.hidden_sizes:
            x = nn.relu(nn.LayerNorm()(nn.Dense(size)(x)))
        return x


class PatchConv(nn.Module):
    """An unpadded, stride-1 convolution computed as one matrix product over the image's
    patches (im2col), with `nn.Conv`'s params (`kernel` [k, k, C, F], `bias` [F]) and its
    output. Why: XLA's CPU backend runs a convolution's passes inside the update's loop over
    minibatches several times slower than the same arithmetic as a dot, which made the conv
    half of PQN's update time on MinAtar (docs/benchmarks.md, 2026-11-29)."""

    features: int
    kernel_size: int = 3

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:  # [N, H, W, C] -> [N, H-k+1, W-k+1, F]
        k, channels = self.kernel_size, x.shape[-1]
        kernel = self.param("kernel", nn.initializers.lecun_normal(),
                            (k, k, channels, self.features))
        bias = self.param("bias", nn.initializers.zeros_init(), (self.features,))
        height, width = x.shape[1] - k + 1, x.shape[2] - k + 1
        # The patch's (row, column, channel) order is the kernel's, so it flattens alike.
        patches = jnp.concatenate([x[:, i:i + height, j:j + width]
                                   for i in range(k) for j in range(k)], axis=-1)
        return patches @ kernel.reshape(k * k * channels, self.features) + bias


class LayerNormMinAtarTorso(nn.Module):
    """The MinAtar paper's body (Young & Tian, 2019: one unpadded 3x3 conv of 16 channels,
    then 128 units) with a layer norm after each of its two layers, as PQN's MinAtar network
    has them. The 0/1 planes go in unscaled (the layer norm after the conv makes their scale
    immaterial)."""

    hidden_size: int = 128

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:  # [..., H, W, C] -> [..., hidden]
        batch_shape = x.shape[:-3]
        x = x.reshape((-1,) + x.shape[-3:]).astype(jnp.float32)
        x = nn.relu(nn.LayerNorm()(PatchConv(16)(x)))
        x = nn.relu(nn.LayerNorm()(nn.Dense(self.hidden_size)(x.reshape((x.shape[0], -1)))))
        return x.reshape(batch_shape + (self.hidden_size,))


class QNetwork(nn.Module):
    """Q(s, .) = a linear head on the torso."""

    num_actions: int
    torso: nn.Module

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:  # [..., *obs_shape] -> [..., A]
        return nn.Dense(self.num_actions)(self.torso(obs))


@dataclasses.dataclass(frozen=True)
class PQNNetworks:
    """Pure functions: `init(key) -> params`, `apply(params, obs) -> q_values [..., A]`."""

    init: Callable[[jax.Array], Params]
    apply: Callable[[Params, jax.Array], jax.Array]
    num_actions: int


def make_networks(spec: EnvSpec, hidden_sizes: Sequence[int]) -> PQNNetworks:
    """The layer-normed MLP for vector observations, the layer-normed MinAtar torso for grids
    ([H, W, C]).

    Raises:
      ValueError: continuous actions (Q-learning needs a finite action set).
    """
    if spec.num_actions is None:
        raise ValueError("PQN needs discrete actions; use --agent=ppo or sac for Box actions.")
    torso = LayerNormMinAtarTorso() if spec.pixels else LayerNormMLP(tuple(hidden_sizes))
    net = QNetwork(spec.num_actions, torso)
    dummy = np.zeros((1,) + spec.observation_shape, spec.observation_dtype)
    return PQNNetworks(init=lambda key: net.init(key, dummy), apply=pure_apply(net),
                       num_actions=spec.num_actions)
