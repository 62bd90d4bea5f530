"""Where full unrolls wait between the inference server and the learner.

Both queues are bounded (inference blocks while the learner is behind, which bounds policy
lag instead of dropping data) and both hand out every unroll exactly once, in order.
"""

from __future__ import annotations

import queue
from collections.abc import Mapping
from typing import Any

import numpy as np

from trellis.builders.contract.agent import STATE_PREFIX, ArraySpec
from trellis.reverb_tables import RateLimiterTimeout, TableSpec

UNROLL_TABLE = "unrolls"
# A queued unroll's field [T + 1]: the version of the params that acted at each step. It
# travels in the queue with the unroll, so that several learner processes, each taking its
# share of a replay node's table, know the versions of the unrolls they take.
UNROLL_VERSIONS = "unroll_versions"


class LocalUnrollQueue:
    """In-process queue: inference and learner share the process, unrolls are not copied."""

    def __init__(self, max_unrolls: int):
        self._queue: queue.Queue[dict[str, np.ndarray]] = queue.Queue(max_unrolls)

    def put(self, unroll: dict[str, np.ndarray], timeout_s: float) -> bool:
        """Adds `unroll`; False if the queue stayed full for `timeout_s`."""
        try:
            self._queue.put(unroll, timeout=timeout_s)
        except queue.Full:
            return False
        return True

    def get(self, timeout_s: float) -> dict[str, np.ndarray] | None:
        """The oldest unroll, or None if none came within `timeout_s`."""
        try:
            return self._queue.get(timeout=timeout_s)
        except queue.Empty:
            return None

    def size(self) -> int:
        return self._queue.qsize()


def unroll_signature(step_specs: Mapping[str, ArraySpec], unroll_length: int,
                     columns: tuple[int, ...] = ()) -> dict[str, ArraySpec]:
    """The specs of an unroll {field: [T + 1, *columns, ...]}; the policy-state fields
    (`state/<name>`) are recorded once per unroll: [1, *columns, ...]."""
    return {
        name: ArraySpec(
            (1 if name.startswith(STATE_PREFIX) else unroll_length + 1,) + columns + s.shape,
            s.dtype)
        for name, s in step_specs.items()
    }


def unroll_table_spec(step_specs: Mapping[str, ArraySpec], unroll_length: int,
                      envs_per_worker: int, max_unrolls: int) -> TableSpec:
    """A Queue table of a worker's unrolls [T + 1, K, ...] and their `UNROLL_VERSIONS`:
    FIFO, each item sampled once."""
    signature = {**unroll_signature(step_specs, unroll_length, (envs_per_worker,)),
                 UNROLL_VERSIONS: ArraySpec((unroll_length + 1,), "int64")}
    return TableSpec.queue(UNROLL_TABLE, max_unrolls, signature=signature)


class TableUnrollQueue:
    """Unrolls through a Queue table (`unroll_table_spec`) of a replay node.

    The table's rate limiter gives the bound (inserts wait while it is full) and
    `max_times_sampled=1` with FIFO removal gives exactly-once delivery, on either replay
    backend and across processes.

    Args:
      replay: a replay client (`reverb_tables.ReplayClient` of a node, or an in-process client).
    """

    def __init__(self, replay: Any):
        self._replay = replay

    def put(self, unroll: dict[str, np.ndarray], timeout_s: float) -> bool:
        try:
            self._replay.insert(unroll, {UNROLL_TABLE: 1.0}, timeout_s=timeout_s)
        except RateLimiterTimeout:
            return False
        return True

    def get(self, timeout_s: float) -> dict[str, np.ndarray] | None:
        try:
            batch = self._replay.sample(UNROLL_TABLE, 1, timeout_s=timeout_s)
        except RateLimiterTimeout:
            return None
        return {name: value[0] for name, value in batch.data.items()}

    def size(self) -> int:
        return int(self._replay.info(UNROLL_TABLE)["size"])
