"""QMIX's and VDN's pure pieces: the team's transition from a multi-agent step, and the TD
loss of the team's Q. The Q(lambda) targets and epsilon are agents/common/q_learning.py's."""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp

from trellis.envs.multi_agent import MultiAgentStep, episode_done


def team_step(step: MultiAgentStep, agents: tuple[str, ...]
              ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """How the team reached `step` (leaves [...]): (reward, terminated, truncated).

    The team's reward is the sum of its agents' (what Trellis's multi-agent return counts,
    envs/jax_multi_agent.TeamEnv); its episode ends when no agent acts any more, truncated if
    an agent's end was a truncation (a time limit: bootstrap), else terminated.
    """
    done = episode_done(step, agents) & ~step.first
    truncated = done & functools.reduce(jnp.logical_or, (step.truncated[a] for a in agents))
    reward = functools.reduce(jnp.add, (step.reward[a].astype(jnp.float32) for a in agents))
    return reward, done & ~truncated, truncated


def chosen_q(q_values: jax.Array, action: jax.Array) -> jax.Array:
    """Q(o, a) of the actions taken: [N, A], [N] -> [N]."""
    chex.assert_rank([q_values, action], [2, 1])
    return jnp.take_along_axis(q_values, action[:, None].astype(jnp.int32), -1)[:, 0]


def team_q_loss(q_tot: jax.Array, target: jax.Array, mask: jax.Array) -> jax.Array:
    """Half the mean squared TD error of the team's Q of the joint action taken, over the real
    transitions (PQN's loss, on the team: no Huber, no target network).

    Args:
      q_tot: [N] Q_tot(s, a_1..a_n) of the learner's params.
      target: [N] its Q(lambda) target.
      mask: [N] 1 for transitions to learn from, 0 to ignore.
    """
    chex.assert_rank([q_tot, target, mask], 1)
    chex.assert_equal_shape([q_tot, target, mask])
    error = q_tot - jax.lax.stop_gradient(target)
    return 0.5 * jnp.sum(mask * error**2) / jnp.maximum(jnp.sum(mask), 1.0)
