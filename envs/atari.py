"""Atari ids and their settings: envpool when it is installed, ALE's own vector env otherwise.

`atari_factory("ALE/Pong-v5")` gives envpool's Pong-v5 where envpool is installed (its C++
pool steps all of a worker's envs in threads) and Gymnasium's ALE id otherwise, vectorised by
ALE itself (`gymnasium.make_vec(..., vectorization_mode="vector_entry_point")`, ale_py's
AtariVectorEnv). Both do the same frame handling in C++: frame skip with max-pooling of the
last two frames, grey frames resized to a square, a stack of the last frames, random no-ops at
the start, sticky actions, the minimal or full action set, and optionally a lost life as an
episode's end. `with_settings` gives a factory those settings by Trellis's names (`SETTINGS`);
run.py's flags of the same names set them (docs/atari.md).

Rewards are never clipped here: the agents clip them in the learner (their `reward_clip`), so
the returns a run reports are the game's score, comparable with published (unclipped) scores.

An ALE v5 id means sticky actions with probability 0.25 (Machado et al., 2018, "Revisiting the
Arcade Learning Environment"); the same id served by envpool keeps that unless
`repeat_action_probability` is given. envpool's own ids ("envpool:Pong-v5") keep envpool's
defaults (no sticky actions).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import types
from typing import Any

import gymnasium as gym

from trellis.envs.contract import Players
from trellis.envs.envpool_envs import PREFIX as ENVPOOL_PREFIX
from trellis.envs.envpool_envs import EnvpoolFactory, _envpool, task_settings
from trellis.envs.errors import UnknownEnvError
from trellis.envs.specs import EnvSpec, vector_spec

ALE_PREFIX = "ALE/"
# What Gymnasium's ALE v5 ids set (Machado et al., 2018).
ALE_V5_STICKY = 0.25
# Trellis's name of each setting: (envpool's keyword arguments, ale_py AtariVectorEnv's).
SETTINGS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "episodic_life": (("episodic_life",), ("episodic_life",)),
    "frame_skip": (("frame_skip",), ("frameskip",)),
    "frame_stack": (("stack_num",), ("stack_num",)),
    "frame_size": (("img_height", "img_width"), ("img_height", "img_width")),
    "noop_max": (("noop_max",), ("noop_max",)),
    "repeat_action_probability": (("repeat_action_probability",),
                                  ("repeat_action_probability",)),
    "full_action_space": (("full_action_space",), ("full_action_space",)),
}
# ale_py's vector env clips rewards by default; Trellis clips in the learner (module docstring).
_ALE_FIXED = {"reward_clipping": False}


def is_ale_id(env_id: str) -> bool:
    return env_id.startswith(ALE_PREFIX)


def envpool_available() -> bool:
    return importlib.util.find_spec("envpool") is not None


def atari_factory(env_id: str) -> EnvpoolFactory | AleVectorFactory | None:
    """`ale_factory(env_id)` for an ALE id ("ALE/NAME-v5"); None for any other id."""
    return ale_factory(env_id) if is_ale_id(env_id) else None


def ale_factory(env_id: str) -> EnvpoolFactory | AleVectorFactory:
    """The factory of an ALE id ("ALE/NAME-v5", what the registry maps "ALE/" to): envpool's
    task NAME-v5 where envpool is installed and has it, else ALE's own vector env."""
    name = env_id[len(ALE_PREFIX):]
    if envpool_available() and name in _envpool().list_all_envs():
        return EnvpoolFactory(ENVPOOL_PREFIX + name,
                              (("repeat_action_probability", ALE_V5_STICKY),))
    return AleVectorFactory(env_id)


def is_atari_factory(factory: Any) -> bool:
    """Whether `factory` steps Atari games (and so takes the settings of `SETTINGS`)."""
    if isinstance(factory, AleVectorFactory):
        return True
    if isinstance(factory, EnvpoolFactory):
        return "episodic_life" in task_settings(factory.task)
    return False


def with_settings(factory: Any, settings: dict[str, Any]) -> Any:
    """`factory` with the Atari settings `settings` ({Trellis name: value}; a value of None
    keeps the id's own); the factory itself when there are none.

    Raises:
      UnknownEnvError: settings for an env that is not an Atari game, or an unknown name.
    """
    given = {name: v for name, v in settings.items() if v is not None}
    if not given:
        return factory
    unknown = sorted(set(given) - set(SETTINGS))
    if unknown:
        raise UnknownEnvError(f"{unknown[0]!r} is not an Atari setting; they are: "
                              f"{', '.join(SETTINGS)}")
    if not is_atari_factory(factory):
        raise UnknownEnvError(f"the Atari settings ({', '.join(sorted(given))}) need an Atari "
                              f"env (ALE/NAME-v5 or envpool:NAME-v5), not {factory.env_id!r}")
    side = 0 if isinstance(factory, EnvpoolFactory) else 1
    options = dict(factory.options)
    for name, value in given.items():
        options.update(dict.fromkeys(SETTINGS[name][side], value))
    return dataclasses.replace(factory, options=tuple(sorted(options.items())))


def _ale_py() -> types.ModuleType:
    try:
        ale_py = importlib.import_module("ale_py")
    except ImportError as e:
        raise UnknownEnvError("ALE ids need the ale_py package: pip install -e '.[atari]' (or "
                              "envpool: pip install -e '.[envpool]')") from e
    return ale_py


@dataclasses.dataclass(frozen=True)
class AleVectorFactory:
    """Builds ALE's own vector env (ale_py's AtariVectorEnv, next-step autoreset) for one
    Gymnasium ALE id, the fallback where envpool is not installed.

    Attributes:
      env_id: a Gymnasium ALE id, e.g. "ALE/Pong-v5".
      options: AtariVectorEnv's keyword arguments (`with_settings` sets them).
    """

    env_id: str
    options: tuple[tuple[str, Any], ...] = ()

    jax_native = False  # Stepped by env workers on the host.
    players = Players.SINGLE_AGENT

    def validate(self) -> None:
        """Raises UnknownEnvError when ale_py is missing or does not register the id."""
        gym.register_envs(_ale_py())
        if self.env_id not in gym.registry:
            raise UnknownEnvError(f"unknown env {self.env_id!r}: not an ALE id of ale_py "
                                  f"{_ale_py().__version__}")

    def make_vector(self, num_envs: int, seed: int) -> gym.vector.VectorEnv[Any, Any, Any]:
        """`num_envs` games in one ALE vector env, reset with `seed`.

        Raises:
          RuntimeError: the vector env does not autoreset at the next step.
        """
        self.validate()
        envs = gym.make_vec(self.env_id, num_envs=num_envs,
                            vectorization_mode="vector_entry_point",
                            **{**_ALE_FIXED, **dict(self.options)})
        autoreset = envs.metadata.get("autoreset_mode", gym.vector.AutoresetMode.NEXT_STEP)
        if autoreset != gym.vector.AutoresetMode.NEXT_STEP:
            raise RuntimeError(f"{self.env_id}: expected NEXT_STEP autoreset, got {autoreset}")
        envs.reset(seed=seed)
        return envs

    def make(self, seed: int | None = None) -> gym.Env[Any, Any]:
        """One env as Gymnasium makes it (raw frames: evaluate.py's video)."""
        self.validate()
        env = gym.make(self.env_id)
        if seed is not None:
            env.reset(seed=seed)
        return env

    def reward_threshold(self) -> float | None:
        return None  # ALE ids declare none.

    def spec(self) -> EnvSpec:
        return vector_spec(self)

