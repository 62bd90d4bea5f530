"""A sleep env, "sleep:MS": each step of a worker's batch of envs sleeps MS milliseconds and uses
no CPU, so a 2-core machine can stand in for many env cores.

It measures what does not depend on the env: how central inference scales to 32 or 64 env
workers (`benchmarks/scaling.py --sleep_ms=20`), and how stale the learner's data gets when
the workers outrun it (`policy_lag_mean`, `policy_lag_max`). With W workers of K envs each,
the ideal rate is W * K / MS * 1000 env steps/s.

The task is a contextual bandit in episodes of fixed length, so that learning is real and
cheap: the observation is 4 uniform numbers in [-1, 1), the reward is 1 when the action is
whether the first is positive, and every episode ends (terminated) after `EPISODE_LENGTH`
steps. Autoreset is next-step, as the env workers expect (envs/factory.py's make_vector).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import gymnasium as gym
import numpy as np

from trellis.envs.contract import Players
from trellis.envs.errors import UnknownEnvError
from trellis.envs.specs import EnvSpec, spec_from_spaces

PREFIX = "sleep:"
EPISODE_LENGTH = 100
_OBSERVATION = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
_ACTION: gym.spaces.Discrete[np.int64] = gym.spaces.Discrete(2)


class SleepVector:
    """`num_envs` bandit episodes stepped together; each step sleeps `sleep_s` once."""

    def __init__(self, num_envs: int, sleep_s: float, seed: int) -> None:
        self.num_envs = num_envs
        self.single_observation_space = _OBSERVATION
        self.single_action_space = _ACTION
        self._sleep_s = sleep_s
        self._rng = np.random.default_rng(seed)
        self._obs = self._draw()
        self._t = np.zeros(num_envs, np.int64)  # Steps into the current episode.

    def _draw(self) -> np.ndarray:
        return self._rng.uniform(-1.0, 1.0, (self.num_envs, 4)).astype(np.float32)

    def reset(self, seed: int | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self._obs = self._draw()
        self._t[:] = 0
        return self._obs.copy(), {}

    def step(self, actions: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        time.sleep(self._sleep_s)
        first = self._t == EPISODE_LENGTH  # Ended last step: this step resets them.
        reward = np.where(first, 0.0, (np.asarray(actions) == (self._obs[:, 0] > 0))
                          ).astype(np.float32)
        self._t = np.where(first, 0, self._t + 1)
        self._obs = self._draw()
        terminated = self._t == EPISODE_LENGTH
        return (self._obs.copy(), reward, terminated, np.zeros(self.num_envs, bool), {})

    def close(self) -> None:
        pass


@dataclasses.dataclass(frozen=True)
class SleepFactory:
    """Builds sleep envs for one "sleep:MS" id (MS a non-negative number of milliseconds)."""

    env_id: str

    jax_native = False  # Stepped by env workers on the host.
    players = Players.SINGLE_AGENT

    @property
    def sleep_ms(self) -> float:
        text = self.env_id[len(PREFIX):]
        try:
            ms = float(text)
        except ValueError:
            ms = -1.0
        if not ms >= 0:  # Also refuses nan.
            raise UnknownEnvError(f"env {self.env_id!r}: expected sleep:MS with MS the "
                                  f"milliseconds each step sleeps, e.g. sleep:20")
        return ms

    def validate(self) -> None:
        """Raises UnknownEnvError when the milliseconds are not a non-negative number."""
        _ = self.sleep_ms

    def make_vector(self, num_envs: int, seed: int) -> SleepVector:
        envs = SleepVector(num_envs, self.sleep_ms / 1000.0, seed)
        envs.reset(seed=seed)
        return envs

    def make(self, seed: int | None = None) -> gym.Env[Any, Any]:
        raise UnknownEnvError(f"{self.env_id}: sleep envs come in batches for env workers")

    def reward_threshold(self) -> float | None:
        """None: no return to stop at (it measures throughput and lag, not learning)."""
        return None

    def spec(self) -> EnvSpec:
        self.validate()
        return spec_from_spaces(_OBSERVATION, _ACTION)
