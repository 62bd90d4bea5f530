"""D4PG losses (Barth-Maron et al., 2018): pure functions on single transitions (vmap for
batches), in rlax style; `_tm1` is the transition's start, `_t` its bootstrap observation."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import rlax


def critic_loss(atoms: chex.Array, logits_tm1: jax.Array, r_t: jax.Array,
                discount_t: jax.Array, logits_t: jax.Array) -> jax.Array:
    """The distributional Bellman loss (eq. 4 with the N-step target of eq. 7): the
    cross-entropy of Z(s_tm1, a_tm1) against r_t + discount_t Z'(s_t, mu'(s_t)) projected
    onto the atoms (rlax's categorical TD learning, Bellemare et al., 2017).

    Args:
      atoms: [K] the return atoms.
      logits_tm1: [K] the online critic's logits at (s_tm1, a_tm1).
      r_t: [] the N-step reward.
      discount_t: [] the bootstrap discount gamma^N (0 after a termination).
      logits_t: [K] the target critic's logits at (s_t, mu'(s_t)).

    Returns:
      [] the loss, with no gradient into the target.
    """
    chex.assert_rank([atoms, logits_tm1, r_t, discount_t, logits_t], [1, 1, 0, 0, 1])
    # rlax annotates its result as any array (numpy's too); from JAX inputs it is JAX's.
    return jnp.asarray(rlax.categorical_td_learning(atoms, logits_tm1, r_t, discount_t, atoms,
                                                    jax.lax.stop_gradient(logits_t)))


def actor_loss(atoms: chex.Array, logits: jax.Array) -> jax.Array:
    """-E[Z(s, mu(s))], the deterministic policy gradient on the distribution's mean (eq. 6).

    Args:
      atoms: [K] the return atoms.
      logits: [K] the critic's logits at (s, mu(s)), differentiable in mu(s).

    Returns:
      [] the loss.
    """
    chex.assert_rank([atoms, logits], 1)
    return -jnp.sum(jax.nn.softmax(logits) * atoms)
