"""Brax environments: `--env=brax:inverted_pendulum` names Brax's inverted_pendulum.

`BraxFactory.make` gives a `JaxEnv` (envs/jax_env.py), as gymnax ids do, for the anakin
platform: `GymnaxView` shows a Brax env through the three functions `JaxEnv` calls, so the
step conventions (next-step autoreset, `terminated` apart from `truncated`) are the same code.
Brax envs have no time limit of their own (Brax's training wrappers add one); here an episode
is truncated after `episode_length` steps (1,000, as in Brax's and Gymnasium's MuJoCo tasks).
Actions are in [-1, 1] on every dimension; the physics backend is each env's default.

Nothing heavy at import time (see envs/gymnax_envs.py): brax is an optional dependency
(`pip install -e ".[brax]"`), imported when a Brax env is built.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import io
import types
from typing import TYPE_CHECKING, Any

import gymnasium
import numpy as np

from trellis.envs.contract import Players
from trellis.envs.errors import UnknownEnvError, check_registered
from trellis.envs.specs import EnvSpec, spec_from_spaces

if TYPE_CHECKING:  # Its module loads JAX, at an env's making, not at import (see above).
    import jax

    from trellis.envs.jax_env import JaxEnv

PREFIX = "brax:"
EPISODE_LENGTH = 1000


class BraxUnavailableError(UnknownEnvError):
    """brax is not installed."""


def _brax_envs() -> types.ModuleType:
    try:
        # MuJoCo prints a line when its optional `warp` backend is missing; not ours to show.
        with contextlib.redirect_stdout(io.StringIO()):
            envs = importlib.import_module("brax.envs")
    except ImportError as e:
        raise BraxUnavailableError(
            "Brax envs need the brax package: pip install -e '.[brax]'") from e
    return envs


@functools.cache
def _environment(name: str) -> Any:
    """Brax's env `name`, built once per process: building parses its MJCF model (0.6 s for
    inverted_pendulum), and both `spec` and `make` need it."""
    return _brax_envs().get_environment(name)


def physics_spec(env: Any) -> EnvSpec:
    """The spec of an env with Brax's API (Brax's, Playground's): `observation_size` floats
    observed, `action_size` actions in [-1, 1]."""
    observations = gymnasium.spaces.Box(-np.inf, np.inf, (env.observation_size,), np.float32)
    actions = gymnasium.spaces.Box(-1.0, 1.0, (env.action_size,), np.float32)
    return spec_from_spaces(observations, actions)


# The pictures of physics envs (videos): MuJoCo's renderer at this size, its default camera.
FRAME_HEIGHT, FRAME_WIDTH = 240, 320


class MujocoDrawing:
    """Draws states of one MuJoCo model on the host: a renderer and the data it reads, made
    once (each renderer opens an OpenGL context).

    MuJoCo picks its OpenGL platform when it is imported, from $MUJOCO_GL: without a display,
    `MUJOCO_GL=egl` (or osmesa) must be in the environment before the process starts.

    Raises:
      UnknownEnvError: no OpenGL context could be opened (naming MUJOCO_GL).
    """

    def __init__(self, mj_model: Any, name: str):
        self._mujoco = importlib.import_module("mujoco")
        self._model = mj_model
        try:
            self._renderer = self._mujoco.Renderer(mj_model, FRAME_HEIGHT, FRAME_WIDTH)
        except Exception as e:  # mujoco.FatalError, or what the GL platform's import raises.
            raise UnknownEnvError(
                f"{name}: MuJoCo could not open an OpenGL context to draw ({type(e).__name__}: "
                f"{e}); start the process with MUJOCO_GL=egl (or osmesa) in the environment"
            ) from e
        self._data = self._mujoco.MjData(mj_model)

    def draw(self, qpos: Any, qvel: Any) -> np.ndarray:
        """The picture of the model at joint positions `qpos` and velocities `qvel`."""
        self._data.qpos[:] = np.asarray(qpos)
        self._data.qvel[:] = np.asarray(qvel)
        self._mujoco.mj_forward(self._model, self._data)
        self._renderer.update_scene(self._data)
        return np.asarray(self._renderer.render(), np.uint8)


@functools.cache
def _drawing(name: str) -> MujocoDrawing:
    return MujocoDrawing(_environment(name).sys.mj_model, PREFIX + name)


@dataclasses.dataclass(frozen=True)
class EpisodeLimit:
    """The one env parameter `GymnaxView` reads, as gymnax names it."""

    max_steps_in_episode: int = EPISODE_LENGTH


# `GymnaxView`'s state of one env: (Brax's `State`, steps taken in the episode). brax ships no
# annotations, so its State is Any to the type checker.
Inner = tuple[Any, "jax.Array | np.int32"]


@dataclasses.dataclass(frozen=True)
class GymnaxView:
    """A Brax env through gymnax's `reset_env`, `step_env` and `is_truncated`; its state is
    (Brax's `State`, steps taken in the episode)."""

    env: Any  # brax.envs.Env

    def reset_env(self, key: jax.Array, params: EpisodeLimit) -> tuple[jax.Array, Inner]:
        state = self.env.reset(key)
        return state.obs, (state, np.int32(0))

    def step_env(self, key: jax.Array, inner: Inner, action: jax.Array, params: EpisodeLimit
                 ) -> tuple[jax.Array, Inner, jax.Array, jax.Array, dict[str, Any]]:
        del key  # Brax's physics is deterministic; only resets draw.
        state, steps = inner
        state = self.env.step(state, action)
        return state.obs, (state, steps + 1), state.reward, state.done > 0, {}

    def is_truncated(self, inner: Inner, params: EpisodeLimit) -> jax.Array | np.bool_:
        return inner[1] >= params.max_steps_in_episode


@dataclasses.dataclass(frozen=True)
class BraxFactory:
    """Builds Brax envs for one id.

    Attributes:
      env_id: "brax:" and a Brax env name, e.g. "brax:inverted_pendulum", "brax:ant".
      episode_length: steps after which an episode is truncated.
    """

    env_id: str
    episode_length: int = EPISODE_LENGTH

    jax_native = True  # Stepped inside jitted code, on the anakin platform only.
    players = Players.SINGLE_AGENT

    @property
    def brax_name(self) -> str:
        return self.env_id[len(PREFIX):]

    def validate(self) -> None:
        """Raises UnknownEnvError (naming close matches) for a name Brax does not register,
        BraxUnavailableError when brax is not installed."""
        # Brax's registry has no public listing.
        check_registered(PREFIX, self.brax_name, sorted(_brax_envs()._envs), "a Brax env name")

    def make(self) -> JaxEnv:
        """The env as a `jax_env.JaxEnv`."""
        from trellis.envs.jax_env import JaxEnv

        self.validate()
        return JaxEnv(GymnaxView(_environment(self.brax_name)),
                      EpisodeLimit(self.episode_length))

    def spec(self) -> EnvSpec:
        self.validate()
        return physics_spec(_environment(self.brax_name))

    def render(self, state: Any) -> np.ndarray:
        """The picture of one env's `JaxEnv` state, drawn by MuJoCo from its joint positions
        and velocities (the env contract's `RenderedJaxEnvFactory`; `MujocoDrawing`)."""
        physics = state.inner[0].pipeline_state
        return _drawing(self.brax_name).draw(physics.q, physics.qd)

    def reward_threshold(self) -> float | None:
        """None: Brax's tasks declare no solved return."""
        return None
