"""The evaluation player on the device: whole episodes of a policy in fresh JAX envs, in one
jittable function (`play_episodes`), for runs whose envs are written in JAX (launch/evaluate.py
on an anakin run; multi-agent baselines).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp


def play_episodes(env: Any, policy: Callable[..., Any], params: Any,
                  initial_state: Mapping[str, Any], num_episodes: int,
                  key: jax.Array) -> jax.Array:
    """Returns [num_episodes] of one episode in each of `num_episodes` fresh envs (jittable).

    Args:
      env: a `JaxEnv`; its time limit ends every episode.
      policy: e.g. the agent's greedy policy (`make_policy(networks, evaluation=True)`).
      params: the policy's params.
      initial_state: the policy state of `num_episodes` env slots.
      num_episodes: envs, one episode each.
      key: for the envs and the policy.
    """
    reset_key, key = jax.random.split(key)
    env_state, timestep = jax.vmap(env.reset)(jax.random.split(reset_key, num_episodes))

    def body(carry: tuple[Any, ...]) -> tuple[Any, ...]:
        env_state, timestep, policy_state, returns, finished, key = carry
        key, act_key, env_key = jax.random.split(key, 3)
        actions, _, policy_state = policy(params, act_key, timestep.obs, policy_state,
                                          timestep.first)
        env_state, timestep = jax.vmap(env.step)(
            jax.random.split(env_key, num_episodes), env_state, actions)
        returns = returns + jnp.where(finished, 0.0, timestep.reward)
        finished = finished | timestep.terminated | timestep.truncated
        return env_state, timestep, policy_state, returns, finished, key

    carry = (env_state, timestep, dict(initial_state), jnp.zeros(num_episodes, jnp.float32),
             jnp.zeros(num_episodes, bool), key)
    return jax.lax.while_loop(lambda c: ~jnp.all(c[4]), body, carry)[3]
