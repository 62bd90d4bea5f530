"""Torsos: an MLP for vectors, conv stacks for frames, and `make_torso`, which picks one."""


from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from trellis.envs.specs import EnvSpec


class MLPTorso(nn.Module):
    """Tanh MLP on flattened vector observations."""

    hidden_sizes: Sequence[int]

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:  # [..., D]
        x = x.reshape(x.shape[: x.ndim - 1] + (-1,)).astype(jnp.float32)
        for size in self.hidden_sizes:
            x = nn.tanh(nn.Dense(size)(x))
        return x


def _frames(x: jax.Array, channels_first: bool) -> jax.Array:
    """uint8 frames [..., H, W, C] or [..., C, H, W] as floats in [0, 1], [N, H, W, C]."""
    x = x.reshape((-1,) + x.shape[-3:]).astype(jnp.float32) / 255.0
    return jnp.moveaxis(x, 1, -1) if channels_first else x


class ConvTorso(nn.Module):
    """The small DQN-style conv torso for uint8 frames, [H, W, C] or [C, H, W]."""

    channels_first: bool = False
    hidden_size: int = 256

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:  # [..., H, W, C] or [..., C, H, W]
        batch_shape = x.shape[:-3]
        x = _frames(x, self.channels_first)
        x = nn.relu(nn.Conv(16, (8, 8), strides=(4, 4))(x))
        x = nn.relu(nn.Conv(32, (4, 4), strides=(2, 2))(x))
        x = x.reshape((x.shape[0], -1))
        x = nn.relu(nn.Dense(self.hidden_size)(x))
        return x.reshape(batch_shape + (self.hidden_size,))


class ResidualBlock(nn.Module):
    """relu, conv 3x3, relu, conv 3x3, plus the input (Espeholt et al., 2018, Figure 3)."""

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:  # [N, H, W, C]
        channels = x.shape[-1]
        y = nn.Conv(channels, (3, 3))(nn.relu(x))
        y = nn.Conv(channels, (3, 3))(nn.relu(y))
        return x + y


class ImpalaResNetTorso(nn.Module):
    """The deep residual torso of the IMPALA paper (Espeholt et al., 2018, Figure 3, right).

    Three sections of conv 3x3 + max-pool 3x3 stride 2 + two residual blocks, with 16, 32
    and 32 channels, then relu and a Dense layer of `hidden_size` (256 in the paper), for
    uint8 frames [H, W, C] or [C, H, W].
    """

    channels_first: bool = False
    channels: Sequence[int] = (16, 32, 32)
    hidden_size: int = 256

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:  # [..., H, W, C] or [..., C, H, W]
        batch_shape = x.shape[:-3]
        x = _frames(x, self.channels_first)
        for channels in self.channels:
            x = nn.Conv(channels, (3, 3))(x)
            x = nn.max_pool(x, (3, 3), strides=(2, 2), padding="SAME")
            x = ResidualBlock()(x)
            x = ResidualBlock()(x)
        x = nn.relu(x).reshape((x.shape[0], -1))
        x = nn.relu(nn.Dense(self.hidden_size)(x))
        return x.reshape(batch_shape + (self.hidden_size,))


class MinAtarTorso(nn.Module):
    """The MinAtar paper's network body (Young & Tian, 2019): one conv 3x3, 16 channels, stride
    1, unpadded (PyTorch's default, as in the paper's code), then a Dense layer of
    `hidden_size` (128 in the paper), both relu, for MinAtar's 10x10xC grids of 0/1 planes
    (uint8 or float32). It takes the planes unscaled: dividing by 255 as for camera frames
    would shrink them to ~0.004; and a stride-4 8x8 conv (the "nature" torso) would see the
    10x10 grid in 3x3 blurs."""

    hidden_size: int = 128

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:  # [..., H, W, C]
        batch_shape = x.shape[:-3]
        x = x.reshape((-1,) + x.shape[-3:]).astype(jnp.float32)
        x = nn.relu(nn.Conv(16, (3, 3), strides=(1, 1), padding="VALID")(x))
        x = nn.relu(nn.Dense(self.hidden_size)(x.reshape((x.shape[0], -1))))
        return x.reshape(batch_shape + (self.hidden_size,))


def channels_first(spec: EnvSpec) -> bool:
    """Whether pixel observations put channels first."""
    # Frames are wider than deep: ALE's vector env stacks [4, 84, 84], wrappers give HWC.
    return spec.observation_shape[0] < spec.observation_shape[-1]


# The `pixel_torso` settings' values (agents/impala/config.py, agents/ppo/config.py).
PIXEL_TORSOS = ("nature", "resnet", "minatar")


def make_torso(spec: EnvSpec, hidden_sizes: Sequence[int], pixel_torso: str = "nature"
               ) -> nn.Module:
    """For pixel observations the conv torso `pixel_torso` names: "nature" (`ConvTorso`, the
    DQN paper's), "resnet" (`ImpalaResNetTorso`, the IMPALA paper's) or "minatar"
    (`MinAtarTorso`, the MinAtar paper's); otherwise an MLP with `hidden_sizes`.

    Raises:
      ValueError: an unknown `pixel_torso`.
    """
    if pixel_torso not in PIXEL_TORSOS:
        raise ValueError(f"pixel_torso {pixel_torso!r}: expected one of {PIXEL_TORSOS}")
    if not spec.pixels:
        return MLPTorso(tuple(hidden_sizes))
    if pixel_torso == "minatar":
        return MinAtarTorso()
    if pixel_torso == "resnet":
        return ImpalaResNetTorso(channels_first=channels_first(spec))
    return ConvTorso(channels_first=channels_first(spec))
