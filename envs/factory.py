"""The env factory for Gymnasium ids, the one an id gets when no other family claims it
(envs/registry.py).

A factory is a small frozen dataclass, so it pickles cheaply into any node and builds the
envs where they run (an env worker process), never in the launcher.
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any

import gymnasium as gym

from trellis.envs import cartpole_novel, popgym_envs
from trellis.envs.contract import Players
from trellis.envs.errors import UnknownEnvError
from trellis.envs.specs import EnvSpec, vector_spec

# Ids whose packages register on import (MuJoCo ships with gymnasium; ALE ids have their own
# factories, envs/atari.py), as prefix: (module, the pyproject extra that installs it).
_PLUGIN_MODULES = {popgym_envs.PREFIX: ("popgym", "popgym")}
# Ids whose envs need wrapping to fit EnvSpec, as prefix: wrapper.
_ADAPTERS = {popgym_envs.PREFIX: popgym_envs.adapt}


def _register_plugins(env_id: str) -> None:
    cartpole_novel.register()  # Trellis's own ids.
    for prefix, (module, extra) in _PLUGIN_MODULES.items():
        if env_id.startswith(prefix):
            try:
                gym.register_envs(__import__(module))
            except ImportError as e:
                raise UnknownEnvError(
                    f"env {env_id!r} needs the {module!r} package: pip install -e '.[{extra}]'"
                ) from e


def _adapters(env_id: str) -> list:
    return [adapt for prefix, adapt in _ADAPTERS.items() if env_id.startswith(prefix)]


@dataclasses.dataclass(frozen=True)
class GymnasiumFactory:
    """Builds Gymnasium envs for one id.

    Attributes:
      env_id: a registered Gymnasium id, e.g. "CartPole-v1", "ALE/Pong-v5", "HalfCheetah-v5".
      kwargs: keyword arguments passed to gymnasium.make.
    """

    env_id: str
    kwargs: tuple[tuple[str, Any], ...] = ()

    jax_native = False  # Stepped by env workers on the host, not inside jitted code.
    players = Players.SINGLE_AGENT

    def validate(self) -> None:
        """Raises UnknownEnvError, naming close matches, when the id is not registered, or
        when its envs' spaces cannot be adapted (POPGym's ids with MultiDiscrete actions)."""
        _register_plugins(self.env_id)
        if self.env_id not in gym.registry:
            close = difflib.get_close_matches(self.env_id, list(gym.registry), n=5, cutoff=0.5)
            hint = f" Did you mean: {', '.join(close)}?" if close else ""
            raise UnknownEnvError(
                f"unknown env {self.env_id!r}: not a registered Gymnasium id.{hint} "
                "(List them with: python -c 'import gymnasium; gymnasium.pprint_registry()')"
            )
        if _adapters(self.env_id):
            # The spaces are known only once an env is built; the adapted ids build cheaply.
            self._adapt(gym.make(self.env_id, **dict(self.kwargs))).close()

    def _adapt(self, env: gym.Env) -> gym.Env:
        for adapt in _adapters(self.env_id):
            env = adapt(env)
        return env

    def make(self, seed: int | None = None) -> gym.Env:
        """One env, reset with `seed` when given (for evaluation and spec queries)."""
        self.validate()
        env = self._adapt(gym.make(self.env_id, **dict(self.kwargs)))
        if seed is not None:
            env.reset(seed=seed)
        return env

    def make_vector(self, num_envs: int, seed: int) -> gym.vector.VectorEnv:
        """`num_envs` envs as one Gymnasium vector env with next-step autoreset.

        The env's own vectorised implementation is used when it has one (CartPole's numpy
        version steps all envs in one call); otherwise a SyncVectorEnv, of adapted envs for
        the ids that need it. Either way, the autoreset mode is NEXT_STEP, which EnvWorker
        relies on.
        """
        self.validate()
        spec = gym.spec(self.env_id)
        adapters = _adapters(self.env_id)
        if spec.vector_entry_point and not self.kwargs and not adapters:
            mode, wrappers = "vector_entry_point", None
        else:
            mode, wrappers = "sync", adapters
        envs = gym.make_vec(self.env_id, num_envs=num_envs, vectorization_mode=mode,
                            wrappers=wrappers, **dict(self.kwargs))
        autoreset = envs.metadata.get("autoreset_mode", gym.vector.AutoresetMode.NEXT_STEP)
        if autoreset != gym.vector.AutoresetMode.NEXT_STEP:
            raise RuntimeError(f"{self.env_id}: expected NEXT_STEP autoreset, got {autoreset}")
        envs.reset(seed=seed)
        return envs

    def reward_threshold(self) -> float | None:
        """The id's Gymnasium reward_threshold (what --stop_at_return=auto stops at)."""
        return gym.spec(self.env_id).reward_threshold

    def spec(self) -> EnvSpec:
        """Spec of one env as the env workers see it (through `make_vector`).

        Vectorised implementations may preprocess (ALE's gives stacked 84x84 grey frames),
        so the spec comes from the vector env's single-env spaces, not from `gym.make`.
        """
        return vector_spec(self)
