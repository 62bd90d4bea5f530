"""The learner node: learner and inference server in one process, sharing the params."""

from __future__ import annotations

import collections
import math
import threading
import time
from typing import Any

import jax
import numpy as np

import launch
from builders.base import Builder, ExperimentConfig, QueueSpec
from builders.inference import InferenceServer, step_specs
from builders.unroll_queue import LocalUnrollQueue, TableUnrollQueue
from envs.factory import EnvFactory
from reverb_tables import ReplayClient


class UnrollBatcher:
    """Concatenates per-worker unroll chunks [T + 1, K, ...] into batches [T + 1, B, ...]."""

    def __init__(self, batch_size: int):
        self._batch_size = batch_size
        self._chunks: list[dict[str, np.ndarray]] = []
        self._columns = 0

    def add(self, chunk: dict[str, np.ndarray]) -> None:
        self._chunks.append(chunk)
        self._columns += next(iter(chunk.values())).shape[1]

    def pop(self) -> dict[str, np.ndarray] | None:
        """A full batch if enough columns are pending; the rest stays for the next one."""
        if self._columns < self._batch_size:
            return None
        joined = {k: np.concatenate([c[k] for c in self._chunks], axis=1)
                  for k in self._chunks[0]}
        b = self._batch_size
        rest = {k: v[:, b:] for k, v in joined.items()}
        self._columns -= b
        self._chunks = [rest] if self._columns else []
        return {k: v[:, :b] for k, v in joined.items()}


class LearnerNode:
    """Service node: central inference for the env workers, and the learner loop in `run()`.

    RPCs: `step(...)` for env workers (see EnvWorker), `stats()` for progress displays.
    The program stops (via `launch.request_stop`) when the env-step budget or the return
    target is reached; `info` carries the final stats.

    Args:
      builder, env_factory, config: the agent, its envs and the experiment settings.
      replay: with `config.unroll_queue == "replay"`, the replay node holding the unroll
        table (`builders.unroll_queue.unroll_table_spec`); unrolls go through it.
    """

    def __init__(self, builder: Builder, env_factory: EnvFactory, config: ExperimentConfig,
                 replay: Any = None):
        self._config = config
        spec = env_factory.spec()
        learner_key, inference_key = jax.random.split(jax.random.PRNGKey(config.seed))
        networks = builder.make_networks(spec)
        self._learner = builder.make_learner(networks, spec, learner_key)
        queue_spec = builder.queue_spec()
        if replay is None:
            self._unrolls = LocalUnrollQueue(max_unrolls(queue_spec, config))
        else:
            self._unrolls = TableUnrollQueue(ReplayClient(replay))
        self._batcher = UnrollBatcher(queue_spec.batch_size)
        self._stop = launch.stop_event()
        self._inference = InferenceServer(
            policy=jax.jit(builder.make_policy(networks)),
            params=self._learner.params,
            key=inference_key,
            specs=step_specs(spec, builder.extras_spec(spec)),
            num_workers=config.num_actors,
            envs_per_worker=config.envs_per_actor,
            unroll_length=queue_spec.unroll_length,
            on_unroll=self._put_unroll,
            stop=self._stop,
            timeout_s=config.inference_timeout_ms / 1000.0,
        )
        self._lock = threading.Lock()
        self._env_steps = 0
        self._learner_steps = 0
        self._episodes = 0
        self._returns: collections.deque[float] = collections.deque(maxlen=config.return_window)
        self._lengths: collections.deque[int] = collections.deque(maxlen=config.return_window)
        self._metrics: dict[str, float] = {}
        self._start = time.monotonic()
        self._rate = _Rate()

    # --- RPCs -------------------------------------------------------------------------

    def step(self, worker_id, run_id, obs, reward, terminated, truncated, first, episodes):
        """One env-worker step: records finished episodes, returns the actions (or None)."""
        with self._lock:
            self._env_steps += len(obs)
            for episode_return, length in episodes:
                self._returns.append(episode_return)
                self._lengths.append(length)
                self._episodes += 1
        return self._inference.step(worker_id, run_id, obs, reward, terminated, truncated, first)

    def stats(self) -> dict[str, Any]:
        with self._lock:
            returns = list(self._returns)
            lengths = list(self._lengths)
            stats = {
                "env_steps": self._env_steps,
                "learner_steps": self._learner_steps,
                "episodes": self._episodes,
                "mean_return": float(np.mean(returns)) if returns else None,
                "returns_in_window": len(returns),
                "mean_episode_length": float(np.mean(lengths)) if lengths else None,
            }
        stats.update(
            elapsed_s=time.monotonic() - self._start,
            env_steps_per_s=self._rate.update(stats["env_steps"]),
            inference_batches=self._inference.batches,
            slot_resets=self._inference.slot_resets,
            queue_size=self._unrolls.size(),
            **self._metrics,
        )
        return stats

    # --- Learner loop -----------------------------------------------------------------

    def run(self) -> None:
        self._start = time.monotonic()
        self._inference.start()
        last_log = 0.0
        metrics = None
        try:
            while not self._stop.is_set():
                reason = self._stop_reason()
                if reason:
                    launch.request_stop(reason, info=self.stats())
                    return
                batch = self._next_batch()
                if batch is None or not self._config.learn:
                    continue
                metrics = self._learner.step(batch)
                self._inference.set_params(self._learner.params)
                with self._lock:
                    self._learner_steps += 1
                if time.monotonic() - last_log > self._config.log_every_s:
                    # Pulling metrics syncs with the device: only once per log interval.
                    self._metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
                    last_log = time.monotonic()
        finally:
            self._inference.join(timeout=5.0)

    def _stop_reason(self) -> str | None:
        with self._lock:
            if self._env_steps >= self._config.total_env_steps:
                return "budget"
            target = self._config.stop_at_return
            full = len(self._returns) == self._config.return_window
            if target is not None and full and np.mean(self._returns) >= target:
                return "return_target"
        return None

    def _put_unroll(self, chunk: dict[str, np.ndarray]) -> None:
        # Blocks while the learner is behind (bounded policy lag), but never past a stop.
        while not self._stop.is_set():
            if self._unrolls.put(chunk, timeout_s=0.1):
                return

    def _next_batch(self) -> dict[str, np.ndarray] | None:
        batch = self._batcher.pop()
        while batch is None:
            chunk = self._unrolls.get(timeout_s=0.05)
            if chunk is None:
                return None
            self._batcher.add(chunk)
            batch = self._batcher.pop()
        return batch


def max_unrolls(queue_spec: QueueSpec, config: ExperimentConfig) -> int:
    """Bound of the unroll queue, in per-worker unrolls [T + 1, K]: `max_batches` batches."""
    chunks_per_batch = math.ceil(queue_spec.batch_size / config.envs_per_actor)
    return queue_spec.max_batches * chunks_per_batch


class _Rate:
    """Env steps per second over the interval since the previous call."""

    def __init__(self):
        self._last = (time.monotonic(), 0)
        self._value = 0.0

    def update(self, steps: int) -> float:
        now = time.monotonic()
        t0, s0 = self._last
        if now - t0 >= 0.5:
            self._value = (steps - s0) / (now - t0)
            self._last = (now, steps)
        return self._value
