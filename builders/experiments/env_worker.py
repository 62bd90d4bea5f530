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

A multi-agent env (envs/multi_agent.py, e.g. PettingZoo's) is stepped the same way, its arrays
keyed by agent flattened into named fields (the wire format, `step_format.StepFormat`):
`obs/<agent>`, `reward/<agent>`, `terminated/<agent>`, `truncated/<agent>`, `alive/<agent>`,
the env's `first` and, where it has one, `global_state`; the actions come back as
`action/<agent>`.
"""

from __future__ import annotations

import os
import secrets
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np

from trellis.builders.experiments.step_format import (
    FAILED,
    REQUEST,
    STOPPING,
    Episode,
    StepFormat,
    pack_hello,
    step_format,
)
from trellis.envs.contract import HostEnvFactory
from trellis.envs.multi_agent import MultiAgentSpec, MultiAgentStep, episode_done
from trellis.envs.specs import GAME_OVER, EnvSpec
from trellis.launch import runtime
from trellis.launch.runtime import shm
from trellis.launch.runtime.node_context import StopEvent

# step(inputs {field: [K, ...]}, episodes) -> the envs' actions, or None when stopping.
Step = Callable[[dict[str, np.ndarray], list[tuple[float, int]]], Any]
T = TypeVar("T")


class EpisodeTracker:
    """Running return and length per env; yields finished episodes."""

    def __init__(self, num_envs: int):
        self._return = np.zeros(num_envs, np.float64)
        self._length = np.zeros(num_envs, np.int64)

    def update(
        self, reward: np.ndarray, done: np.ndarray, first: np.ndarray
    ) -> list[Episode]:
        """Adds one step; returns (return, length) of the episodes that ended on it."""
        self._return = np.where(first, 0.0, self._return + reward)
        self._length = np.where(first, 0, self._length + 1)
        return [(float(self._return[i]), int(self._length[i])) for i in np.flatnonzero(done)]


class TeamEpisodeTracker:
    """The team's running return (the sum over agents) and length per env of a multi-agent
    vector env; yields the finished episodes (no agent acts any more)."""

    def __init__(self, num_envs: int, agents: Sequence[str]):
        self._agents = tuple(agents)
        self._episodes = EpisodeTracker(num_envs)

    def update(self, step: MultiAgentStep) -> list[Episode]:
        """Adds one step; returns (return, length) of the episodes that ended on it."""
        reward = np.sum([step.reward[a] for a in self._agents], axis=0)
        done = np.asarray(episode_done(step, self._agents)) & ~step.first
        return self._episodes.update(reward, done, step.first)


class _GymnasiumEnvs:
    """A Gymnasium vector env (next-step autoreset) as the fields of `StepFormat`.

    The episodes it reports are games: where the env's info has `GAME_OVER` (Atari with
    episodic life), a lost life ends the agent's episode but not the game's return and length.
    """

    def __init__(self, envs: Any, num_envs: int):
        self._envs = envs
        self._episodes = EpisodeTracker(num_envs)
        self._done = np.zeros(num_envs, bool)
        self._game_over = np.zeros(num_envs, bool)

    def reset(self, seed: int) -> dict[str, np.ndarray]:
        obs, _ = self._envs.reset(seed=seed)
        k = len(self._done)
        return {"obs": obs, "reward": np.zeros(k, np.float32), "terminated": np.zeros(k, bool),
                "truncated": np.zeros(k, bool), "first": np.ones(k, bool)}

    def step(self, actions: Any) -> tuple[dict[str, np.ndarray], list[Episode]]:
        first = self._done  # The step after an episode's end is the next one's first.
        game_first = self._game_over
        obs, reward, terminated, truncated, info = self._envs.step(np.asarray(actions))
        reward = np.asarray(reward, np.float32)
        self._done = terminated | truncated
        self._game_over = truncated | np.asarray(info.get(GAME_OVER, terminated), bool)
        finished = self._episodes.update(reward, self._game_over, game_first)
        return {"obs": obs, "reward": reward, "terminated": terminated, "truncated": truncated,
                "first": first}, finished


class _MultiAgentEnvs:
    """A multi-agent vector env (`pettingzoo_envs.PettingZooVector`) as the fields of
    `StepFormat`."""

    def __init__(self, envs: Any, fmt: StepFormat, num_envs: int):
        self._envs = envs
        self._format = fmt
        self._episodes = TeamEpisodeTracker(num_envs, fmt.agents)

    def reset(self, seed: int) -> dict[str, np.ndarray]:
        return self._format.flatten(self._envs.reset(seed=seed))

    def step(self, actions: Any) -> tuple[dict[str, np.ndarray], list[Episode]]:
        step = self._envs.step(actions)
        return self._format.flatten(step), self._episodes.update(step)


class EnvWorker:
    """Service node that steps `num_envs` envs against a remote (or local) inference server.

    With `buffers` > 1 its envs are that many groups, each stepped in lockstep in a thread of
    its own and seen by inference as a worker of its own (worker `worker_id * buffers + g`):
    while one group's step is at inference, another's envs step (double-buffered sampling),
    so the worker's cores need not wait for the round trip.

    Args:
      env_factory: builds the vector envs inside this process (single- or multi-agent).
      inference: client of a node with `step(worker_id, run_id, inputs, episodes) -> actions`
        (`inputs`: {field: [K, ...]} of `StepFormat`; `episodes`: those that finished on this
        step) and `shm_address() -> str | None` (where its shared-memory hub listens, if it has
        one).
      worker_id: index of this worker; the inference server owns its groups' env slots.
      num_envs: the envs this worker steps, `buffers` groups of K = num_envs / buffers.
      seed: base seed of the first run (group g's envs: seed + g * K ...); a restarted worker
        (see `runtime.restart_count`) seeds its envs from (seed, restart count) instead, so it
        does not replay its first episodes. Each run draws fresh run ids, so the server resets
        the worker's slots.
      buffers: the groups (`ExperimentConfig.env_buffers`).
    """

    def __init__(
        self,
        env_factory: HostEnvFactory,
        inference: Any,
        worker_id: int,
        num_envs: int,
        seed: int,
        buffers: int = 1,
    ):
        if num_envs % buffers:
            raise ValueError(f"{num_envs} envs do not split into {buffers} equal groups")
        self._factory = env_factory
        self._inference = inference
        self._worker_id = worker_id
        self._group_envs = num_envs // buffers
        self._buffers = buffers
        self._seed = seed
        self._steps = [0] * buffers  # Per group: each is counted by its own thread only.

    def pid(self) -> int:
        return os.getpid()

    def env_steps(self) -> int:
        return sum(self._steps)

    def run(self) -> None:
        """Steps every group until the program stops; a group's failure stops the others and
        is raised here (the node fails, and restarts)."""
        # Read here: a platform of threads binds the node's context to this thread only.
        stop, restarts = _GroupStop(runtime.stop_event()), runtime.restart_count()
        if self._buffers == 1:
            self._run_group(0, stop, restarts)
            return
        errors: list[BaseException] = []

        def run_group(group: int) -> None:
            try:
                self._run_group(group, stop, restarts)
            except BaseException as e:
                errors.append(e)
                stop.failed.set()

        threads = [threading.Thread(target=run_group, args=(g,), name=f"envs-{g}")
                   for g in range(self._buffers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]

    def _run_group(self, group: int, stop: _GroupStop, restarts: int) -> None:
        worker_id = self._worker_id * self._buffers + group
        seed = restart_seed(self._seed + group * self._group_envs, restarts)
        spec = self._factory.spec()
        fmt = step_format(spec)
        envs = self._factory.make_vector(self._group_envs, seed=seed)
        stepped = (_MultiAgentEnvs(envs, fmt, self._group_envs) if fmt.multi_agent
                   else _GymnasiumEnvs(envs, self._group_envs))
        try:
            # A learner restarted after dying (`max_learner_restarts`) serves at the same
            # address: the group connects to it again, and its envs start new episodes.
            connections = 0
            while not self._connected(group, worker_id, stepped, seed, stop):
                connections += 1
                seed = drawn_seed(seed, connections)
        finally:
            envs.close()

    def _connected(self, group: int, worker_id: int, envs: _GymnasiumEnvs | _MultiAgentEnvs,
                   seed: int, stop: _GroupStop) -> bool:
        """Steps the group's envs, reset with `seed`, through one connection to the inference
        server: True once the program stops, False where the server is lost first."""
        run_id = secrets.randbits(62)  # A new id: the server resets our slots.
        spec = self._factory.spec()
        channel = None
        try:
            # Also the RPC: its socket, left from a server that died, fails once.
            channel = _lost_on_error(self._shm_channel)(worker_id, run_id, spec, stop)
            step = (self._socket_step(worker_id, run_id) if channel is None
                    else shm_step(channel, step_format(spec), stop))
            self._loop(group, envs, _lost_on_error(step), seed, stop)
            return True
        except InferenceLost as e:
            if stop.wait(1.0):  # The learner stopped with the program.
                return True
            print(f"env worker {worker_id}: {e}; connecting again", file=sys.stderr, flush=True)
            return False
        finally:
            if channel is not None:
                channel.close()

    def _shm_channel(self, worker_id: int, run_id: int, spec: EnvSpec | MultiAgentSpec,
                     stop: _GroupStop) -> shm.Channel | None:
        """Slots shared with the inference server, or None: it offers none, or they fail here."""
        address = self._inference.shm_address()
        if address is None:
            return None
        layout = step_format(spec).shm_layout(self._group_envs)
        try:
            return shm.connect(address, layout, pack_hello(worker_id, run_id), row=worker_id)
        except OSError as e:  # Another host, another network namespace, not enough memory.
            # Or a learner that stopped as this worker connected (a budget of one round, 64
            # workers on 2 cores), its hub closed, maybe just before our stop event is set.
            if isinstance(e, ConnectionError) and stop.wait(1.0):
                return None
            print(f"env worker {worker_id}: no shared memory with the inference server "
                  f"({e}); stepping over the socket", file=sys.stderr, flush=True)
            return None

    def _socket_step(self, worker_id: int, run_id: int) -> Step:
        def step(inputs: dict[str, np.ndarray], episodes: list[Episode]) -> Any:
            return self._inference.step(worker_id, run_id, inputs, episodes)
        return step

    def _loop(self, group: int, envs: _GymnasiumEnvs | _MultiAgentEnvs, step: Step, seed: int,
              stop: _GroupStop) -> None:
        inputs = envs.reset(seed)
        finished: list[Episode] = []
        while not stop.is_set():
            actions = step(inputs, finished)
            if actions is None:  # The server is shutting down.
                return
            inputs, finished = envs.step(actions)
            self._steps[group] += self._group_envs


class InferenceLost(ConnectionError):
    """The connection to the inference server broke during a step (its node died)."""


def _lost_on_error(call: Callable[..., T]) -> Callable[..., T]:
    """`call` (a step, an RPC), whose lost connections raise `InferenceLost`: not an env's
    own errors."""
    def guarded(*args: Any) -> T:
        try:
            return call(*args)
        except ConnectionError as e:
            raise InferenceLost(f"lost the inference server ({e})") from e
    return guarded


class _GroupStop:
    """What ends a group's loop: the program's stop, or another group's failure (`failed`)."""

    def __init__(self, program: StopEvent):
        self._program = program
        self.failed = threading.Event()

    def is_set(self) -> bool:
        return self._program.is_set() or self.failed.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.is_set():
            remaining = 0.05 if deadline is None else min(0.05, deadline - time.monotonic())
            if remaining <= 0:
                break
            self._program.wait(remaining)
        return self.is_set()


def restart_seed(seed: int, restarts: int) -> int:
    """The envs' seed of a worker's run after `restarts` restarts: `seed` itself first, then
    `drawn_seed(seed, restarts)`."""
    if not restarts:
        return seed
    return drawn_seed(seed, restarts)


def drawn_seed(*entropy: int) -> int:
    """A vector env's seed drawn from `entropy`, in [0, 2^31) as envpool takes int32 seeds
    only. Seeds counted up instead (seed + 1, ...) would share envs: a vector env seeds its K
    envs seed .. seed + K - 1."""
    return int(np.random.SeedSequence(entropy).generate_state(1)[0] >> 1)


def shm_step(channel: shm.Channel, fmt: StepFormat, stop: StopEvent) -> Step:
    """A step through shared slots: write them, wake the server, wait for its answer.

    The wait is bounded so that a stop is noticed; a server that died closes the channel,
    which raises `ConnectionError` at once (the worker fails and is restarted or stopped).
    """
    slots = channel.arrays

    def step(inputs: dict[str, np.ndarray], episodes: list[Episode]) -> Any:
        for name, value in inputs.items():
            slots[name][:] = value
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
        # The server writes the next actions into the slots.
        return fmt.env_actions({name: slots[name].copy() for name in fmt.actions})

    return step
