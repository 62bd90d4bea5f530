"""A multi-agent env written in JAX as pure functions, in the convention of envs/multi_agent.py.

`MultiAgentJaxEnv` turns an env with JaxMARL's `MultiAgentEnv` API (`reset(key) -> (obs,
state)`, `step_env(key, state, actions) -> (obs, state, rewards, dones, infos)`, dicts keyed by
agent id; `agents`, `observation_space(agent)`, `action_space(agent)`) into pure `reset` and
`step` functions of one env giving `MultiAgentStep`s: vmap them over a batch and scan them over
time (the anakin program). JaxMARL's own `step` resets within the same step; only its
`step_env` and `reset` are used. JaxMARL's envs (envs/jaxmarl_envs.py) and envs of your own
with the same API (envs/warehouses.py) are adapted alike:

  - next-step autoreset: the step after an episode's end resets the env, ignores the actions
    and gives the new episode's first step (as envs/jax_env.py does for one agent);
  - an agent done before the others is masked from then on (`alive` False, reward 0, obs
    zeros), and the episode ends when every agent is done or at `dones["__all__"]`;
  - a done is `truncated` (bootstrap from the last observation) where the env ends episodes
    only at a time limit (`time_limit_only`), else `terminated`;
  - the global state is the env's `global_state(state)` where it has one, else the agents'
    observations concatenated in agent order (what JaxMARL's MAPPO gives its critic on MPE,
    its `MPEWorldStateWrapper`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from trellis.envs.jax_env import TimeStep
from trellis.envs.multi_agent import MultiAgentSpec, MultiAgentStep, episode_done
from trellis.envs.specs import EnvSpec


def space_spec(observation_space: Any, action_space: Any) -> EnvSpec:
    """The EnvSpec of one agent from JaxMARL's spaces (Box observations; Discrete or Box
    actions).

    Raises:
      TypeError: other spaces.
    """
    kind = type(action_space).__name__
    if type(observation_space).__name__ != "Box":
        raise TypeError(f"Trellis needs Box observations, got {observation_space!r}")
    obs_shape = tuple(int(d) for d in observation_space.shape)
    if kind == "Discrete":
        return EnvSpec(obs_shape, "float32", int(action_space.n), (), "int32")
    if kind == "Box":
        shape = tuple(int(d) for d in action_space.shape)
        return EnvSpec(obs_shape, "float32", None, shape, "float32",
                       _bounds(action_space.low, shape), _bounds(action_space.high, shape))
    raise TypeError(f"Trellis handles Discrete or Box actions, got {action_space!r}")


def _bounds(bound: Any, shape: tuple[int, ...]) -> tuple[float, ...]:
    return tuple(float(x) for x in np.broadcast_to(np.asarray(bound, np.float32), shape).ravel())


class EnvState(NamedTuple):
    """The wrapped env's state, which agents still act, and whether the episode ended."""

    inner: Any
    alive: Mapping[str, jax.Array]  # {agent: bool}
    done: jax.Array  # bool


@dataclasses.dataclass(frozen=True)
class MultiAgentJaxEnv:
    """One env with JaxMARL's API as pure functions in Trellis's convention (module docstring).

    Attributes:
      env: the env (a jaxmarl MultiAgentEnv, or any object with its API).
      time_limit_only: the env's dones are time limits (truncations), not terminations.
    """

    env: Any
    time_limit_only: bool = False

    @property
    def agents(self) -> tuple[str, ...]:
        return tuple(self.env.agents)

    def spec(self) -> MultiAgentSpec:
        """Each agent's spaces and the global state's shape (from one reset)."""
        specs = {a: space_spec(self.env.observation_space(a), self.env.action_space(a))
                 for a in self.agents}
        _, step = jax.eval_shape(self.reset, jax.random.key(0))
        return MultiAgentSpec(self.agents, specs, tuple(step.global_state.shape))

    def _global_state(self, inner: Any, obs: dict[str, Any]) -> Any:
        if hasattr(self.env, "global_state"):
            return jnp.asarray(self.env.global_state(inner), jnp.float32)
        return jnp.concatenate([jnp.ravel(obs[a]).astype(jnp.float32) for a in self.agents])

    def reset(self, key: Any) -> tuple[EnvState, MultiAgentStep]:
        obs, inner = self.env.reset(key)
        obs = {a: jnp.asarray(obs[a], jnp.float32) for a in self.agents}
        false = {a: jnp.zeros((), bool) for a in self.agents}
        step = MultiAgentStep(
            obs=obs, reward={a: jnp.zeros((), jnp.float32) for a in self.agents},
            terminated=false, truncated=false,
            alive={a: jnp.ones((), bool) for a in self.agents}, first=jnp.ones((), bool),
            global_state=self._global_state(inner, obs))
        return EnvState(inner, step.alive, jnp.zeros((), bool)), step

    def step(self, key: Any, state: EnvState, actions: dict[str, Any]
             ) -> tuple[EnvState, MultiAgentStep]:
        """One step; after an episode's end, a reset that ignores `actions`."""
        reset_key, step_key = jax.random.split(key)
        reset = self.reset(reset_key)
        obs, inner, rewards, dones, _ = self.env.step_env(step_key, state.inner, actions)
        was_alive = state.alive
        ending = {a: jnp.asarray(dones[a], bool) & was_alive[a] for a in self.agents}
        alive = {a: was_alive[a] & ~ending[a] for a in self.agents}
        episode_done = jnp.asarray(dones["__all__"], bool) | ~functools.reduce(
            jnp.logical_or, alive.values())
        # Every agent still in the episode when it ends finishes with it.
        ending = {a: ending[a] | (was_alive[a] & episode_done) for a in self.agents}
        alive = {a: alive[a] & ~episode_done for a in self.agents}
        none = {a: jnp.zeros((), bool) for a in self.agents}
        obs = {a: jnp.where(was_alive[a], jnp.asarray(obs[a], jnp.float32), 0.0)
               for a in self.agents}
        stepped = MultiAgentStep(
            obs=obs,
            reward={a: jnp.where(was_alive[a], jnp.asarray(rewards[a], jnp.float32), 0.0)
                    for a in self.agents},
            terminated=none if self.time_limit_only else ending,
            truncated=ending if self.time_limit_only else none,
            alive=alive, first=jnp.zeros((), bool),
            global_state=self._global_state(inner, obs))
        chosen: tuple[EnvState, MultiAgentStep] = jax.tree.map(
            functools.partial(jnp.where, state.done), reset,
            (EnvState(inner, alive, episode_done), stepped))
        return chosen


@dataclasses.dataclass(frozen=True)
class TeamEnv:
    """A multi-agent env seen as one env (`jax_env.JaxEnv`'s reset and step), for a program
    that steps single envs (the anakin platform): the observation is the whole
    `MultiAgentStep`, the reward the team's (the sum over agents), and the episode ends when no
    agent acts any more (`multi_agent.episode_done`), truncated if an agent's end was."""

    env: MultiAgentJaxEnv

    def reset(self, key: jax.Array) -> tuple[EnvState, TimeStep]:
        state, step = self.env.reset(key)
        return state, self._timestep(step)

    def step(self, key: jax.Array, state: EnvState, actions: dict[str, jax.Array]
             ) -> tuple[EnvState, TimeStep]:
        state, step = self.env.step(key, state, actions)
        return state, self._timestep(step)

    def _timestep(self, step: MultiAgentStep) -> TimeStep:
        agents = self.env.agents
        done = episode_done(step, agents) & ~step.first
        truncated = done & functools.reduce(jnp.logical_or, (step.truncated[a] for a in agents))
        reward = functools.reduce(jnp.add, (step.reward[a] for a in agents))
        return TimeStep(step, reward, done & ~truncated, truncated, step.first)


# builders.contract.agent.Policy on a multi-agent env (that module is in a layer above this
# one): policy(params, key, step, state, first) -> ({agent: actions [N, ...]}, extras, state).
MultiAgentPolicy = Callable[
    [Any, jax.Array, MultiAgentStep, Mapping[str, jax.Array], jax.Array],
    tuple[Mapping[str, jax.Array], Mapping[str, Any], Mapping[str, jax.Array]],
]


def random_policy(spec: MultiAgentSpec) -> MultiAgentPolicy:
    """A policy (builders.contract.agent.Policy, params unused) acting uniformly at random for
    every agent: the floor a learned policy is measured against."""

    def policy(params: Any, key: jax.Array, step: MultiAgentStep, state: Mapping[str, jax.Array],
               first: jax.Array
               ) -> tuple[dict[str, jax.Array], dict[str, Any], Mapping[str, jax.Array]]:
        del params, first
        actions = {}
        for agent, agent_key in zip(spec.agents, jax.random.split(key, spec.num_agents),
                                    strict=True):
            agent_spec = spec.specs[agent]
            shape = step.first.shape + agent_spec.action_shape
            if agent_spec.num_actions is not None:
                actions[agent] = jax.random.randint(agent_key, shape, 0, agent_spec.num_actions)
            else:
                actions[agent] = jax.random.uniform(
                    agent_key, shape, minval=jnp.asarray(agent_spec.action_low),
                    maxval=jnp.asarray(agent_spec.action_high))
        return actions, {}, state

    return policy
