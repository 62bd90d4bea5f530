"""Pure pieces of replay-free Q-learning over parallel envs (PQN's, Gallici et al., 2024,
"Simplifying Deep Temporal Difference Learning", https://arxiv.org/abs/2407.04811): Q(lambda)
targets over an unroll, epsilon's linear schedule and epsilon-greedy acting.

PQN (agents/pqn) learns one agent's Q with them, QMIX/VDN (agents/qmix) the team's; both
test them against a float64 recursion (tests/test_pqn.py, tests/test_qmix.py).
"""

from __future__ import annotations

import dataclasses

import chex
import jax
import jax.numpy as jnp
import rlax

from trellis.builders.contract.config import MinibatchConfig, setting


def q_lambda_targets(
    reward_t: jax.Array,
    first_t: jax.Array,
    terminated_t: jax.Array,
    truncated_t: jax.Array,
    q_max_t: jax.Array,
    discount: float,
    lambda_: float,
) -> tuple[jax.Array, jax.Array]:
    """Peng's Q(lambda) targets of one unroll's transitions, and which transitions are real.

    G_s = r_s + gamma_s ((1 - lambda_s) max_a Q(x_{s+1}, a) + lambda_s G_{s+1}), with
    G_T = max_a Q(x_T, a) past the unroll. Transition s goes from x_s to x_{s+1}; the
    arguments describe x_{s+1}. A terminated x_{s+1} gives gamma_s = 0 (the target is the
    reward); a truncated one bootstraps from x_{s+1} with its trace cut (lambda_s = 0).
    Next-step autoreset makes the transition into a `first` observation fake (its action was
    ignored): it is masked out, and no trace runs into it (lambda_{s-1} = 0 before it).

    Args:
      reward_t: [T] r_s, the reward on reaching x_{s+1}.
      first_t: [T] x_{s+1} starts an episode.
      terminated_t: [T] x_{s+1} is terminal.
      truncated_t: [T] the episode was cut off at x_{s+1}.
      q_max_t: [T] max_a Q(x_{s+1}, a) (for a team, the mixed maximum).
      discount: gamma.
      lambda_: lambda (0: one-step Q-learning targets; 1: Monte Carlo returns, bootstrapped
        at the unroll's end and at truncations).

    Returns:
      (targets [T], mask [T]): float32, the targets wrapped in stop_gradient; mask 1 where
      the transition is real.
    """
    chex.assert_rank([reward_t, first_t, terminated_t, truncated_t, q_max_t], 1)
    chex.assert_equal_shape([reward_t, first_t, terminated_t, truncated_t, q_max_t])
    mask_t = 1.0 - first_t.astype(jnp.float32)
    # Whether transition s + 1 is real; past the unroll the bootstrap stands in for it.
    next_mask_t = jnp.concatenate([mask_t[1:], jnp.ones_like(mask_t[:1])])
    discount_t = discount * (1.0 - terminated_t.astype(jnp.float32))
    lambda_t = lambda_ * (1.0 - truncated_t.astype(jnp.float32)) * next_mask_t
    targets = jnp.asarray(rlax.lambda_returns(reward_t.astype(jnp.float32), discount_t,
                                              q_max_t.astype(jnp.float32), lambda_t))
    return jax.lax.stop_gradient(targets), mask_t


def linear_epsilon(env_steps: jax.Array, start: float, finish: float, decay_steps: int
                   ) -> jax.Array:
    """Epsilon after `env_steps` env steps: from `start` linearly to `finish` over
    `decay_steps`, then `finish` (`finish` throughout when `decay_steps` is 0)."""
    if decay_steps == 0:
        return jnp.full_like(env_steps, finish, jnp.float32)
    fraction = jnp.clip(env_steps.astype(jnp.float32) / decay_steps, 0.0, 1.0)
    return start + fraction * (finish - start)


def epsilon_greedy(key: jax.Array, q_values: jax.Array, epsilon: jax.Array | float
                   ) -> jax.Array:
    """[N] int32 actions from `q_values` [N, A]: uniformly random with probability `epsilon`
    (a scalar), else the argmax."""
    explore_key, action_key = jax.random.split(key)
    n, num_actions = q_values.shape
    greedy = jnp.argmax(q_values, axis=-1).astype(jnp.int32)
    explore = jax.random.uniform(explore_key, (n,)) < epsilon
    random_actions = jax.random.randint(action_key, (n,), 0, num_actions)
    return jnp.where(explore, random_actions, greedy)


@dataclasses.dataclass(frozen=True)
class QLambdaConfig(MinibatchConfig):
    """The settings that PQN and QMIX/VDN share: Q(lambda) targets over each batch of unrolls,
    several epochs of minibatches (NUM_EPOCHS, NUM_MINIBATCHES), and epsilon-greedy acting
    with a linearly decaying epsilon. Each agent redefines the defaults to its published ones;
    the declarations stay here."""

    q_lambda: float = setting(0.65, "Q(lambda)'s lambda (LAMBDA)", ge=0, le=1)
    # Epsilon falls linearly from epsilon_start to epsilon_finish over epsilon_decay_env_steps,
    # then stays (the published EPS_DECAY is a fraction of the run's steps).
    epsilon_start: float = setting(1.0, "exploration epsilon at the start (EPS_START)",
                                   ge=0, le=1)
    epsilon_finish: float = setting(0.05, "exploration epsilon after the decay (EPS_FINISH)",
                                    ge=0, le=1)
    epsilon_decay_env_steps: int = setting(
        1_000_000, "env steps over which epsilon falls from start to finish; 0: finish from "
        "the start", ge=0)
    reward_scale: float = setting(1.0, "the learner multiplies rewards (on a multi-agent env, "
                                  "the team's) by this (REW_SCALE)", gt=0)
