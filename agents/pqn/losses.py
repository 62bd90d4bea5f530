"""PQN's loss. Its Q(lambda) targets and epsilon's schedule are agents/common/q_learning.py's
(shared with QMIX/VDN).

Gallici et al., 2024, "Simplifying Deep Temporal Difference Learning",
https://arxiv.org/abs/2407.04811 (Algorithm 1 and its appendix's Q(lambda) targets: Peng's
Q(lambda), Peng & Williams, 1996, with the max over actions as the bootstrap at every step).
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp


def q_loss(q_values: jax.Array, action: jax.Array, target: jax.Array, mask: jax.Array
           ) -> jax.Array:
    """Half the mean squared TD error of the actions taken, over the real transitions
    (the paper's loss: no Huber, no target network).

    Args:
      q_values: [N, A] Q(x, .) of the learner's params.
      action: [N] the actions taken.
      target: [N] their Q(lambda) targets.
      mask: [N] 1 for transitions to learn from, 0 to ignore.
    """
    chex.assert_rank([q_values, action, target, mask], [2, 1, 1, 1])
    chex.assert_equal_shape([action, target, mask])
    q_taken = jnp.take_along_axis(q_values, action[:, None].astype(jnp.int32), -1)[:, 0]
    error = q_taken - jax.lax.stop_gradient(target)
    return 0.5 * jnp.sum(mask * error**2) / jnp.maximum(jnp.sum(mask), 1.0)
