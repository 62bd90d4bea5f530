"""The learner node: the learner and the inference server in one process, sharing the params.

SEED RL's learner is the model: env workers send observations to this node's inference server
(`builders.inference`), which batches them on the accelerator and turns what it saw into
unrolls; the learner loop here takes them in batches, updates, and hands the new params back
to inference in the same process, with no copy through the network.

The node is wiring; each concern is its own piece: counting (`builders.counter`), stopping
(`builders.stop`), the unroll queue (`builders.unroll_queue`), checkpoints
(`builders.checkpointing`). Its loop only moves batches and params.
"""

from __future__ import annotations

import collections
import math
import threading
import time
from typing import Any

import jax
import numpy as np

from trellis.builders.contract.agent import (
    REPLAY_KEY,
    REPLAY_PROBABILITY,
    REPLAY_TABLE_SIZE,
    Builder,
    QueueSpec,
)
from trellis.builders.contract.config import ExperimentConfig
from trellis.builders.experiments.checkpointing import Checkpointer, Checkpoints
from trellis.builders.experiments.counter import Counter, CounterSnapshot, StepRate
from trellis.builders.experiments.env_worker import shm_layout
from trellis.builders.experiments.inference import InferenceServer, step_specs
from trellis.builders.experiments.stop import StopRule
from trellis.builders.experiments.unroll_queue import (
    LocalUnrollQueue,
    TableUnrollQueue,
    unroll_signature,
)
from trellis.envs.factory import EnvFactory
from trellis.envs.specs import EnvSpec
from trellis.launch import runtime
from trellis.launch.runtime.node_context import StopEvent
from trellis.reverb_tables import RateLimiterTimeout, ReplayClient, StreamingWriter, TableSpec

UnrollQueue = LocalUnrollQueue | TableUnrollQueue


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


class UnrollFeed:
    """Unrolls from inference to the learner: a bounded queue, then batches of `batch_size`.

    Args:
      unrolls: the queue (`builders.unroll_queue`: in-process, or a replay node's table).
      batch_size: columns (envs) per batch.
      stop: the program's stop event; a blocked `put` gives up once it is set.
    """

    def __init__(self, unrolls: UnrollQueue, batch_size: int, stop: StopEvent):
        self._unrolls = unrolls
        self._batcher = UnrollBatcher(batch_size)
        self._stop = stop

    def put(self, chunk: dict[str, np.ndarray]) -> None:
        """Queues one unroll [T + 1, K, ...]; blocks while the queue is full, until a stop."""
        # Blocking while the learner is behind bounds policy lag; the stop ends the wait.
        while not self._stop.is_set():
            if self._unrolls.put(chunk, timeout_s=0.1):
                return

    def next_batch(self) -> dict[str, np.ndarray] | None:
        """The next batch [T + 1, B, ...], or None if the queue ran dry before one was full."""
        batch = self._batcher.pop()
        while batch is None:
            chunk = self._unrolls.get(timeout_s=0.05)
            if chunk is None:
                return None
            self._batcher.add(chunk)
            batch = self._batcher.pop()
        return batch

    def size(self) -> int:
        """Unrolls waiting in the queue (not counting those already in the batcher)."""
        return self._unrolls.size()

    def close(self) -> None:
        """Nothing to wait for: each `put` returns once its unroll is in the queue."""


class ReplayFeed:
    """Unrolls into the builder's replay table (`Builder.replay_table`) on the replay node;
    batches sampled from it.

    Each worker's unroll [T + 1, K, ...] becomes K items, one per env slot, at priority 1
    until the learner writes its real one back. Items are streamed (`StreamingWriter`): many
    per round trip, confirmed in the background, in order. The table's rate limiter paces
    both sides: inference waits while sampling lags behind `samples_per_insert`, the learner
    while inserts do.

    An insert the rate limiter holds back longer than `insert_timeout_s` fails, and the
    writer drops what queued behind it; the feed then sends again exactly what did not go in,
    in the same order, counting the table's inserts to find where the stream broke. That
    count is exact because this feed is the table's only writer and nothing is in flight once
    the writer reports the failure.

    Args:
      replay: a client of the replay node.
      table: the table's name.
      batch_size: items per batch.
      stop: the program's stop event; a blocked `put` gives up once it is set.
      max_in_flight: inserts queued or being sent at most (back-pressure beyond).
      insert_timeout_s: how long one insert may wait at the rate limiter before the stream
        is resent from it; it also bounds how long a stop waits for a held-back insert.
    """

    def __init__(self, replay: ReplayClient, table: str, batch_size: int, stop: StopEvent,
                 max_in_flight: int = 256, insert_timeout_s: float = 0.25):
        self._replay, self._table = replay, table
        self._batch_size = batch_size
        self._stop = stop
        self._insert_timeout_s = insert_timeout_s
        self._inserts_before = self._num_inserts()
        self._sent = 0  # Items the writer took, minus those it reported dropped.
        # Every item the writer may still drop: at most `max_in_flight` are in flight.
        self._recent: collections.deque[dict[str, np.ndarray]] = collections.deque(
            maxlen=max_in_flight)
        self._writer = StreamingWriter(replay, max_in_flight)

    def put(self, chunk: dict[str, np.ndarray]) -> None:
        """Streams one item per env slot of `chunk` [T + 1, K, ...]; blocks while the rate
        limiter holds inserts back, until a stop. A stop loses only what the rate limiter
        holds back: an unroll recorded as the program stops still goes in."""
        pending = collections.deque(
            {name: v[:, k] for name, v in chunk.items()}
            for k in range(next(iter(chunk.values())).shape[1]))
        while pending:
            try:
                self._writer.insert(pending[0], {self._table: 1.0},
                                    timeout_s=self._insert_timeout_s)
            except RateLimiterTimeout:
                if self._stop.is_set():
                    return  # Stopping: what the rate limiter holds back is given up.
                # Raised before this item was queued: it goes after the dropped ones.
                pending.extendleft(reversed(self._take_dropped()))
                continue
            self._recent.append(pending.popleft())
            self._sent += 1

    def _take_dropped(self) -> list[dict[str, np.ndarray]]:
        """The items the writer dropped after a failed insert, oldest first."""
        inserted = self._num_inserts() - self._inserts_before
        dropped = [self._recent.pop() for _ in range(self._sent - inserted)]
        self._sent = inserted
        return dropped[::-1]

    def _num_inserts(self) -> int:
        return int(self._replay.info(self._table)["num_inserts"])

    def close(self) -> None:
        """Waits until the table has every item sent (those a stop cut short aside)."""
        try:
            self._writer.close()
        except RateLimiterTimeout:
            if not self._stop.is_set():
                raise
            # Stopping: what the rate limiter still held back is given up, as `put` does.

    def next_batch(self) -> dict[str, np.ndarray] | None:
        """B sampled items, time-major [T + 1, B, ...] (state fields [1, B, ...]), with their
        keys `REPLAY_KEY` [B] and sampling `REPLAY_PROBABILITY`, `REPLAY_TABLE_SIZE` [1, B];
        None if the rate limiter admitted no full batch within a short wait."""
        try:
            sample = self._replay.sample(self._table, self._batch_size, timeout_s=0.25)
        except RateLimiterTimeout:
            return None  # Items taken before the deadline stay in the table.
        batch = {name: np.swapaxes(v, 0, 1) for name, v in sample.data.items()}
        batch[REPLAY_KEY] = sample.keys
        batch[REPLAY_PROBABILITY] = sample.probabilities.astype(np.float32)[None]
        batch[REPLAY_TABLE_SIZE] = sample.table_size.astype(np.float32)[None]
        return batch

    def size(self) -> int:
        """Items in the table."""
        return int(self._replay.info(self._table)["size"])


class NonFiniteLossError(RuntimeError):
    """A learner update gave NaN or Inf metrics; the run stops without checkpointing it."""


class FiniteCheck:
    """Checks each learner update's metrics for NaN and Inf, one update late.

    Reading an update's metrics waits for it on the device; reading the previous one's while
    the newest runs keeps the learner loop from stalling on every step.
    """

    def __init__(self):
        self._pending: tuple[Any, int] | None = None

    def add(self, metrics: dict[str, Any], learner_step: int) -> None:
        """Checks the update added before, then keeps this one (`learner_step`) for later.

        Raises:
          NonFiniteLossError: the update added before gave a NaN or Inf metric.
        """
        self.check()
        self._pending = (metrics, learner_step)

    def check(self) -> None:
        """Checks the update added last, if not checked yet.

        Raises:
          NonFiniteLossError: its metrics hold a NaN or an Inf; the message names the step.
        """
        if self._pending is None:
            return
        metrics, step = self._pending
        self._pending = None
        bad = {name: value for name, value in jax.device_get(metrics).items()
               if not np.all(np.isfinite(value))}
        if bad:
            values = ", ".join(f"{name}={np.asarray(value).tolist()}"
                               for name, value in sorted(bad.items()))
            raise NonFiniteLossError(
                f"learner step {step} gave non-finite metrics ({values}); stopped without "
                f"checkpointing it, the last good checkpoint is kept (a lower --learning_rate "
                f"may help)")


class StartupTimes:
    """When a session's first env step and first learner update were seen, as `time.time()`
    (comparable across the processes of one host, e.g. with the launcher's start).

    Args:
      start: the counter when the session starts (a resumed run's counts are not zero).
    """

    def __init__(self, start: CounterSnapshot):
        self._start = start
        self.first_env_step: float | None = None
        self.first_learner_step: float | None = None

    def observe(self, snapshot: CounterSnapshot) -> None:
        """Notes the time of the first change of each count since `start`."""
        now = time.time()
        if self.first_env_step is None and snapshot.env_steps > self._start.env_steps:
            self.first_env_step = now
        if (self.first_learner_step is None
                and snapshot.learner_steps > self._start.learner_steps):
            self.first_learner_step = now


class LearnerNode:
    """Service node: central inference for the env workers, and the learner loop in `run()`.

    RPCs: `step(...)` and `shm_address()` for env workers (see EnvWorker), `stats()` for
    progress displays, `env_steps()`, `get_params()` and `record_evaluation(...)` for the
    evaluator.

    The node wires four pieces: the inference server (fed by `step`), the counter
    (`counter`, fed by `step` and the learner loop), the stop rule (`stop`, from the session)
    and the learner loop, which only moves batches and params (next batch -> learner update
    -> params to inference), asking the stop rule between updates and checkpointing when
    the session asks (the `checkpoint` RPC).
    When the rule gives a reason the program stops (`runtime.request_stop`) with the final
    stats as `info`.

    With `checkpoints`, the learner state and the counter are checkpointed on each
    `checkpoint()` and when the node stops; with its `resume_step`,
    both are restored from that checkpoint first, so counters and returns continue.

    Args:
      builder, env_factory, config: the agent, its envs and the experiment settings.
      replay: the replay node, where `make_program` added one: it holds the builder's own
        table (`agent_table`), which then feeds the learner, or else, with
        `config.unroll_queue == "replay"`, the unroll table
        (`builders.unroll_queue.unroll_table_spec`) through which unrolls go.
      checkpoints: where to checkpoint and what to resume from; None: no checkpoints.
    """

    def __init__(self, builder: Builder, env_factory: EnvFactory, config: ExperimentConfig,
                 replay: Any = None, checkpoints: Checkpoints | None = None,
                 stop_rule: StopRule | None = None):
        self._config = config
        spec = env_factory.spec()
        learner_key, inference_key = jax.random.split(jax.random.PRNGKey(config.seed))
        networks = builder.make_networks(spec)
        table = agent_table(builder, spec)
        client = None if replay is None else ReplayClient(replay)
        self._learner = builder.make_learner(networks, spec, learner_key,
                                             replay=None if table is None else client)
        self._checkpointer = None
        progress = None
        if checkpoints is not None:
            self._checkpointer = Checkpointer(checkpoints.directory, config.keep_checkpoints)
            if checkpoints.resume_step is not None:
                state, progress = self._checkpointer.restore(
                    self._learner.state, checkpoints.resume_step)
                self._learner.restore(state)
        self._counter = (Counter(config.return_window) if progress is None
                         else Counter.restore(progress, config.return_window))
        self._stop_rule = stop_rule or StopRule.of(config)
        # Set by the `checkpoint` RPC (the session's timer), honoured between updates.
        self._checkpoint_due = threading.Event()
        # Pulling metrics syncs with the device: only once per log interval.
        self._log_timer = _Interval(config.log_every_s, due_now=True)
        self._rate = StepRate(self._counter.env_steps())
        queue_spec = builder.queue_spec()
        self._stop = runtime.stop_event()
        self._feed: UnrollFeed | ReplayFeed = (
            UnrollFeed(_unroll_queue(queue_spec, config, client), queue_spec.batch_size,
                       self._stop) if table is None
            else ReplayFeed(client, table.name, queue_spec.batch_size, self._stop))
        initial_state = builder.initial_state(spec, config.num_actors * config.envs_per_actor)
        self._inference = InferenceServer(
            policy=builder.make_policy(networks),
            params=self._learner.params,
            key=inference_key,
            specs=step_specs(spec, builder.extras_spec(spec), initial_state),
            num_workers=config.num_actors,
            envs_per_worker=config.envs_per_actor,
            unroll_length=queue_spec.unroll_length,
            on_unroll=self._feed.put,
            stop=self._stop,
            timeout_s=config.inference_timeout_ms / 1000.0,
            initial_state=initial_state,
            overlap=queue_spec.overlap,
            on_steps=self._counter.add_env_steps,
            shared_memory=(shm_layout(spec, config.envs_per_actor)
                           if config.transport == "shm" else None),
        )
        self._finite = FiniteCheck()
        self._startup = StartupTimes(self._counter.snapshot())
        self._metrics: dict[str, float] = {}
        self._evaluation: dict[str, Any] | None = None

    # --- RPCs -------------------------------------------------------------------------

    def step(self, worker_id, run_id, obs, reward, terminated, truncated, first, episodes):
        """One env-worker step: counts it and its finished episodes, returns the actions.

        Args:
          worker_id, run_id, obs, reward, terminated, truncated, first: as for
            `InferenceServer.step`.
          episodes: (return, length) of each episode that finished in this step.

        Returns:
          The actions for the worker's envs, or None when the program is stopping.
        """
        return self._inference.step(
            worker_id, run_id, obs, reward, terminated, truncated, first, episodes)

    def shm_address(self) -> str | None:
        """Where env workers on this host connect their shared-memory slots (None: use `step`)."""
        return self._inference.shm_address()

    def stats(self) -> dict[str, Any]:
        """Counters, return statistics over the window, the latest learner metrics.

        `elapsed_s` is training time summed over the run's sessions (resumes included);
        `evaluation` is the latest result of `record_evaluation`, or None.
        """
        return self._stats(self._counter.snapshot())

    def _stats(self, snapshot: CounterSnapshot) -> dict[str, Any]:
        stats = snapshot.stats()
        stats.update(
            evaluation=self._evaluation,
            env_steps_per_s=self._rate.update(stats["env_steps"]),
            inference_batches=self._inference.batches,
            slot_resets=self._inference.slot_resets,
            queue_size=self._feed.size(),
            # A dict: metrics records and TensorBoard leave it out.
            startup={"first_env_step": self._startup.first_env_step,
                     "first_learner_step": self._startup.first_learner_step},
            **self._metrics,
        )
        return stats

    def env_steps(self) -> int:
        """Env steps counted so far, over all sessions of the run."""
        return self._counter.env_steps()

    def get_params(self) -> Any:
        """The current params as host (numpy) arrays, e.g. for an evaluator in another process."""
        return jax.device_get(self._learner.params)

    def checkpoint(self) -> None:
        """Checkpoints before the next update (the learner thread owns the state)."""
        self._checkpoint_due.set()

    def record_evaluation(self, result: dict[str, Any]) -> None:
        """Keeps an evaluator's latest result; `stats()` reports it."""
        # Rebinding one attribute is atomic: `stats()` sees the old result or the new one.
        self._evaluation = dict(result)

    # --- Learner loop -----------------------------------------------------------------

    def run(self) -> None:
        """Trains until the stop rule or the program says stop; checkpoints at the end."""
        self._counter.start_session()
        self._inference.start()
        try:
            reason = self._train()
            # Also when stopped from outside (Ctrl-C, another node's stop). One snapshot for
            # both, so the run's final stats are the counts of its last checkpoint.
            final = self._counter.snapshot()
            self._save_checkpoint(final)
            if reason is not None:
                runtime.request_stop(reason, info=self._stats(final))
        finally:
            self._inference.join(timeout=5.0)
            self._feed.close()
            if self._checkpointer is not None:
                self._checkpointer.close()

    def _train(self) -> str | None:
        """Learner updates until the stop rule gives its reason, or None if stopped outside."""
        while not self._stop.is_set():
            snapshot = self._counter.snapshot()
            self._startup.observe(snapshot)  # Within one loop pass (<= 50 ms when idle).
            reason = self._stop_rule(snapshot)
            if reason is not None:
                return reason
            if self._checkpoint_due.is_set():
                self._checkpoint_due.clear()
                self._save_checkpoint(self._counter.snapshot())
            batch = self._feed.next_batch()
            if batch is None or not self._config.learn:
                continue
            metrics = self._learner.step(batch)
            self._inference.set_params(self._learner.params)
            self._counter.add_learner_step()
            # Learner steps change only on this thread: this update is the snapshot's next.
            self._finite.add(metrics, snapshot.learner_steps + 1)
            if self._log_timer.due():
                self._metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
        return None

    def _save_checkpoint(self, snapshot: CounterSnapshot) -> None:
        """Checkpoints the learner state with the counter's `snapshot` (host side only).

        Call on the learner thread: the state and the learner-step count only change there,
        so a snapshot taken on it matches the state.
        """
        self._finite.check()  # A state that went NaN must not replace the last good one.
        if self._checkpointer is None:
            return
        state = self._learner.state
        progress = snapshot.progress()
        self._checkpointer.save(progress["env_steps"], state, progress)


def max_unrolls(queue_spec: QueueSpec, config: ExperimentConfig) -> int:
    """Bound of the unroll queue, in per-worker unrolls [T + 1, K]: `max_batches` batches."""
    chunks_per_batch = math.ceil(queue_spec.batch_size / config.envs_per_actor)
    return queue_spec.max_batches * chunks_per_batch


def agent_table(builder: Builder, spec: EnvSpec) -> TableSpec | None:
    """The builder's own replay table (`Builder.replay_table`), for items that are one env
    slot's unroll {field: [T + 1, ...]}; None for most agents."""
    steps = step_specs(spec, builder.extras_spec(spec), builder.initial_state(spec, 1))
    return builder.replay_table(unroll_signature(steps, builder.queue_spec().unroll_length))


def _unroll_queue(queue_spec: QueueSpec, config: ExperimentConfig,
                  replay: ReplayClient | None) -> UnrollQueue:
    """The queue from inference to learner: in-process, or the replay node's table."""
    if config.unroll_queue == "local":
        return LocalUnrollQueue(max_unrolls(queue_spec, config))
    return TableUnrollQueue(replay)


class _Interval:
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
