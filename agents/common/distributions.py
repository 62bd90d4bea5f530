"""Distributions the agents share beyond distrax's: the diagonal Gaussian's log-density."""


from __future__ import annotations

import math

import jax
import jax.numpy as jnp


def diagonal_gaussian_log_prob(mean: jax.Array, log_std: jax.Array, x: jax.Array) -> jax.Array:
    """log N(x; mean, diag(exp(log_std)^2)), summed over the last axis: [..., D] -> [...]."""
    z = (x - mean) * jnp.exp(-log_std)
    return -jnp.sum(0.5 * jnp.square(z) + log_std + 0.5 * math.log(2 * math.pi), axis=-1)
