"""gymnax environments: `--env=gymnax:CartPole-v1` names gymnax's CartPole-v1.

`GymnaxFactory.make` gives a `JaxEnv` (envs/jax_env.py) that steps inside jitted code, on the
anakin platform (builders/experiments/anakin.py), with the Gymnasium path's step conventions.

Nothing heavy at import time: envs/factory.py imports this module, and run.py imports that in
every node process, where env workers must not load JAX. gymnax is an optional dependency
(`pip install -e ".[gymnax]"`) imported only when a gymnax env is built, without the
rendering libraries its envs import (`_Deferred`).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

import gymnasium
import numpy as np

from trellis.envs.contract import Players
from trellis.envs.errors import UnknownEnvError, check_registered
from trellis.envs.minatar_envs import planes_frame
from trellis.envs.specs import EnvSpec, spec_from_spaces

if TYPE_CHECKING:  # Its module loads JAX, which env workers importing this one must not.
    from trellis.envs.jax_env import JaxEnv

PREFIX = "gymnax:"


# The classic-control ids Gymnasium draws (its env of the same id, set to gymnax's state): the
# fields of gymnax's state that make Gymnasium's `state`, in its order.
_GYMNASIUM_DRAWN = {
    "CartPole-v1": ("x", "x_dot", "theta", "theta_dot"),
    "Pendulum-v1": ("theta", "theta_dot"),
    "Acrobot-v1": ("joint_angle1", "joint_angle2", "velocity_1", "velocity_2"),
    "MountainCar-v0": ("position", "velocity"),
    "MountainCarContinuous-v0": ("position", "velocity"),
}
_MINATAR_SUFFIX = "-MinAtar"  # Drawn from their observation, MinAtar's planes.


@functools.cache
def _gymnasium_drawing(gymnax_id: str) -> gymnasium.Env[Any, Any]:
    """Gymnasium's env of `gymnax_id`, rendering rgb arrays: made once per process."""
    env = gymnasium.make(gymnax_id, render_mode="rgb_array")
    env.reset(seed=0)
    return env


@functools.cache
def _gymnax_env(gymnax_id: str) -> Any:
    """gymnax's env of `gymnax_id` (its `get_obs`), made once per process."""
    return _gymnax().make(gymnax_id)[0]


class GymnaxUnavailableError(UnknownEnvError):
    """gymnax is not installed."""


# What gymnax's envs import at their top only to render: seaborn (with pandas and scipy.stats)
# and pyplot take 1-2 s of a run whose training takes half a second (docs/anakin.md).
_RENDERING_ONLY = ("seaborn", "matplotlib.pyplot")


class _Deferred(types.ModuleType):
    """Stands in for a module while gymnax is imported; the real one loads at first use."""

    def __getattr__(self, name: str) -> Any:
        if sys.modules.get(self.__name__) is self:  # Used during the import itself.
            raise AttributeError(f"{self.__name__} is deferred while gymnax is imported")
        return getattr(importlib.import_module(self.__name__), name)


def _gymnax() -> types.ModuleType:
    stand_ins = {name: _Deferred(name) for name in _RENDERING_ONLY if name not in sys.modules}
    sys.modules.update(stand_ins)
    try:
        gymnax = importlib.import_module("gymnax")
    except ImportError as e:
        raise GymnaxUnavailableError(
            "gymnax envs need the gymnax package: pip install -e '.[gymnax]'") from e
    finally:
        for name, module in stand_ins.items():
            if sys.modules.get(name) is module:
                del sys.modules[name]
    return gymnax


def _param_names(params: Any) -> list[str]:
    return [field.name for field in dataclasses.fields(params)]


def gymnax_spec(env: JaxEnv) -> EnvSpec:
    """The spec of a gymnax env (or one with its API) as for a Gymnasium env, from its
    spaces converted to Gymnasium's."""
    convert = _gymnax().environments.spaces.gymnax_space_to_gym_space
    return spec_from_spaces(convert(env.env.observation_space(env.params)),
                            convert(env.env.action_space(env.params)))


@dataclasses.dataclass(frozen=True)
class GymnaxFactory:
    """Builds gymnax envs for one id.

    Attributes:
      env_id: "gymnax:" and a gymnax id, e.g. "gymnax:CartPole-v1", "gymnax:Breakout-MinAtar".
      params: EnvParams fields to override, e.g. (("max_steps_in_episode", 10),).
    """

    env_id: str
    params: tuple[tuple[str, Any], ...] = ()

    # Which platforms can run it: only the anakin platform steps envs inside jitted code.
    jax_native = True
    players = Players.SINGLE_AGENT

    @property
    def gymnax_id(self) -> str:
        return self.env_id[len(PREFIX):]

    def validate(self) -> None:
        """Raises UnknownEnvError (naming close matches) for an id gymnax does not register
        or params it does not have, GymnaxUnavailableError when gymnax is not installed."""
        check_registered(PREFIX, self.gymnax_id, _gymnax().registered_envs, "a gymnax id")
        if self.params:
            known = _param_names(_gymnax().make(self.gymnax_id)[1])
            unknown = sorted(set(dict(self.params)) - set(known))
            if unknown:
                raise UnknownEnvError(f"{self.env_id} has no env param {', '.join(unknown)}; "
                                      f"its params: {', '.join(known)}")

    def make(self) -> JaxEnv:
        """The env as a `jax_env.JaxEnv` (JAX loaded here, not at import time)."""
        from trellis.envs.jax_env import JaxEnv

        self.validate()
        env, params = _gymnax().make(self.gymnax_id)
        return JaxEnv(env, params.replace(**dict(self.params)) if self.params else params)

    def render(self, state: Any) -> np.ndarray:
        """The picture of one env's `JaxEnv` state (the env contract's
        `RenderedJaxEnvFactory`): classic control drawn by Gymnasium's renderer of the same
        id, set to the state; MinAtar's games as their planes (`minatar_envs.planes_frame`).

        Raises:
          UnknownEnvError: another gymnax id (they have no renderer here).
        """
        if self.gymnax_id in _GYMNASIUM_DRAWN:
            env = _gymnasium_drawing(self.gymnax_id)
            drawn: Any = env.unwrapped  # Each classic-control env keeps its `state` there.
            drawn.state = np.array(
                [float(getattr(state.inner, name)) for name in _GYMNASIUM_DRAWN[self.gymnax_id]])
            return np.asarray(env.render(), np.uint8)
        if self.gymnax_id.endswith(_MINATAR_SUFFIX):
            return planes_frame(np.asarray(_gymnax_env(self.gymnax_id).get_obs(state.inner)))
        raise UnknownEnvError(
            f"{self.env_id} has no renderer here; gymnax ids that render: "
            f"{', '.join(PREFIX + i for i in _GYMNASIUM_DRAWN)} and the *{_MINATAR_SUFFIX} games")

    def spec(self) -> EnvSpec:
        """The spec as for a Gymnasium env, from gymnax's spaces converted to Gymnasium's."""
        return gymnax_spec(self.make())

    def reward_threshold(self) -> float | None:
        """The Gymnasium reward_threshold of the same-named Gymnasium id (475 for
        CartPole-v1), or None when Gymnasium has no such id."""
        try:
            return gymnasium.spec(self.gymnax_id).reward_threshold
        except gymnasium.error.Error:
            return None
