"""Inference's unroll recorder: per-worker buffers of the steps it served, handed over full.

The server answers a batch first and records it after (builders/experiments/inference.py), so
the recorder's copies run while the workers step their envs.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from trellis.builders.contract.agent import STATE_PREFIX, ArraySpec

# Receives each full unroll {field: [T + 1, K, ...]} and the params version of each of its
# steps [T + 1]; may block (back-pressure).
OnUnroll = Callable[[dict[str, np.ndarray], np.ndarray], None]


class UnrollRecorder:
    """Per-worker unroll buffers [T + 1, K, ...]; hands each one over when it is full.

    A worker's K envs advance in lockstep, so one time index per worker suffices. The last
    `overlap` steps of an unroll are copied to be the first of the next one; a full unroll's
    buffers go to `on_unroll` as they are (this side never writes them again), so nothing
    else is copied; with them goes the params version of each of its steps [T + 1]. A new
    run id for a worker (the process restarted) drops its partial unroll, so no unroll spans
    two runs.

    Fields named `state/<name>` are not per step: an unroll holds them once, [1, K, ...], as
    the policy state at its first step. `record` asks for the state (a callable, so it is
    fetched from the device only then) at the steps where an unroll begins: every
    `T + 1 - overlap` steps from a run's first. With an overlap beyond half the unroll (R2D2's
    burn-in) several unrolls have begun and not ended, so their states wait in order.
    """

    def __init__(
        self,
        specs: Mapping[str, ArraySpec],
        num_workers: int,
        envs_per_worker: int,
        unroll_length: int,
        on_unroll: OnUnroll,
        overlap: int = 1,
    ):
        self._specs = dict(specs)
        self._steps = [name for name in specs if not name.startswith(STATE_PREFIX)]
        self._states = [name for name in specs if name.startswith(STATE_PREFIX)]
        self._k = envs_per_worker
        self._length = unroll_length + 1
        self._overlap = overlap
        self._on_unroll = on_unroll
        self._unrolls = [self._empty() for _ in range(num_workers)]  # Each worker's current.
        self._versions = [np.zeros(self._length, np.int64) for _ in range(num_workers)]
        self._t = [0] * num_workers  # Steps in the current unroll.
        self._since_start = [0] * num_workers  # Steps since the latest unroll began.
        # The states of the unrolls begun and not emitted yet, oldest first.
        self._begun: list[collections.deque[dict[str, np.ndarray]]] = [
            collections.deque() for _ in range(num_workers)]
        self._run_ids: list[int | None] = [None] * num_workers
        self.resets = 0

    def _empty(self) -> dict[str, np.ndarray]:
        """One unroll's buffers: [T + 1, K, ...] per step field, [1, K, ...] per state field.

        Not zeroed: every row is written before the unroll is handed over, and zeroing a
        Pong unroll (19 MB at 32 envs) made recording a step 1.4x slower
        (benchmarks/inference_copies.py).
        """
        return {name: np.empty((1 if name.startswith(STATE_PREFIX) else self._length, self._k)
                               + s.shape, s.dtype)
                for name, s in self._specs.items()}

    def is_new_run(self, worker_id: int, run_id: int) -> bool:
        """Whether `run_id` is not the run this worker's buffers hold (a start or a restart)."""
        return self._run_ids[worker_id] != run_id

    def record(self, workers: Sequence[tuple[int, int]], steps: Mapping[str, np.ndarray],
               state: Callable[[], Mapping[str, np.ndarray]] | None = None,
               version: int = 0) -> None:
        """Writes one step of each worker's K envs; emits the unrolls it completes.

        One call per served batch: the batch's fields are indexed per worker here, so the
        serving loop builds no dict per worker (with them, the serving thread's time per
        request outside the policy was 15.6-20.6 us at 64 workers on 2 cores, 13.2-18.8
        without: benchmarks/inference_profile.py, 2026-12-07).

        Args:
          workers: (worker_id, run_id) of each worker in the batch, in the order of `steps`'
            rows; a new run id restarts the worker's unroll.
          steps: {field: [len(workers), K, ...]} for every per-step field.
          state: returns the policy state {name: [len(workers), K, ...]} that this step
            started from; called at most once, where some worker's unroll begins, and needed
            when `state/` fields are recorded.
          version: the version of the params that picked this step's actions.
        """
        fields = [(name, steps[name]) for name in self._steps]
        batch_state = None
        for i, (worker_id, run_id) in enumerate(workers):
            if self.is_new_run(worker_id, run_id):
                if self._run_ids[worker_id] is not None:
                    self.resets += 1
                self._run_ids[worker_id] = run_id
                self._t[worker_id] = 0
                self._since_start[worker_id] = 0
                self._begun[worker_id].clear()
            if self._states and self._since_start[worker_id] == 0:  # An unroll begins here.
                assert state is not None, "an unroll of a stateful policy begins: state is needed"
                if batch_state is None:
                    batch_state = state()
                self._begun[worker_id].append(
                    {name: np.array(batch_state[name.removeprefix(STATE_PREFIX)][i])
                     for name in self._states})
            self._since_start[worker_id] = (self._since_start[worker_id] + 1) % (
                self._length - self._overlap)
            t = self._t[worker_id]
            unroll = self._unrolls[worker_id]
            for name, values in fields:
                unroll[name][t] = values[i]
            self._versions[worker_id][t] = version
            if t + 1 < self._length:
                self._t[worker_id] = t + 1
            else:
                self._emit(worker_id)

    def _emit(self, worker_id: int) -> None:
        """Hands over the worker's full unroll; its last `overlap` steps begin the next one."""
        unroll, versions = self._unrolls[worker_id], self._versions[worker_id]
        if self._states:
            for name, first_rows in self._begun[worker_id].popleft().items():
                unroll[name][0] = first_rows
        following = self._empty()
        for name in self._steps:
            following[name][:self._overlap] = unroll[name][-self._overlap:]
        self._unrolls[worker_id] = following
        self._versions[worker_id] = np.concatenate(
            [versions[-self._overlap:], np.zeros(self._length - self._overlap, np.int64)])
        self._t[worker_id] = self._overlap
        self._on_unroll(unroll, versions)
