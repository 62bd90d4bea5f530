"""SEED-style central inference: dynamic batching over env workers, unrolls kept here.

Every env worker sends the K observations of its envs and waits for K actions. The serving
thread gathers requests until `max_batch` envs are waiting or `timeout_s` has passed since
the first one, runs the jitted policy once on the concatenation, and replies to each
worker with its slice. What the policy saw and did is written into per-slot unroll buffers
on this side (env workers stay stateless); each full unroll of T + 1 steps goes to the
learner through `on_unroll`.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from collections.abc import Callable, Mapping

import jax
import numpy as np

from trellis.builders.base import ArraySpec, Policy
from trellis.envs.specs import EnvSpec


def step_specs(spec: EnvSpec, extras: Mapping[str, ArraySpec]) -> dict[str, ArraySpec]:
    """The fields of one recorded step, as stored in unrolls.

    How the observation was reached (reward, terminated, truncated, first) and what the
    policy did there (action, extras).
    """
    return {
        "obs": ArraySpec(spec.observation_shape, spec.observation_dtype),
        "reward": ArraySpec((), "float32"),
        "terminated": ArraySpec((), "bool"),
        "truncated": ArraySpec((), "bool"),
        "first": ArraySpec((), "bool"),
        "action": ArraySpec(spec.action_shape, spec.action_dtype),
        **extras,
    }


@dataclasses.dataclass
class _Request:
    worker_id: int
    run_id: int
    data: dict[str, np.ndarray]
    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    actions: np.ndarray | None = None
    error: BaseException | None = None


class UnrollRecorder:
    """Per-worker unroll buffers [T + 1, K, ...]; emits a copy when one is full.

    A worker's K envs advance in lockstep, so one time index per worker suffices. The last
    step of an unroll is kept as the first of the next. A new run id for a worker (the
    process restarted) drops its partial unroll, so no unroll spans two runs.
    """

    def __init__(
        self,
        specs: Mapping[str, ArraySpec],
        num_workers: int,
        envs_per_worker: int,
        unroll_length: int,
        on_unroll: Callable[[dict[str, np.ndarray]], None],
    ):
        self._buffers = {
            name: s.zeros((num_workers, unroll_length + 1, envs_per_worker))
            for name, s in specs.items()
        }
        self._t = np.zeros(num_workers, np.int64)
        self._run_ids: list[int | None] = [None] * num_workers
        self._length = unroll_length + 1
        self._on_unroll = on_unroll
        self.resets = 0

    def record(self, worker_id: int, run_id: int, step: Mapping[str, np.ndarray]) -> None:
        if self._run_ids[worker_id] != run_id:
            if self._run_ids[worker_id] is not None:
                self.resets += 1
            self._run_ids[worker_id] = run_id
            self._t[worker_id] = 0
        t = self._t[worker_id]
        for name, buffer in self._buffers.items():
            buffer[worker_id, t] = step[name]
        t += 1
        if t == self._length:
            self._on_unroll({name: b[worker_id].copy() for name, b in self._buffers.items()})
            for buffer in self._buffers.values():
                buffer[worker_id, 0] = buffer[worker_id, -1]
            t = 1
        self._t[worker_id] = t


def _bucket(n: int) -> int:
    """Pads batch sizes to powers of two so the policy compiles a handful of times."""
    return 1 << max(0, n - 1).bit_length()


class InferenceServer:
    """Batches policy calls from many env workers and records their unrolls.

    Args:
      policy: jitted `policy(params, key, obs[N]) -> (actions[N], extras)`.
      params: initial params (replace with `set_params`; read by reference, no copy).
      key: RNG key, split once per batch.
      specs: recorded fields (see `step_specs`).
      num_workers, envs_per_worker: the env slots served (worker_id in [0, num_workers)).
      unroll_length: T.
      on_unroll: receives each full unroll {field: [T + 1, K, ...]}; may block (back-pressure).
      max_batch: envs per policy call at most (default: all of them).
      timeout_s: how long a batch waits for more workers after its first request.
      stop: an event; once set, pending and new requests get `None` instead of actions.
    """

    def __init__(
        self,
        policy: Policy,
        params,
        key: jax.Array,
        specs: Mapping[str, ArraySpec],
        num_workers: int,
        envs_per_worker: int,
        unroll_length: int,
        on_unroll: Callable[[dict[str, np.ndarray]], None],
        stop: threading.Event,
        max_batch: int | None = None,
        timeout_s: float = 0.002,
    ):
        self._policy = policy
        self._params = params
        self._key = key
        self._specs = dict(specs)
        self._num_workers = num_workers
        self._k = envs_per_worker
        self._max_batch = max_batch or num_workers * envs_per_worker
        self._timeout_s = timeout_s
        self._stop = stop
        self._requests: queue.Queue[_Request] = queue.Queue()
        self._recorder = UnrollRecorder(
            self._specs, num_workers, envs_per_worker, unroll_length, on_unroll
        )
        # Not a daemon: the interpreter joins it at exit (it ends once `stop` is set). A daemon
        # thread still inside a JAX call when the interpreter finalizes is unwound by
        # pthread_exit through XLA's C++ frames, which aborts the process with "terminate
        # called after throwing an instance of '' / FATAL: exception not rethrown".
        self._thread = threading.Thread(target=self._serve, name="inference")
        self.batches = 0
        self.steps = 0

    @property
    def slot_resets(self) -> int:
        """How many times a worker came back with a new run id (its slots were reset)."""
        return self._recorder.resets

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def set_params(self, params) -> None:
        self._params = params  # An atomic reference swap; the next batch uses it.

    def step(
        self,
        worker_id: int,
        run_id: int,
        obs: np.ndarray,
        reward: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        first: np.ndarray,
    ) -> np.ndarray | None:
        """Called by env worker `worker_id` (any thread); blocks until its actions are ready.

        Returns:
          actions [K, ...], or None once the server is stopping.

        Raises:
          ValueError: worker_id out of range or arrays of the wrong shape (nothing recorded).
        """
        if not 0 <= worker_id < self._num_workers:
            raise ValueError(f"worker_id {worker_id} not in [0, {self._num_workers})")
        data = {"obs": obs, "reward": reward, "terminated": terminated,
                "truncated": truncated, "first": first}
        for name, value in data.items():
            expected = (self._k,) + self._specs[name].shape
            if np.shape(value) != expected:
                raise ValueError(
                    f"worker {worker_id}: {name} has shape {np.shape(value)}, expected {expected}"
                )
        request = _Request(worker_id, run_id, data)
        self._requests.put(request)
        while not request.done.wait(0.1):
            if self._stop.is_set():
                return None
        if request.error is not None:
            raise RuntimeError("inference failed") from request.error
        return request.actions

    def _gather(self) -> list[_Request]:
        try:
            first = self._requests.get(timeout=0.05)
        except queue.Empty:
            return []
        batch, size = [first], self._k
        deadline = time.monotonic() + self._timeout_s
        while size < self._max_batch:
            remaining = deadline - time.monotonic()
            try:
                request = (self._requests.get(timeout=remaining) if remaining > 0
                           else self._requests.get_nowait())
            except queue.Empty:
                break
            batch.append(request)
            size += self._k
        return batch

    def _serve(self) -> None:
        while not self._stop.is_set():
            batch = self._gather()
            if not batch:
                continue
            try:
                self._infer(batch)
            except BaseException as e:
                # A peer that stopped first (a replay node taking unrolls) is part of stopping,
                # not an error: the workers get the stop answer (None) and the thread ends.
                stopping = self._stop.is_set() and isinstance(e, ConnectionError | EOFError)
                for request in batch:  # Wake the workers, then let the node fail.
                    request.error = None if stopping else e
                    request.done.set()
                if stopping:
                    return
                raise

    def _infer(self, batch: list[_Request]) -> None:
        n = len(batch) * self._k
        obs = np.concatenate([r.data["obs"] for r in batch])
        padded = np.zeros((_bucket(n),) + obs.shape[1:], obs.dtype)
        padded[:n] = obs
        self._key, key = jax.random.split(self._key)
        actions, extras = self._policy(self._params, key, padded)
        actions = np.asarray(actions)[:n]
        extras = {name: np.asarray(v)[:n] for name, v in extras.items()}
        for i, request in enumerate(batch):
            rows = slice(i * self._k, (i + 1) * self._k)
            request.actions = actions[rows]
            step = dict(request.data, action=request.actions)
            step.update({name: v[rows] for name, v in extras.items()})
            self._recorder.record(request.worker_id, request.run_id, step)
            request.done.set()
        self.batches += 1
        self.steps += n
