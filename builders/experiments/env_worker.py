"""The CPU env worker: owns K envs as one vector env and only steps them (SEED RL style).

Policy inference happens on the learner's accelerator: every step the worker sends the
K current observations to the inference server and gets K actions back. On the server's host
they travel through shared memory (`runtime.shm`: the worker writes its step into its slots,
one byte wakes the server, one byte says the actions are there); elsewhere, or where shared
memory cannot be had, through the `step` RPC.

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
import struct
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from trellis.envs.factory import EnvFactory
from trellis.envs.specs import EnvSpec
from trellis.launch import runtime
from trellis.launch.runtime import shm
from trellis.launch.runtime.node_context import StopEvent

# The one-byte messages of a shared-memory step: the worker's request, the server's answers.
REQUEST, ACTIONS, STOPPING, FAILED = 1, 2, 3, 4
Step = Callable[..., np.ndarray | None]


def shm_layout(spec: EnvSpec, num_envs: int) -> shm.Layout:
    """The shared slots of one worker: its step's inputs, finished episodes, the actions back.

    `episodes` holds (return, length) of the episodes that ended, in its first `num_episodes`
    rows.
    """
    k = num_envs
    return {
        "obs": ((k, *spec.observation_shape), spec.observation_dtype),
        "reward": ((k,), "float32"),
        "terminated": ((k,), "bool"),
        "truncated": ((k,), "bool"),
        "first": ((k,), "bool"),
        "episodes": ((k, 2), "float64"),
        "num_episodes": ((), "int64"),
        "action": ((k, *spec.action_shape), spec.action_dtype),
    }


def pack_hello(worker_id: int, run_id: int) -> bytes:
    return struct.pack("!qq", worker_id, run_id)


def unpack_hello(hello: bytes) -> tuple[int, int]:
    """(worker_id, run_id) of a channel's hello."""
    worker_id, run_id = struct.unpack("!qq", hello)
    return worker_id, run_id


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
        truncated, first, episodes) -> actions` and `shm_address() -> str | None` (where its
        shared-memory hub listens, if it has one).
      worker_id: index of this worker; the inference server owns its env slots.
      num_envs: K, the envs this worker steps in lockstep.
      seed: base seed of the first run; a restarted worker (see `runtime.restart_count`) seeds
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
        restarts = runtime.restart_count()
        seed = self._seed
        if restarts:
            seed = int(np.random.SeedSequence((self._seed, restarts)).generate_state(1)[0])
        envs = self._factory.make_vector(self._num_envs, seed=seed)
        channel = self._shm_channel(run_id)
        try:
            step = (self._socket_step(run_id) if channel is None
                    else shm_step(channel, runtime.stop_event()))
            self._loop(envs, step, seed)
        finally:
            envs.close()
            if channel is not None:
                channel.close()

    def _shm_channel(self, run_id: int) -> shm.Channel | None:
        """Slots shared with the inference server, or None: it offers none, or they fail here."""
        address = self._inference.shm_address()
        if address is None:
            return None
        layout = shm_layout(self._factory.spec(), self._num_envs)
        try:
            return shm.connect(address, layout, pack_hello(self._worker_id, run_id))
        except OSError as e:  # Another host, another network namespace, not enough memory.
            print(f"env worker {self._worker_id}: no shared memory with the inference server "
                  f"({e}); stepping over the socket", file=sys.stderr, flush=True)
            return None

    def _socket_step(self, run_id: int) -> Step:
        def step(obs, reward, terminated, truncated, first, episodes):
            return self._inference.step(self._worker_id, run_id, obs, reward, terminated,
                                        truncated, first, episodes)
        return step

    def _loop(self, envs, step: Step, seed: int) -> None:
        k = self._num_envs
        obs, _ = envs.reset(seed=seed)
        reward = np.zeros(k, np.float32)
        terminated = np.zeros(k, bool)
        truncated = np.zeros(k, bool)
        first = np.ones(k, bool)
        episodes = EpisodeTracker(k)
        finished: list[tuple[float, int]] = []
        stop = runtime.stop_event()
        while not stop.is_set():
            actions = step(obs, reward, terminated, truncated, first, finished)
            if actions is None:  # The server is shutting down.
                return
            first = terminated | truncated
            obs, reward, terminated, truncated, _ = envs.step(np.asarray(actions))
            reward = np.asarray(reward, np.float32)
            finished = episodes.update(reward, terminated | truncated, first)
            self._steps += k


def shm_step(channel: shm.Channel, stop: StopEvent) -> Step:
    """A step through shared slots: write them, wake the server, wait for its answer.

    The wait is bounded so that a stop is noticed; a server that died closes the channel,
    which raises `ConnectionError` at once (the worker fails and is restarted or stopped).
    """
    slots = channel.arrays

    def step(obs, reward, terminated, truncated, first, episodes):
        slots["obs"][:] = obs
        slots["reward"][:] = reward
        slots["terminated"][:] = terminated
        slots["truncated"][:] = truncated
        slots["first"][:] = first
        if episodes:
            slots["episodes"][:len(episodes)] = episodes
        slots["num_episodes"][...] = len(episodes)
        channel.send(REQUEST)
        try:
            while (answer := channel.receive(0.1)) is None:
                if stop.is_set():
                    return None
        except ConnectionError:
            # A stopping learner closes the channel, maybe just before our stop event is set.
            if stop.wait(1.0):
                return None
            raise
        if answer == STOPPING:
            return None
        if answer == FAILED:
            raise RuntimeError("inference failed on the learner node (see its traceback)")
        return slots["action"].copy()  # The server writes the next actions into the slot.

    return step
