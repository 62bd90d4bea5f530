"""OpenAI-ES as pure functions (Salimans et al., 2017, "Evolution Strategies as a Scalable
Alternative to Reinforcement Learning", Algorithms 1 and 2).

Common random numbers: the noise of antithetic pair j in generation g is a pure function of
(noise key, g, j) (`pair_noise`), so member i = 2j (+noise) or 2j + 1 (-noise) can be rebuilt
anywhere from the seed; only seeds go out to workers and only scalar fitnesses come back.
Fitness is maximised.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp


def centered_ranks(fitness: jax.Array) -> jax.Array:
    """Fitness shaping: each value's rank scaled to [-0.5, 0.5] (ties by index, as in the
    paper's code), so the update ignores the fitness scale and outliers."""
    chex.assert_rank(fitness, 1)
    size = fitness.shape[0]
    ranks = jnp.argsort(jnp.argsort(fitness))  # [N]: 0 for the lowest.
    return ranks.astype(jnp.float32) / (size - 1) - 0.5


def generation_key(key: jax.Array, generation: jax.Array) -> jax.Array:
    """The key of a generation's draws, from the run's noise key."""
    return jax.random.fold_in(key, generation)


def pair_noise(key: jax.Array, generation: jax.Array, num_pairs: int, dim: int) -> jax.Array:
    """eps_j ~ N(0, I), [P, D]: pair j's noise in `generation`, each row from its own key."""
    key = generation_key(key, generation)
    return jax.vmap(lambda j: jax.random.normal(jax.random.fold_in(key, j), (dim,)))(
        jnp.arange(num_pairs))


def antithetic(noise: jax.Array) -> jax.Array:
    """[P, D] -> [2P, D]: member 2j gets +eps_j, member 2j + 1 gets -eps_j."""
    return jnp.stack([noise, -noise], axis=1).reshape(-1, noise.shape[-1])


def gradient_estimate(shaped: jax.Array, noise: jax.Array, sigma: float) -> jax.Array:
    """The ascent direction 1/(N sigma) sum_i F_i eps_i over antithetic members, [D].

    Args:
      shaped: [N] shaped fitness (`centered_ranks`), member 2j with +eps_j, 2j + 1 with -eps_j.
      noise: [N / 2, D] the pairs' eps_j.
      sigma: the noise's standard deviation.
    """
    chex.assert_rank([shaped, noise], [1, 2])
    chex.assert_equal(shaped.shape[0], 2 * noise.shape[0])
    weights = shaped[0::2] - shaped[1::2]  # [P]: F(+eps_j) - F(-eps_j).
    return weights @ noise / (shaped.shape[0] * sigma)


def descent_direction(gradient: jax.Array, mean: jax.Array, weight_decay: float) -> jax.Array:
    """What the optimizer minimises along: minus the ascent estimate, plus the L2 term."""
    return -gradient + weight_decay * mean
