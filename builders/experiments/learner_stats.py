"""What the learner node reports (its `stats()` RPC): the counter's counts and return window,
the env step rate, how inference batches, the learner's queue, when the first env step and
the first update came, the policy lag, the latest learner metrics and the latest evaluation.

The learner's metrics live on the device, and pulling them waits for the update: `LearnerStats`
pulls them once per log interval (`due`), not per update.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np

from trellis.builders.experiments.counter import Counter, CounterSnapshot, StepRate
from trellis.builders.experiments.inference import InferenceServer


def inference_batch_mean(served: tuple[int, int], before: tuple[int, int]) -> dict[str, float]:
    """{inference_batch_mean: env steps per policy call} between two of inference's (steps,
    batches) counts; {} if it made no call. How well the serving thread batches: from one
    worker's envs (every call one request) to every env (every worker in each call)."""
    steps, calls = served[0] - before[0], served[1] - before[1]
    return {"inference_batch_mean": steps / calls} if calls else {}


class PolicyLag:
    """Policy lag of the batches learned from since the last `take`: for each step, the
    learner updates between the params that acted there and the update that learns from it
    (0: learned from at once, as on-policy)."""

    def __init__(self) -> None:
        self._sum, self._count, self._max = 0, 0, 0

    def add(self, versions: np.ndarray, learner_steps: int) -> None:
        """Adds a batch's `versions` [T + 1, B], learned from by the update after
        `learner_steps` updates."""
        lag = learner_steps - versions
        self._sum += int(lag.sum())
        self._count += lag.size
        self._max = max(self._max, int(lag.max()))

    def take(self) -> dict[str, float]:
        """{policy_lag_mean, policy_lag_max} since the last call; {} if nothing was added."""
        if not self._count:
            return {}
        lag = {"policy_lag_mean": self._sum / self._count, "policy_lag_max": float(self._max)}
        self._sum, self._count, self._max = 0, 0, 0
        return lag


class StartupTimes:
    """When a session's first env step and first learner update were seen, and when the policy
    was compiled for every batch size, as `time.time()` (comparable across the processes of one
    host, e.g. with the launcher's start).

    Args:
      start: the counter when the session starts (a resumed run's counts are not zero).
    """

    def __init__(self, start: CounterSnapshot):
        self._start = start
        self.first_env_step: float | None = None
        self.first_learner_step: float | None = None
        self.policy_compiled: float | None = None

    def observe(self, snapshot: CounterSnapshot, policy_compiled: bool) -> None:
        """Notes the time of the first change of each count since `start`, and the first time
        `policy_compiled` is True."""
        now = time.time()
        if self.policy_compiled is None and policy_compiled:
            self.policy_compiled = now
        if self.first_env_step is None and snapshot.env_steps > self._start.env_steps:
            self.first_env_step = now
        if (self.first_learner_step is None
                and snapshot.learner_steps > self._start.learner_steps):
            self.first_learner_step = now


class Interval:
    """A timer: `due()` is True at most once per `period_s` seconds, counted from the last True.

    Args:
      period_s: the period.
      due_now: whether the first `due()` is True at once (else after `period_s`).
    """

    def __init__(self, period_s: float, due_now: bool = False):
        self._period_s = period_s
        self._last = -math.inf if due_now else time.monotonic()

    def restart(self) -> None:
        """Counts the period from now."""
        self._last = time.monotonic()

    def due(self) -> bool:
        if time.monotonic() - self._last < self._period_s:
            return False
        self.restart()
        return True


class LearnerStats:
    """The learner node's report, kept up to date by its learner loop.

    Args:
      counter: the run's counter, restored where the run resumes (the step rate and the
        startup times count from its counts now).
      inference: the inference server (its `steps`, `batches` and `slot_resets`).
      queue_size: the learner's input's size (`UnrollFeed.size`, `ReplayFeed.size`).
      compiled_at: when the learner's update was last compiled for a batch size
        (`CompileAhead.compiled_at`; None before the first).
      log_every_s: how often the learner's metrics are pulled from the device (`due`).
    """

    def __init__(self, counter: Counter, inference: InferenceServer,
                 queue_size: Callable[[], int], compiled_at: Callable[[], float | None],
                 log_every_s: float):
        self._inference = inference
        self._queue_size = queue_size
        self._compiled_at = compiled_at
        self._rate = StepRate(counter.env_steps())
        self._startup = StartupTimes(counter.snapshot())
        # Pulling metrics syncs with the device: only once per log interval.
        self._log_timer = Interval(log_every_s, due_now=True)
        self._lag = PolicyLag()
        self._served = (0, 0)  # Inference's (steps, batches) at the last log.
        self._metrics: dict[str, float] = {}
        self._evaluation: dict[str, Any] | None = None

    def observe(self, snapshot: CounterSnapshot) -> None:
        """Notes the counter's `snapshot` (the times of the first env step and update) and
        whether the policy is compiled for every batch size yet."""
        self._startup.observe(snapshot, self._inference.compiled_all)

    def add_lag(self, versions: np.ndarray | None, learner_steps: int) -> None:
        """Adds a batch's policy versions [T + 1, B] (None: a sampled batch, which has none),
        learned from by the update after `learner_steps` updates."""
        if versions is not None:
            self._lag.add(versions, learner_steps)

    def due(self) -> bool:
        """Whether the learner's metrics are to be pulled now (`log`)."""
        return self._log_timer.due()

    def log(self, metrics: Mapping[str, Any], schedule: Mapping[str, float]) -> None:
        """Keeps an update's `metrics` (pulled from the device here) with the policy lag and
        inference's batching since the last call, and the `schedule`'s metrics."""
        served = (self._inference.steps, self._inference.batches)
        self._metrics = {**{k: float(v) for k, v in jax.device_get(metrics).items()},
                         **self._lag.take(), **inference_batch_mean(served, self._served),
                         **schedule}
        self._served = served

    def record_evaluation(self, result: Mapping[str, Any]) -> None:
        """Keeps an evaluator's latest result; `report` gives it."""
        # Rebinding one attribute is atomic: `report` sees the old result or the new one.
        self._evaluation = dict(result)

    def report(self, take_snapshot: Callable[[], CounterSnapshot]) -> dict[str, Any]:
        """Counters and return statistics of the snapshot `take_snapshot` takes, the rates,
        the latest learner metrics and evaluation (see `LearnerNode.stats`).

        The metrics are read before the snapshot is taken: the learner thread may log an
        update between the two, and its learning-rate factor, set from the env steps when
        it began, could then come from more env steps than the record's.
        """
        metrics = self._metrics
        stats = take_snapshot().stats()
        stats.update(
            evaluation=self._evaluation,
            env_steps_per_s=self._rate.update(stats["env_steps"]),
            inference_batches=self._inference.batches,
            slot_resets=self._inference.slot_resets,
            queue_size=self._queue_size(),
            # A dict: metrics records and TensorBoard leave it out.
            startup={"first_env_step": self._startup.first_env_step,
                     "first_learner_step": self._startup.first_learner_step,
                     "policy_compiled": self._startup.policy_compiled,
                     "learner_compiled": self._compiled_at()},
            **metrics,
        )
        return stats
