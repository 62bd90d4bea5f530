"""The learner node: learner and inference server in one process, sharing the params."""

from __future__ import annotations

import collections
import math
import threading
import time
from typing import Any

import jax
import numpy as np

from trellis import launch
from trellis.builders.base import Builder, QueueSpec
from trellis.builders.checkpointing import Checkpointer, Checkpoints
from trellis.builders.config import ExperimentConfig
from trellis.builders.inference import InferenceServer, step_specs
from trellis.builders.unroll_queue import LocalUnrollQueue, TableUnrollQueue
from trellis.envs.factory import EnvFactory
from trellis.reverb_tables import ReplayClient


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

    RPCs: `step(...)` for env workers (see EnvWorker), `stats()` for progress displays,
    `env_steps()`, `get_params()` and `record_evaluation(...)` for the evaluator.
    The program stops (via `launch.request_stop`) when the env-step budget or the return
    target is reached; `info` carries the final stats.

    With `checkpoints`, the learner state and the counters are checkpointed every
    `config.checkpoint_every_s` seconds and when the node stops; with its `resume_step`,
    both are restored from that checkpoint first, so counters and returns continue.

    Args:
      builder, env_factory, config: the agent, its envs and the experiment settings.
      replay: with `config.unroll_queue == "replay"`, the replay node holding the unroll
        table (`builders.unroll_queue.unroll_table_spec`); unrolls go through it.
      checkpoints: where to checkpoint and what to resume from; None: no checkpoints.
    """

    def __init__(self, builder: Builder, env_factory: EnvFactory, config: ExperimentConfig,
                 replay: Any = None, checkpoints: Checkpoints | None = None):
        self._config = config
        spec = env_factory.spec()
        learner_key, inference_key = jax.random.split(jax.random.PRNGKey(config.seed))
        networks = builder.make_networks(spec)
        self._learner = builder.make_learner(networks, spec, learner_key)
        self._checkpointer = None
        progress: dict[str, Any] = {}
        if checkpoints is not None:
            self._checkpointer = Checkpointer(checkpoints.directory, config.keep_checkpoints)
            if checkpoints.resume_step is not None:
                state, progress = self._checkpointer.restore(
                    self._learner.state, checkpoints.resume_step)
                self._learner.restore(state)
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
        self._returns: collections.deque[float] = collections.deque(maxlen=config.return_window)
        self._lengths: collections.deque[int] = collections.deque(maxlen=config.return_window)
        self._metrics: dict[str, float] = {}
        self._start = time.monotonic()
        # Counters carried over from the checkpoint (all zero on a fresh run).
        self._env_steps = int(progress.get("env_steps", 0))
        self._learner_steps = int(progress.get("learner_steps", 0))
        self._episodes = int(progress.get("episodes", 0))
        self._returns.extend(progress.get("returns", []))
        self._lengths.extend(progress.get("lengths", []))
        self._elapsed_before = float(progress.get("elapsed_s", 0.0))
        self._resumes = int(progress.get("resumes", -1)) + 1 if progress else 0
        self._rate = _Rate(self._env_steps)
        self._evaluation: dict[str, Any] | None = None
        self._last_checkpoint = time.monotonic()

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
        """Counters, return statistics over the window, the latest learner metrics.

        `elapsed_s` is training time summed over the run's sessions (resumes included);
        `evaluation` is the latest result of `record_evaluation`, or None.
        """
        with self._lock:
            returns = list(self._returns)
            lengths = list(self._lengths)
            stats = {
                "env_steps": self._env_steps,
                "learner_steps": self._learner_steps,
                "episodes": self._episodes,
                "mean_return": float(np.mean(returns)) if returns else None,
                "min_return": float(np.min(returns)) if returns else None,
                "max_return": float(np.max(returns)) if returns else None,
                "returns_in_window": len(returns),
                "mean_episode_length": float(np.mean(lengths)) if lengths else None,
                "evaluation": self._evaluation,
            }
        stats.update(
            elapsed_s=self._elapsed(),
            resumes=self._resumes,
            env_steps_per_s=self._rate.update(stats["env_steps"]),
            inference_batches=self._inference.batches,
            slot_resets=self._inference.slot_resets,
            queue_size=self._unrolls.size(),
            **self._metrics,
        )
        return stats

    def env_steps(self) -> int:
        with self._lock:
            return self._env_steps

    def get_params(self) -> Any:
        """The current params as host (numpy) arrays, e.g. for an evaluator in another process."""
        return jax.device_get(self._learner.params)

    def record_evaluation(self, result: dict[str, Any]) -> None:
        """Keeps an evaluator's latest result; `stats()` reports it."""
        with self._lock:
            self._evaluation = dict(result)

    # --- Learner loop -----------------------------------------------------------------

    def run(self) -> None:
        self._start = time.monotonic()
        self._last_checkpoint = self._start
        self._inference.start()
        last_log = 0.0
        metrics = None
        try:
            while not self._stop.is_set():
                reason = self._stop_reason()
                if reason:
                    self._save_checkpoint()  # Before the stop request: its info matches it.
                    launch.request_stop(reason, info=self.stats())
                    return
                if (self._checkpointer is not None and time.monotonic() - self._last_checkpoint
                        >= self._config.checkpoint_every_s):
                    self._save_checkpoint()
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
            self._save_checkpoint()  # Stopped from outside (Ctrl-C, another node's stop).
        finally:
            self._inference.join(timeout=5.0)
            if self._checkpointer is not None:
                self._checkpointer.close()

    def _elapsed(self) -> float:
        return self._elapsed_before + time.monotonic() - self._start

    def _save_checkpoint(self) -> None:
        """Checkpoints the learner state with the counters that go with it (host side only)."""
        if self._checkpointer is None:
            return
        # The learner state only changes on this thread, so it matches the counters taken here.
        state = self._learner.state
        with self._lock:
            progress = {
                "env_steps": self._env_steps,
                "learner_steps": self._learner_steps,
                "episodes": self._episodes,
                "returns": [float(r) for r in self._returns],
                "lengths": [int(n) for n in self._lengths],
                "elapsed_s": self._elapsed(),
                "resumes": self._resumes,
            }
        self._checkpointer.save(progress["env_steps"], state, progress)
        self._last_checkpoint = time.monotonic()

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

    def __init__(self, steps: int = 0):
        self._last = (time.monotonic(), steps)
        self._value = 0.0

    def update(self, steps: int) -> float:
        now = time.monotonic()
        t0, s0 = self._last
        if now - t0 >= 0.5:
            self._value = (steps - s0) / (now - t0)
            self._last = (now, steps)
        return self._value
