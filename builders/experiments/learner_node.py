"""The learner node: the learner and the inference server in one process, sharing the params.

SEED RL's learner is the model: env workers send observations to this node's inference server
(`inference`), which batches them on the accelerator and turns what it saw into
unrolls; the learner loop here takes them in batches, updates, and hands the new params back
to inference in the same process, with no copy through the network.

The node receives its parts, built in its process by `program.learner_node` (Launchpad's and
Acme's way: a node gets its collaborators, it does not build them): the inference server, the
learner's input (`feeds`: unrolls in order, or batches sampled from the agent's replay table,
prefetched), the update (`learner_update`), the counter (`counter`), the stop rule (`stop`),
the report (`learner_stats`) and the checkpointer (`checkpointing`). Its loop only moves batches
and params.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

import jax

from trellis.builders.contract.agent import KeepsReplay
from trellis.builders.experiments.checkpointing import Checkpointer, save_replay
from trellis.builders.experiments.counter import Counter, CounterSnapshot
from trellis.builders.experiments.distributed import LearnerGroup
from trellis.builders.experiments.feeds import Prefetch
from trellis.builders.experiments.inference import InferenceServer
from trellis.builders.experiments.learner_stats import LearnerStats
from trellis.builders.experiments.learner_update import LearnerUpdate
from trellis.builders.experiments.stop import StopRule
from trellis.launch import runtime
from trellis.launch.runtime.node_context import StopEvent


class LearnerNode:
    """Service node: central inference for the env workers, and the learner loop in `run()`.

    RPCs: `step(...)` and `shm_address()` for env workers (see EnvWorker), `stats()` for
    progress displays, `env_steps()`, `get_params()` and `record_evaluation(...)` for the
    evaluator, `checkpoint()` for the session.

    The learner loop only moves batches and params (next batch -> update -> params to
    inference), asking the stop rule between updates and checkpointing when the session asks
    (the `checkpoint` RPC). When the rule gives a reason the program stops
    (`runtime.request_stop`) with the final stats as `info`; stopped from outside, the node
    still sends them (`runtime.report_final`: the result of a signal then carries them). With a
    checkpointer, the learner state and the counter are checkpointed on each `checkpoint()` and
    when the node stops.

    Args:
      inference: the inference server, fed by `step` (not started yet).
      batches: the learner's input, prefetched; closed when the node stops.
      update: the learner's update.
      counter: the run's counter (restored where the run resumes); the loop counts updates.
      stop_rule: when to stop, from the counter.
      stats: the report, fed by the loop.
      checkpointer: where the learner state and the counter go; None: no checkpoints.
      stop: the program's stop event.
      learn: False: batches are taken and dropped, no update (`ExperimentConfig.learn`).
      group: the learner's processes (`distributed.LearnerGroup`; this node is its
        coordinator), which update in step; default: this process alone.
    """

    def __init__(self, inference: InferenceServer, batches: Prefetch, update: LearnerUpdate,
                 counter: Counter, stop_rule: StopRule, stats: LearnerStats,
                 checkpointer: Checkpointer | None, stop: StopEvent, learn: bool = True,
                 group: LearnerGroup | None = None):
        self._inference = inference
        self._batches = batches
        self._update = update
        self._counter = counter
        self._stop_rule = stop_rule
        self._stats = stats
        self._checkpointer = checkpointer
        self._stop = stop
        self._learn = learn
        self._group = group or LearnerGroup()
        # Set by the `checkpoint` RPC (the session's timer), honoured between updates.
        self._checkpoint_due = threading.Event()
        # The last update's metrics while they are not logged (`LearnerStats.due`).
        self._unlogged: Mapping[str, Any] | None = None

    # --- RPCs -------------------------------------------------------------------------

    def step(self, worker_id: int, run_id: int, inputs: Any, episodes: Any) -> Any:
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
        return self._stats.report(self._counter.snapshot)

    def env_steps(self) -> int:
        """Env steps counted so far, over all sessions of the run."""
        return self._counter.env_steps()

    def get_params(self) -> Any:
        """The current params as host (numpy) arrays, e.g. for an evaluator in another process."""
        return jax.device_get(self._update.learner.params)

    def checkpoint(self) -> None:
        """Checkpoints before the next update (the learner thread owns the state)."""
        self._checkpoint_due.set()

    def record_evaluation(self, result: dict[str, Any]) -> None:
        """Keeps an evaluator's latest result; `stats()` reports it."""
        self._stats.record_evaluation(result)

    # --- Learner loop -----------------------------------------------------------------

    def run(self) -> None:
        """Trains until the stop rule or the program says stop; checkpoints at the end."""
        self._counter.start_session()
        self._inference.start()
        try:
            reason = self._train()
            if self._unlogged is not None:  # The final report has the last update's metrics.
                self._stats.log(self._unlogged, self._update.schedule_metrics())
            # Also when stopped from outside (Ctrl-C, another node's stop). One snapshot for
            # both, so the run's final stats are the counts of its last checkpoint.
            final = self._counter.snapshot()
            self._save_checkpoint(final)
            if self._checkpointer is not None:
                # On disk before the joins below, which take seconds of the run's bounded
                # shutdown (`shutdown_timeout_s`) that the checkpoint needs more.
                self._checkpointer.wait()
                self._save_replay(final)
            if reason is not None:
                runtime.request_stop(reason, info=self._stats.report(lambda: final))
            else:  # Stopped from outside: the final counts go with that stop's result.
                runtime.report_final(self._stats.report(lambda: final))
        finally:
            try:
                self._inference.join(timeout=5.0)
                self._batches.close(timeout_s=5.0)
                self._update.close()
            finally:
                # Also when a join or the feed's close fails: the last save finishes before the
                # process exits, or the run loses its final checkpoint.
                if self._checkpointer is not None:
                    self._checkpointer.close()

    def _train(self) -> str | None:
        """Learner updates until the stop rule gives its reason, or None if stopped outside.

        Each pass the learner's processes agree (`LearnerGroup.agree`; alone, it agrees with
        itself): all stop when one stops, all update when all hold their share of a batch.
        """
        ready = None  # A batch held while the group's other processes wait for theirs.
        while True:
            snapshot = self._counter.snapshot()
            self._stats.observe(snapshot)  # Within one loop pass (<= 50 ms when idle).
            reason = self._stop_rule(snapshot)
            stopping = reason is not None or self._stop.is_set()
            if ready is None and not stopping:
                ready = self._batches.next_batch()
            turn = self._group.agree(ready is not None, stopping, snapshot.env_steps)
            if turn.stop:
                return reason
            if self._checkpoint_due.is_set():
                self._checkpoint_due.clear()
                self._save_checkpoint(self._counter.snapshot())
            if not turn.go or ready is None:
                continue
            (batch, versions), ready = ready, None
            if not self._learn:
                continue
            # Learner steps change only on this thread: this update is the snapshot's next.
            self._stats.add_lag(versions, snapshot.learner_steps)
            metrics = self._update(batch, versions, snapshot.env_steps)
            self._inference.set_params(self._update.learner.params, snapshot.learner_steps + 1)
            self._counter.add_learner_step()
            self._update.check_later(metrics, snapshot.learner_steps + 1)
            if self._stats.due():
                self._stats.log(metrics, self._update.schedule_metrics())
                self._unlogged = None
            else:
                self._unlogged = metrics

    def _save_replay(self, final: CounterSnapshot) -> None:
        """Saves a learner's replay beside the session's final checkpoint (after it: a run
        whose shutdown bound runs out meanwhile still has that checkpoint)."""
        learner = self._update.learner
        if self._checkpointer is None or not isinstance(learner, KeepsReplay):
            return
        start = time.monotonic()
        items = save_replay(learner, self._checkpointer.directory, final.env_steps)
        print(f"[learner] replay of {items} items saved with checkpoint {final.env_steps} in "
              f"{time.monotonic() - start:.1f} s", file=sys.stderr, flush=True)

    def _save_checkpoint(self, snapshot: CounterSnapshot) -> None:
        """Checkpoints the learner state with the counter's `snapshot` (host side only).

        Call on the learner thread: the state and the learner-step count only change there,
        so a snapshot taken on it matches the state.
        """
        self._update.check()  # A state that went NaN must not replace the last good one.
        if self._checkpointer is None:
            return
        progress = snapshot.progress()
        self._checkpointer.save(progress["env_steps"], self._update.learner.state, progress)
