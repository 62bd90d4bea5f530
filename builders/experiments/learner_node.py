"""The learner node: the learner and the inference server in one process, sharing the params.

SEED RL's learner is the model: env workers send observations to this node's inference server
(`inference`), which batches them on the accelerator and turns what it saw into
unrolls; the learner loop here takes them in batches, updates, and hands the new params back
to inference in the same process, with no copy through the network.

The node is wiring; each concern is its own piece: counting (`counter`), stopping
(`stop`), the learner's input (`feeds`: unrolls in order, or batches sampled from the
agent's replay table), checkpoints (`checkpointing`). Its loop only moves batches and params.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from trellis.builders.contract.agent import Builder, init_device
from trellis.builders.contract.config import ExperimentConfig
from trellis.builders.experiments.checkpointing import Checkpointer, Checkpoints
from trellis.builders.experiments.counter import Counter, CounterSnapshot, StepRate
from trellis.builders.experiments.env_worker import shm_layout, step_format
from trellis.builders.experiments.feeds import (
    Prefetch,
    ReplayFeed,
    UnrollFeed,
    agent_table,
    batch_sizes,
    max_unrolls,
    unroll_queue,
)
from trellis.builders.experiments.inference import InferenceServer, agent_step_specs, step_specs
from trellis.builders.experiments.schedule import LearningRateSchedule
from trellis.builders.experiments.stop import StopRule
from trellis.builders.experiments.unroll_queue import unroll_signature
from trellis.envs.contract import EnvFactory
from trellis.launch import runtime
from trellis.reverb_tables import ReplayClient


class NonFiniteLossError(RuntimeError):
    """A learner update gave NaN or Inf metrics; the run stops without checkpointing it."""


class DeviceMemoryError(RuntimeError):
    """A learner update ran out of accelerator memory; the message names what shrinks it."""


def out_of_memory_message(error: Exception, unrolls: int | None, config: ExperimentConfig,
                          batch_size: int) -> str | None:
    """What to tell the user when `error`, raised by an update on `unrolls` unrolls (None:
    sampled from replay), is XLA's out-of-memory (RESOURCE_EXHAUSTED); None otherwise.

    XLA's own line names an allocation, not the setting that made the update that large.
    """
    lines = str(error).strip().splitlines()
    if not lines or "RESOURCE_EXHAUSTED" not in lines[0]:
        return None
    if unrolls is None:
        cure = "lower the agent's batch size or network"
    elif config.learner_batch == "auto" and unrolls > batch_size:
        cure = (f"--learner_batch=auto grew it to {unrolls} unrolls; --learner_batch=fixed "
                f"keeps it at --batch_size={batch_size}")
    else:
        cure = "lower --batch_size or --unroll_length"
    where = "" if unrolls is None else f" on a batch of {unrolls} unrolls"
    return f"the learner's update{where} ran out of device memory ({lines[0]}): {cure}"


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

    def __init__(self):
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
        # On the host's CPU, as the state's init (`init_device`); uncommitted, so the learner
        # and the policy still take them onto their devices.
        with jax.default_device(init_device(jax.local_devices())):
            learner_key, inference_key = jax.random.split(jax.random.PRNGKey(config.seed))
        networks = builder.make_networks(spec)
        table = agent_table(builder, spec)
        client = None if replay is None else ReplayClient(replay)
        self._learner = builder.make_learner(networks, spec, learner_key,
                                             replay=None if table is None else client)
        queue_spec = builder.queue_spec()
        self._batch_size = queue_spec.batch_size
        self._format = step_format(spec)
        self._stop = runtime.stop_event()
        sizes = batch_sizes(queue_spec, config)
        unrolls = (None if table is not None else UnrollFeed(
            unroll_queue(queue_spec, config, client), sizes, self._stop,
            {size: max_unrolls(queue_spec, config, size) for size in sizes}))
        self._feed: UnrollFeed | ReplayFeed = unrolls if unrolls is not None else ReplayFeed(
            client, table.name, queue_spec.batch_size, self._stop)
        # Beside the state's init and the policy's first compile (see `_Compiling`).
        policy_compiled = threading.Event()
        batches = ({size: _abstract_batch(builder, spec, queue_spec, size) for size in sizes}
                   if unrolls is not None else
                   {self._batch_size: ReplayFeed.batch_shapes(
                       _abstract_batch(builder, spec, queue_spec, self._batch_size))})
        self._compiled = _Compiling(
            self._learner, {size: self._format.nest(batch) for size, batch in batches.items()},
            after_first=policy_compiled, stop=self._stop,
            on_compiled=(lambda size: None) if unrolls is None else unrolls.allow)
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
        initial_state = builder.initial_state(spec, config.num_actors * config.envs_per_actor)
        self._inference = InferenceServer(
            policy=builder.make_policy(networks),
            params=self._learner.params,
            key=inference_key,
            specs=step_specs(spec, builder.extras_spec(spec), initial_state),
            num_workers=config.env_groups,
            envs_per_worker=config.envs_per_group,
            unroll_length=queue_spec.unroll_length,
            on_unroll=self._feed.put,
            stop=self._stop,
            timeout_s=config.inference_timeout_ms / 1000.0,
            initial_state=initial_state,
            overlap=queue_spec.overlap,
            on_steps=self._counter.add_env_steps,
            shared_memory=(shm_layout(spec, config.envs_per_group)
                           if config.transport == "shm" else None),
            step_format=self._format,
            compiled=policy_compiled,
        )
        self._inference.set_params(self._learner.params, self._counter.snapshot().learner_steps)
        self._prefetch = Prefetch(
            self._feed, lambda batch: self._learner.place(self._format.nest(batch)), self._stop)
        self._lag = PolicyLag()
        self._served = (0, 0)  # Inference's (steps, batches) at the last log.
        self._finite = FiniteCheck()
        self._schedule = LearningRateSchedule.of(
            builder, builder.make_training(networks, spec), config.total_env_steps)
        self._startup = StartupTimes(self._counter.snapshot())
        self._metrics: dict[str, float] = {}
        self._evaluation: dict[str, Any] | None = None

    # --- RPCs -------------------------------------------------------------------------

    def step(self, worker_id, run_id, inputs, episodes):
        """One env-worker step: counts it and its finished episodes, returns the actions.

        Args:
          worker_id, run_id, inputs: as for `InferenceServer.step`.
          episodes: (return, length) of each episode that finished in this step.

        Returns:
          The actions for the worker's envs, or None when the program is stopping.
        """
        return self._inference.step(worker_id, run_id, inputs, episodes)

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
            try:
                self._inference.join(timeout=5.0)
                self._prefetch.join(timeout_s=5.0)
                self._compiled.join()  # Its programs reach the compilation cache.
                self._feed.close()
            finally:
                # Also when a join or the feed's close fails: the last save finishes before the
                # process exits, or the run loses its final checkpoint.
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
            ready = self._prefetch.next_batch()
            if ready is None or not self._config.learn:
                continue
            batch, versions = ready
            self._compiled.first.wait()  # At once after the first update.
            # Learner steps change only on this thread: this update is the snapshot's next.
            if versions is not None:
                self._lag.add(versions, snapshot.learner_steps)
            if self._schedule is not None and self._schedule.due(snapshot.env_steps):
                self._learner.restore(self._schedule.apply(self._learner.state,
                                                           snapshot.env_steps))
            try:
                metrics = self._learner.step(batch)
            except jax.errors.JaxRuntimeError as e:
                unrolls = None if versions is None else versions.shape[1]
                message = out_of_memory_message(e, unrolls, self._config, self._batch_size)
                if message is None:
                    raise
                raise DeviceMemoryError(message) from e
            self._inference.set_params(self._learner.params, snapshot.learner_steps + 1)
            self._counter.add_learner_step()
            self._finite.add(metrics, snapshot.learner_steps + 1)
            if self._log_timer.due():
                served = (self._inference.steps, self._inference.batches)
                self._metrics = {**{k: float(v) for k, v in jax.device_get(metrics).items()},
                                 **self._lag.take(), **inference_batch_mean(served, self._served),
                                 **(self._schedule.metrics() if self._schedule else {})}
                self._served = served
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


class _Compiling:
    """Compiles the learner's update for every batch size the feed may give, smallest first,
    in a thread, from the node's start: which sizes a run meets depends on how unrolls
    happen to arrive, so compiling at first use would make a second run of the same config
    compile again (a miss in the persistent compilation cache), and meanwhile the policy
    compiles and the env workers start. `first` is set once the smallest is compiled (or
    there is nothing to compile); the larger ones wait for `after_first` (the policy's
    compile for its largest batch, with which serving starts): nothing needs them before
    the first update, and beside it they take cores and device time from the compile the
    first env step waits for. Each size compiled goes to `on_compiled` (the feed batches up
    to it from then on).

    Args:
      batches: {batch size: the batch's shapes}, smallest first.
    """

    def __init__(self, learner: Any, batches: dict[int, dict[str, Any]],
                 after_first: threading.Event, stop: threading.Event,
                 on_compiled: Callable[[int], None]):
        self.first = threading.Event()
        if not batches:
            self.first.set()
        self._thread = threading.Thread(
            target=self._run, args=(learner, batches, after_first, stop, on_compiled),
            name="compile")
        self._thread.start()

    def _run(self, learner: Any, batches: dict[int, dict[str, Any]],
             after_first: threading.Event, stop: threading.Event,
             on_compiled: Callable[[int], None]) -> None:
        try:
            for i, (size, batch) in enumerate(batches.items()):
                while i == 1 and not after_first.wait(0.1):
                    if stop.is_set():
                        return  # The policy never compiled: the node is stopping.
                learner.compile(batch)
                on_compiled(size)
                self.first.set()
        finally:
            self.first.set()  # A failed compile fails again, with its error, at the update.

    def join(self) -> None:
        self._thread.join()


def _abstract_batch(builder: Builder, spec: Any, queue_spec: Any,
                    batch_size: int) -> dict[str, Any]:
    """The shapes and dtypes of a batch of `batch_size` unrolls, as the feed gives it."""
    return {name: jax.ShapeDtypeStruct(s.shape, s.dtype) for name, s in unroll_signature(
        agent_step_specs(builder, spec), queue_spec.unroll_length, (batch_size,)).items()}


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
