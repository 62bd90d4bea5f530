"""An env written in JAX as pure functions, with the Gymnasium path's step conventions.

`JaxEnv.reset` and `JaxEnv.step` are pure functions of (key, state, action) for one env; vmap
them over a batch and scan them over time (builders/experiments/anakin.py). They follow the
conventions of the env workers (builders/experiments/env_worker.py), so learners see the same
unrolls from either:
next-step autoreset (the step after an episode's end resets the env, ignores its action and
gives the new episode's first observation with reward 0 and `first=True`), and `terminated`
(the MDP ended) kept apart from `truncated` (the time limit), so a truncated episode's last
observation is still there to bootstrap from. gymnax itself resets within the same step; only
its `step_env`, `reset_env` and `is_truncated` are used here.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from trellis.envs.multi_agent import MultiAgentStep


@flax.struct.dataclass
class TimeStep:
    """What one env step gives, the fields inference records (builders/inference.step_specs).

    `reward`, `terminated`, `truncated` and `first` say how `obs` was reached.
    """

    obs: jax.Array | MultiAgentStep  # A MultiAgentStep where a team steps as one env (TeamEnv).
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    first: jax.Array


@flax.struct.dataclass
class EnvState:
    """gymnax's state of one env, and whether its episode ended on the last step."""

    inner: Any
    done: jax.Array


@dataclasses.dataclass(frozen=True)
class JaxEnv:
    """One gymnax env as pure functions with next-step autoreset (see the module docstring)."""

    env: Any  # gymnax.environments.environment.Environment
    params: Any  # its EnvParams

    def reset(self, key: jax.Array) -> tuple[EnvState, TimeStep]:
        obs, inner = self.env.reset_env(key, self.params)
        return EnvState(inner, jnp.zeros((), bool)), _first(obs)

    def step(self, key: jax.Array, state: EnvState, action: jax.Array
             ) -> tuple[EnvState, TimeStep]:
        """One step of an env; after an episode's end, a reset that ignores `action`."""
        # Both branches are computed and one selected: under vmap a lax.cond is a select anyway.
        reset_key, step_key = jax.random.split(key)
        reset_state, reset_step = self.reset(reset_key)
        obs, inner, reward, terminated, _ = self.env.step_env(
            step_key, state.inner, action, self.params)
        truncated = jnp.asarray(self.env.is_truncated(inner, self.params), bool)
        terminated = jnp.asarray(terminated, bool)
        stepped = EnvState(inner, terminated | truncated)
        timestep = TimeStep(jnp.asarray(obs), jnp.asarray(reward, jnp.float32), terminated,
                            truncated, jnp.zeros((), bool))
        chosen: tuple[EnvState, TimeStep] = jax.tree.map(
            functools.partial(jnp.where, state.done), (reset_state, reset_step),
            (stepped, timestep))
        return chosen


def _first(obs: jax.Array) -> TimeStep:
    false = jnp.zeros((), bool)
    return TimeStep(jnp.asarray(obs), jnp.zeros((), jnp.float32), false, false,
                    jnp.ones((), bool))
