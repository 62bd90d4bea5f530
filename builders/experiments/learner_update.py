"""The learner node's update: one batch in, new params out, on the learner's thread.

`LearnerUpdate` wraps the agent's `Learner` with what each update needs around it: the update
compiled ahead for the batch sizes the feed gives (`CompileAhead`), the learning-rate
schedule set into the state when due, XLA's out-of-memory error said in the user's terms, and
each update's metrics checked for NaN and Inf one update late (`FiniteCheck`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from trellis.builders.contract.agent import Learner
from trellis.builders.contract.config import ExperimentConfig
from trellis.builders.experiments.schedule import LearningRateSchedule
from trellis.launch.runtime.node_context import StopEvent
from trellis.launch.runtime.priority import lower_thread_priority


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


@jax.jit
def _all_finite(metrics: Mapping[str, Any]) -> jax.Array:
    """Whether every metric is finite, as one device boolean: one small program and one
    scalar to the host instead of every metric (a fetch of 7 device scalars took 55 us of the
    learner's thread, this 13 us, 2026-11-29)."""
    return jnp.all(jnp.asarray([jnp.all(jnp.isfinite(value))
                                for value in jax.tree.leaves(metrics)], bool))


class FiniteCheck:
    """Checks each learner update's metrics for NaN and Inf, one update late.

    Reading an update's metrics waits for it on the device; reading the previous one's while
    the newest runs keeps the learner loop from stalling on every step.
    """

    def __init__(self) -> None:
        self._pending: tuple[Mapping[str, Any], int] | None = None

    def add(self, metrics: Mapping[str, Any], learner_step: int) -> None:
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
        if _all_finite(metrics):
            return
        bad = {name: value for name, value in jax.device_get(metrics).items()
               if not np.all(np.isfinite(value))}
        if bad:
            values = ", ".join(f"{name}={np.asarray(value).tolist()}"
                               for name, value in sorted(bad.items()))
            raise NonFiniteLossError(
                f"learner step {step} gave non-finite metrics ({values}); stopped without "
                f"checkpointing it, the last good checkpoint is kept (a lower --learning_rate "
                f"may help)")


class CompileAhead:
    """Compiles the learner's update for the feed's batch sizes, smallest first, in a thread,
    from the node's start. `first` is set once the smallest is compiled (or there is nothing
    to compile). Each larger size waits for `after_first` (the policy's compile for its
    largest batch, with which serving starts) and for `wanted` (the feed's `backlog`: unrolls
    arrive faster than the sizes compiled so far take them), then compiles at the thread's
    lowest CPU priority. Each size compiled goes to `on_compiled` (the feed batches up to it
    from then on, and clears `wanted` until it needs the next).

    A size nobody needs is not compiled: XLA compiles on threads of its own, at their own
    priority, so on 2 cores the larger sizes, compiled ahead, took the cores of acting through
    the first seconds of learning (IMPALA on CartPole, 2 workers, which never needs them:
    about 5 CPU-seconds, 2026-11-29). A run that needs one compiles it beside the updates it
    goes on making at the sizes it has.

    Args:
      batches: {batch size: the batch's shapes}, smallest first.
    """

    def __init__(self, learner: Learner, batches: Mapping[int, Mapping[str, Any]],
                 after_first: threading.Event, wanted: threading.Event, stop: StopEvent,
                 on_compiled: Callable[[int], None]):
        self.first = threading.Event()
        # `time.time()` when the last size was compiled (None before the first): a run's rate
        # settles once the sizes it needs are (throughput.py's steady window opens there).
        self.compiled_at: float | None = None
        if not batches:
            self.first.set()
        # Set by `close`: the learner ends before the program's stop when its loop fails.
        self._closing = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(learner, batches, (after_first, wanted), stop, on_compiled),
            name="compile")
        self._thread.start()

    def _run(self, learner: Learner, batches: Mapping[int, Mapping[str, Any]],
             waits: tuple[threading.Event, ...], stop: StopEvent,
             on_compiled: Callable[[int], None]) -> None:
        try:
            for i, (size, batch) in enumerate(batches.items()):
                if i > 0:
                    for event in waits:
                        while not event.wait(0.1):
                            if stop.is_set() or self._closing.is_set():
                                return  # Not needed before the learner ends.
                    # The feed batches to the sizes compiled so far meanwhile.
                    lower_thread_priority()
                learner.compile(batch)
                self.compiled_at = time.time()
                on_compiled(size)
                self.first.set()
        finally:
            self.first.set()  # A failed compile fails again, with its error, at the update.

    def close(self) -> None:
        """Compiles no more sizes; waits for the one under way (into the compilation cache)."""
        self._closing.set()
        self._thread.join()


class LearnerUpdate:
    """The agent's learner, one update per batch, with what each update needs around it.

    Args:
      learner: the agent's learner (its state is the one checkpointed).
      compiled: its update, compiled ahead; the first update waits for the smallest size.
      schedule: the learning-rate schedule, or None (constant).
      config: the experiment's settings, for the out-of-memory message.
      batch_size: the agent's batch size, for the same.
    """

    def __init__(self, learner: Learner, compiled: CompileAhead,
                 schedule: LearningRateSchedule | None, config: ExperimentConfig,
                 batch_size: int):
        self._learner = learner
        self._compiled = compiled
        self._schedule = schedule
        self._config, self._batch_size = config, batch_size
        self._finite = FiniteCheck()

    @property
    def learner(self) -> Learner:
        return self._learner

    def __call__(self, batch: Any, versions: np.ndarray | None,
                 env_steps: int) -> Mapping[str, Any]:
        """One update on `batch` (acted by params of `versions` [T + 1, B]; None: sampled
        from replay) once the run took `env_steps` env steps: its metrics, on the device.

        Raises:
          DeviceMemoryError: the update ran out of device memory.
        """
        self._compiled.first.wait()  # At once after the first update.
        learner = self._learner
        if self._schedule is not None and self._schedule.due(env_steps):
            learner.restore(self._schedule.apply(learner.state, env_steps))
        try:
            return learner.step(batch)
        except jax.errors.JaxRuntimeError as e:
            unrolls = None if versions is None else versions.shape[1]
            message = out_of_memory_message(e, unrolls, self._config, self._batch_size)
            if message is None:
                raise
            raise DeviceMemoryError(message) from e

    def check_later(self, metrics: Mapping[str, Any], learner_step: int) -> None:
        """Checks the previous update's metrics for NaN and Inf, and keeps these
        (`learner_step`'s) for the next call or `check` (`FiniteCheck.add`)."""
        self._finite.add(metrics, learner_step)

    def check(self) -> None:
        """Checks the last update's metrics now, e.g. before its state is checkpointed."""
        self._finite.check()

    def schedule_metrics(self) -> dict[str, float]:
        """The learning-rate factor in effect ({} without a schedule)."""
        return self._schedule.metrics() if self._schedule is not None else {}

    def close(self) -> None:
        """Ends the compiles ahead: the one under way finishes (its program reaches the
        compilation cache), the sizes not begun are not compiled."""
        self._compiled.close()
