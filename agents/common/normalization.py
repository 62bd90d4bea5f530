"""Observation normalization: running moments kept in the params' `obs_norm` collection."""


from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

OBS_NORM = "obs_norm"  # The flax collection of the running moments, beside "params".


def initial_moments(shape: Sequence[int]) -> dict[str, jax.Array]:
    """Running moments {"count": [], "mean", "var": shape} of no data: mean 0 and variance 1,
    so normalizing with them leaves observations unchanged."""
    return {"count": jnp.zeros((), jnp.float32), "mean": jnp.zeros(shape, jnp.float32),
            "var": jnp.ones(shape, jnp.float32)}


def update_moments(moments: Mapping[str, jax.Array], x: jax.Array) -> dict[str, jax.Array]:
    """`moments` with the samples `x` [..., *shape] merged in (Chan et al., 1979, the parallel
    variance formula), so the result is the population mean and variance of all samples."""
    shape = moments["mean"].shape
    x = x.reshape((-1,) + shape).astype(jnp.float32)
    n_a, n_b = moments["count"], x.shape[0]
    n = n_a + n_b
    delta = jnp.mean(x, axis=0) - moments["mean"]
    m2 = moments["var"] * n_a + jnp.var(x, axis=0) * n_b + jnp.square(delta) * n_a * n_b / n
    return {"count": n, "mean": moments["mean"] + delta * n_b / n, "var": m2 / n}


def observe(params: Mapping[str, Any], obs: jax.Array) -> dict[str, Any]:
    """`params` with every normalizer's moments (`OBS_NORM`) merged with `obs` [..., *shape];
    `params` unchanged when they hold none. Learners call it on each batch before their loss,
    so the loss and the params published next use the same moments."""
    if OBS_NORM not in params:
        return dict(params)
    return {**params, OBS_NORM: {module: update_moments(m, obs)  # {"normalizer": moments}
                                 for module, m in params[OBS_NORM].items()}}


def keep_moments(new_params: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
    """`new_params` (after an optimizer step) with `params`' moments: their gradient is zero
    (the normalizer stops it), but no optimizer update is theirs to apply; they stay exactly
    the moments of the data."""
    if OBS_NORM not in params:
        return dict(new_params)
    return {**new_params, OBS_NORM: params[OBS_NORM]}


class ObservationNormalizer(nn.Module):
    """(obs - mean) / sqrt(var + 1e-8), clipped to +-`clip`, with the moments held in the
    collection `OBS_NORM` (`initial_moments`), which the learner updates from its batches.

    The moments are inputs, not trained: no gradient flows into them.
    """

    shape: Sequence[int]
    clip: float = 10.0

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:  # [..., *shape]
        moments = {name: jax.lax.stop_gradient(self.variable(OBS_NORM, name, jnp.asarray, v).value)
                   for name, v in initial_moments(tuple(self.shape)).items()}
        z = (x.astype(jnp.float32) - moments["mean"]) * jax.lax.rsqrt(moments["var"] + 1e-8)
        return jnp.clip(z, -self.clip, self.clip)
