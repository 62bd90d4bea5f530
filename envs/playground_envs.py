"""MuJoCo Playground environments: `--env=playground:CartpoleBalance` names Playground's
CartpoleBalance (MJX physics in JAX, for the anakin platform).

Playground (Zakka et al., 2025, the `playground` package) is where MuJoCo's JAX physics (MJX)
and its maintained task suites live; Brax's own envs are no longer maintained. Its envs have
Brax's `reset(key) -> State` and `step(State, action) -> State` with `obs`, `reward` and
`done`, so `PlaygroundFactory.make` shows them to `JaxEnv` through the same `GymnaxView` as
Brax's (envs/brax_envs.py): next-step autoreset, terminations apart from truncations, and a
truncation after the task's own `episode_length` (1,000 for the DeepMind Control Suite tasks).
Physics runs on MJX's JAX implementation (`impl="jax"`): Playground's default, Warp, compiles
CUDA-style kernels that do not belong inside our jitted programs. Actions are in [-1, 1].

Tasks whose observations are dicts (locomotion: a policy's and a critic's view) or whose
assets must be downloaded (MuJoCo Menagerie robots) are refused in one line; the DeepMind
Control Suite tasks (CartpoleBalance, HopperHop, HumanoidWalk, ...) ship with the package.

Nothing heavy at import time: playground is an optional dependency
(`pip install -e ".[playground]"`), imported when an env is built.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import types
from typing import TYPE_CHECKING, Any

import numpy as np

from trellis.envs.brax_envs import EpisodeLimit, GymnaxView, MujocoDrawing, physics_spec
from trellis.envs.contract import Players
from trellis.envs.errors import UnknownEnvError, check_registered
from trellis.envs.specs import EnvSpec

if TYPE_CHECKING:  # Its module loads JAX, at an env's making, not at import.
    from trellis.envs.jax_env import JaxEnv

PREFIX = "playground:"


class PlaygroundUnavailableError(UnknownEnvError):
    """playground is not installed."""


def _registry() -> types.ModuleType:
    try:
        # MuJoCo prints a line when its optional `warp` backend is missing; not ours to show.
        with contextlib.redirect_stdout(io.StringIO()):
            from mujoco_playground import registry
    except ImportError as e:
        raise PlaygroundUnavailableError(
            "Playground envs need the playground package: pip install -e '.[playground]'"
        ) from e
    module: types.ModuleType = registry  # A module; unannotated, so Any to a type checker.
    return module


def is_dm_control(env_id: str) -> bool:
    """Whether `env_id` names a DeepMind Control Suite task of Playground
    (`playground:CartpoleBalance`): their family has presets (launch/flags/presets.py); False
    when playground is not installed (the env's own check says so)."""
    if not env_id.startswith(PREFIX):
        return False
    try:
        return env_id[len(PREFIX):] in _registry().dm_control_suite.ALL_ENVS
    except PlaygroundUnavailableError:
        return False


@functools.cache
def _environment(name: str) -> tuple[Any, int]:
    """Playground's env `name` on MJX's JAX physics and its episode length, built once per
    process (loading parses the MJCF model: seconds for humanoid).

    Raises:
      UnknownEnvError: the task's assets are not installed (and cannot be downloaded), or
        its observations are not one array.
    """
    registry = _registry()
    config = registry.get_default_config(name)
    try:
        env = registry.load(name, config_overrides={"impl": "jax"})
    except Exception as e:  # Playground raises what git or its asset loader raise.
        raise UnknownEnvError(
            f"playground:{name} could not be built ({type(e).__name__}: {e}); its assets may "
            "need a download (MuJoCo Menagerie). The DeepMind Control Suite tasks ship with "
            "the package, e.g. playground:CartpoleBalance") from e
    if not isinstance(env.observation_size, int):
        raise UnknownEnvError(
            f"playground:{name} observes a dict {dict(env.observation_size)}; Trellis takes "
            "one observation array (use a DeepMind Control Suite task, e.g. "
            "playground:HumanoidWalk)")
    return env, int(config.episode_length)


@functools.cache
def _drawing(name: str) -> MujocoDrawing:
    return MujocoDrawing(_environment(name)[0].mj_model, PREFIX + name)


@dataclasses.dataclass(frozen=True)
class PlaygroundFactory:
    """Builds Playground envs for one id.

    Attributes:
      env_id: "playground:" and a Playground env name, e.g. "playground:CartpoleBalance".
    """

    env_id: str

    jax_native = True  # Stepped inside jitted code, on the anakin platform only.
    players = Players.SINGLE_AGENT

    @property
    def name(self) -> str:
        return self.env_id[len(PREFIX):]

    def validate(self) -> None:
        """Raises UnknownEnvError (naming close matches) for a name Playground does not
        register, PlaygroundUnavailableError when playground is not installed."""
        check_registered(PREFIX, self.name, sorted(_registry().ALL_ENVS), "a Playground env")

    def make(self) -> JaxEnv:
        """The env as a `jax_env.JaxEnv`."""
        from trellis.envs.jax_env import JaxEnv

        self.validate()
        env, episode_length = _environment(self.name)
        return JaxEnv(GymnaxView(env), EpisodeLimit(episode_length))

    def spec(self) -> EnvSpec:
        self.validate()
        return physics_spec(_environment(self.name)[0])

    def render(self, state: Any) -> np.ndarray:
        """The picture of one env's `JaxEnv` state, drawn by MuJoCo from its joint positions
        and velocities (the env contract's `RenderedJaxEnvFactory`; `MujocoDrawing`: needs
        MUJOCO_GL=egl without a display)."""
        data = state.inner[0].data
        return _drawing(self.name).draw(data.qpos, data.qvel)

    def reward_threshold(self) -> float | None:
        """None: Playground's tasks declare no solved return."""
        return None
