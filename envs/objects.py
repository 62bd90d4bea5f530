"""Envs from Python objects: `as_env_factory(obj)` makes what a user holds into what a run takes
(an envs.contract.EnvFactory), e.g. `run_experiment(builder, gymnax.make("CartPole-v1"), ...)`.

  - A Gymnasium env constructor (an env class, or a function returning a gymnasium.Env) is
    registered with Gymnasium under an id of its own ("python/NAME-v0") and built by a
    `GymnasiumFactory`, so that env workers get it as they get any id registered in the
    launching process only (envs/factory.py), and env kwargs and wrappers apply.
  - A gymnax env (with its params), a Brax or MuJoCo Playground env, or an env with JaxMARL's
    `MultiAgentEnv` API is adapted to Trellis's step conventions as the id-based factories
    adapt theirs (jax_env.JaxEnv; brax_envs.GymnaxView for Brax's API;
    jax_multi_agent.MultiAgentJaxEnv), for the anakin platform.

Which API an object has is read from its members (the protocols below), so the library need
not be installed for the check, and an env of one's own with the same API works as well.

Nothing heavy at import time: env workers import trellis.envs. The adapters load JAX when an
object is made into a factory; an object of a JAX library means JAX is loaded already.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import gymnasium as gym

from trellis.envs.brax_envs import EPISODE_LENGTH, EpisodeLimit, GymnaxView, physics_spec
from trellis.envs.contract import EnvFactory, Players
from trellis.envs.factory import GymnasiumFactory, Wrapper
from trellis.envs.gymnax_envs import gymnax_spec
from trellis.envs.multi_agent import MultiAgentSpec
from trellis.envs.registry import make_env_factory
from trellis.envs.specs import EnvSpec

# The namespace of the Gymnasium ids that `gymnasium_factory` registers.
NAMESPACE = "python"


@runtime_checkable
class GymnaxEnv(Protocol):
    """gymnax's `Environment` API, as jax_env.JaxEnv and gymnax_envs.gymnax_spec use it."""

    @property
    def default_params(self) -> Any: ...

    def reset_env(self, key: Any, params: Any) -> Any: ...

    def step_env(self, key: Any, state: Any, action: Any, params: Any) -> Any: ...

    def is_truncated(self, state: Any, params: Any) -> Any: ...

    def observation_space(self, params: Any) -> Any: ...

    def action_space(self, params: Any) -> Any: ...


@runtime_checkable
class MultiAgentEnv(Protocol):
    """JaxMARL's `MultiAgentEnv` API, as jax_multi_agent.MultiAgentJaxEnv uses it."""

    agents: Sequence[str]

    def reset(self, key: Any) -> Any: ...

    def step_env(self, key: Any, state: Any, actions: Any) -> Any: ...

    def observation_space(self, agent: str) -> Any: ...

    def action_space(self, agent: str) -> Any: ...


@runtime_checkable
class PhysicsEnv(Protocol):
    """Brax's `Env` API (MuJoCo Playground's envs have it too), as brax_envs.GymnaxView and
    brax_envs.physics_spec use it."""

    @property
    def observation_size(self) -> Any: ...

    @property
    def action_size(self) -> int: ...

    def reset(self, rng: Any) -> Any: ...

    def step(self, state: Any, action: Any) -> Any: ...


@dataclasses.dataclass(frozen=True, eq=False)
class EnvObjectFactory:
    """A JAX env object as an env factory for the anakin platform.

    Attributes:
      env_id: the name runs record, "object:NAME".
      env: the object adapted to Trellis's step conventions (a jax_env.JaxEnv or a
        jax_multi_agent.MultiAgentJaxEnv): what `make` gives.
      players: who acts in it.
      env_spec: its spec (a MultiAgentSpec where several agents act).
      threshold: the return that solves it (what --stop_at_return=auto stops at), or None.
    """

    env_id: str
    env: Any
    players: Players
    env_spec: EnvSpec | MultiAgentSpec
    threshold: float | None = None

    jax_native = True  # Stepped inside jitted code, on the anakin platform only.

    def validate(self) -> None:
        """Nothing to look up: the object is the env."""

    def make(self) -> Any:
        return self.env

    def spec(self) -> EnvSpec | MultiAgentSpec:
        return self.env_spec

    def reward_threshold(self) -> float | None:
        return self.threshold


def _object_id(env: object, name: str | None) -> str:
    return f"object:{name or type(env).__name__}"


def gymnax_factory(env: GymnaxEnv, params: Any = None, *, name: str | None = None,
                   reward_threshold: float | None = None) -> EnvObjectFactory:
    """A gymnax env (or one with its API) as a factory.

    Args:
      env: the env, e.g. the first of what `gymnax.make("CartPole-v1")` gives.
      params: its EnvParams; None: its `default_params`.
      name: the name runs record (default: the env's class name).
      reward_threshold: the return that solves it, or None.
    """
    from trellis.envs.jax_env import JaxEnv  # Loads JAX, as the object's library has.

    jax_env = JaxEnv(env, env.default_params if params is None else params)
    return EnvObjectFactory(_object_id(env, name), jax_env, Players.SINGLE_AGENT,
                            gymnax_spec(jax_env), reward_threshold)


def physics_factory(env: PhysicsEnv, *, episode_length: int = EPISODE_LENGTH,
                    name: str | None = None,
                    reward_threshold: float | None = None) -> EnvObjectFactory:
    """A Brax or MuJoCo Playground env (or one with Brax's API) as a factory.

    Args:
      env: the env, e.g. `brax.envs.get_environment("inverted_pendulum")`.
      episode_length: steps after which an episode is truncated (Brax's envs have no time
        limit of their own).
      name: the name runs record (default: the env's class name).
      reward_threshold: the return that solves it, or None.

    Raises:
      TypeError: its observations are a dict (Playground's locomotion tasks): Trellis takes
        one observation array.
    """
    from trellis.envs.jax_env import JaxEnv  # Loads JAX, as the object's library has.

    if not isinstance(env.observation_size, int):
        raise TypeError(f"{type(env).__name__} observes a dict {dict(env.observation_size)}; "
                        "Trellis takes one observation array")
    return EnvObjectFactory(_object_id(env, name),
                            JaxEnv(GymnaxView(env), EpisodeLimit(episode_length)),
                            Players.SINGLE_AGENT, physics_spec(env), reward_threshold)


def multi_agent_factory(env: MultiAgentEnv, *, time_limit_only: bool = False,
                        name: str | None = None,
                        reward_threshold: float | None = None) -> EnvObjectFactory:
    """An env with JaxMARL's `MultiAgentEnv` API (a JaxMARL env, or a subclass of its
    MultiAgentEnv of one's own) as a factory.

    Args:
      env: the env.
      time_limit_only: its episodes end only at a time limit, so its dones are truncations
        (JaxMARL's MPE envs); False: terminations.
      name: the name runs record (default: the env's class name).
      reward_threshold: the team's return that solves it, or None.
    """
    from trellis.envs.jax_multi_agent import MultiAgentJaxEnv  # Loads JAX, as JaxMARL has.

    adapted = MultiAgentJaxEnv(env, time_limit_only)
    return EnvObjectFactory(_object_id(env, name), adapted, Players.MULTI_AGENT,
                            adapted.spec(), reward_threshold)


def gymnasium_factory(make_env: Callable[..., gym.Env[Any, Any]], *,
                      kwargs: Mapping[str, Any] | None = None,
                      wrappers: Sequence[str | Wrapper] = (),
                      max_episode_steps: int | None = None,
                      reward_threshold: float | None = None) -> GymnasiumFactory:
    """A Gymnasium env constructor as a factory: registered with Gymnasium under
    "python/NAME-vN" (NAME its name; N the first version free or holding the same
    registration), and built in env workers from that registration (envs/factory.py).

    Args:
      make_env: an env class, or a function returning a gymnasium.Env; called with `kwargs`.
      kwargs: keyword arguments of `make_env`.
      wrappers: applied to each env in order: callables taking an env and returning one, or
        "MODULE:NAME" of one.
      max_episode_steps: a time limit (Gymnasium's TimeLimit), or None.
      reward_threshold: the return that solves it (what --stop_at_return=auto stops at).
    """
    name = re.sub(r"[^\w.-]", "", getattr(make_env, "__name__", type(make_env).__name__))
    for version in itertools.count():
        env_id = f"{NAMESPACE}/{name or 'env'}-v{version}"
        registered = gym.registry.get(env_id)
        if registered is None:
            gym.register(env_id, entry_point=make_env, max_episode_steps=max_episode_steps,
                         reward_threshold=reward_threshold)
            break
        if (registered.entry_point is make_env
                and registered.max_episode_steps == max_episode_steps
                and registered.reward_threshold == reward_threshold):
            break
    return GymnasiumFactory(env_id, tuple((kwargs or {}).items()), tuple(wrappers))


def as_env_factory(env: object) -> EnvFactory:
    """The env factory for `env`: an env factory as it is; an env id (`make_env_factory`); a
    gymnax env, or gymnax's (env, params); a JaxMARL-API multi-agent env; a Brax or
    Playground env; a Gymnasium env constructor (each with the defaults of `gymnax_factory`,
    `multi_agent_factory`, `physics_factory` and `gymnasium_factory`: call those for more).

    Raises:
      TypeError: `env` is none of these, or a gymnasium.Env itself (one line each).
      UnknownEnvError: an unknown env id.
    """
    if isinstance(env, EnvFactory):
        return env
    if isinstance(env, str):
        return make_env_factory(env)
    if isinstance(env, gym.Env):
        raise TypeError(f"pass the constructor of {type(env).__name__} (its class, or a "
                        "function returning a new env), not an env: every env worker builds "
                        "its own envs")
    if isinstance(env, tuple) and len(env) == 2 and isinstance(env[0], GymnaxEnv):
        return gymnax_factory(*env)
    if isinstance(env, GymnaxEnv):
        return gymnax_factory(env)
    if isinstance(env, MultiAgentEnv):
        return multi_agent_factory(env)
    if isinstance(env, PhysicsEnv):
        return physics_factory(env)
    if callable(env):
        return gymnasium_factory(env)
    raise TypeError(f"cannot make an env of {env!r}: pass an env id, an env factory, a "
                    "Gymnasium env constructor, or a gymnax, Brax, Playground or JaxMARL env")
