"""The CPU env worker: owns K envs as one vector env and only steps them (SEED RL style).

Policy inference happens on the learner's accelerator: every step the worker sends the
K current observations to the inference server and gets K actions back.

Gymnasium 1.x next-step autoreset: after a step that ends an episode (terminated or
truncated), the *next* `step` call resets that env, ignores its action and returns the
first observation of a new episode with reward 0. The worker marks that observation with
`first=True`; learners drop the transition into a `first` observation, so nothing is ever
learned across an episode boundary, while the last observation of a truncated episode is
still there to bootstrap from.
"""

from __future__ import annotations

import os
import secrets
from typing import Any

import numpy as np

from trellis import launch
from trellis.envs.factory import EnvFactory


class EpisodeTracker:
    """Running return and length per env; yields finished episodes."""

    def __init__(self, num_envs: int):
        self._return = np.zeros(num_envs, np.float64)
        self._length = np.zeros(num_envs, np.int64)

    def update(
        self, reward: np.ndarray, done: np.ndarray, first: np.ndarray
    ) -> list[tuple[float, int]]:
        """Adds one step; returns (return, length) of the episodes that ended on it."""
        self._return = np.where(first, 0.0, self._return + reward)
        self._length = np.where(first, 0, self._length + 1)
        return [(float(self._return[i]), int(self._length[i])) for i in np.flatnonzero(done)]


class EnvWorker:
    """Service node that steps `num_envs` envs against a remote (or local) inference server.

    Args:
      env_factory: builds the vector env inside this process.
      inference: client of a node with `step(worker_id, run_id, obs, reward, terminated,
        truncated, first, episodes) -> actions`.
      worker_id: index of this worker; the inference server owns its env slots.
      num_envs: K, the envs this worker steps in lockstep.
      seed: base seed of the first run; a restarted worker (see `launch.restart_count`) seeds
        its envs from (seed, restart count) instead, so it does not replay its first episodes.
        Each run draws a fresh run id, so the server resets the worker's slots.
    """

    def __init__(
        self,
        env_factory: EnvFactory,
        inference: Any,
        worker_id: int,
        num_envs: int,
        seed: int,
    ):
        self._factory = env_factory
        self._inference = inference
        self._worker_id = worker_id
        self._num_envs = num_envs
        self._seed = seed
        self._steps = 0

    def pid(self) -> int:
        return os.getpid()

    def env_steps(self) -> int:
        return self._steps

    def run(self) -> None:
        run_id = secrets.randbits(62)  # New process, new id: the server resets our slots.
        restarts = launch.restart_count()
        seed = self._seed
        if restarts:
            seed = int(np.random.SeedSequence((self._seed, restarts)).generate_state(1)[0])
        envs = self._factory.make_vector(self._num_envs, seed=seed)
        try:
            self._loop(envs, run_id, seed)
        finally:
            envs.close()

    def _loop(self, envs, run_id: int, seed: int) -> None:
        k = self._num_envs
        obs, _ = envs.reset(seed=seed)
        reward = np.zeros(k, np.float32)
        terminated = np.zeros(k, bool)
        truncated = np.zeros(k, bool)
        first = np.ones(k, bool)
        episodes = EpisodeTracker(k)
        finished: list[tuple[float, int]] = []
        stop = launch.stop_event()
        while not stop.is_set():
            actions = self._inference.step(
                self._worker_id, run_id, obs, reward, terminated, truncated, first, finished
            )
            if actions is None:  # The server is shutting down.
                return
            first = terminated | truncated
            obs, reward, terminated, truncated, _ = envs.step(np.asarray(actions))
            reward = np.asarray(reward, np.float32)
            finished = episodes.update(reward, terminated | truncated, first)
            self._steps += k
