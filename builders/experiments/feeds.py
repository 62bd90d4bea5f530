"""The learner's input: unrolls from inference in order (`UnrollFeed`, through the in-process
queue or the replay node's Queue table), or batches sampled from the agent's own replay table
(`ReplayFeed`, R2D2's prioritized sequences)."""

from __future__ import annotations

import collections
import math
import queue
import threading
from collections.abc import Callable, Mapping
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
from trellis.builders.experiments.inference import agent_step_specs
from trellis.builders.experiments.unroll_queue import (
    UNROLL_VERSIONS,
    LocalUnrollQueue,
    TableUnrollQueue,
    unroll_signature,
)
from trellis.envs.multi_agent import MultiAgentSpec
from trellis.envs.specs import EnvSpec
from trellis.launch.runtime.node_context import StopEvent
from trellis.reverb_tables import RateLimiterTimeout, ReplayClient, StreamingWriter, TableSpec

UnrollQueue = LocalUnrollQueue | TableUnrollQueue
# An `UnrollFeed` batch's field [T + 1, B]: the version of the params that acted at each step
# (the learner updates they had seen; `InferenceServer.set_params`). Not a learner input.
POLICY_VERSION = "policy_version"


class Prefetch:
    """The next batch made ready in a thread while the learner runs its update: taken from
    the feed, its policy versions split off, nested (`StepFormat.nest`) and placed where
    the learner reads it (e.g. a device_put to the learner's devices).

    One batch ahead and no more: the thread takes the next batch from the feed once the
    learner took the one before, as the learner itself would, so prefetching adds no
    policy lag; only the work of making it ready moves off the learner's thread.

    Args:
      feed: where batches come from (`UnrollFeed`, `ReplayFeed`).
      prepare: host batch -> what the learner takes (nest, then place).
      stop: the program's stop event; the thread ends once it is set.
    """

    def __init__(self, feed: UnrollFeed | ReplayFeed,
                 prepare: Callable[[dict[str, np.ndarray]], Any], stop: StopEvent):
        self._feed, self._prepare, self._stop = feed, prepare, stop
        self._ready: queue.Queue[tuple[Any, np.ndarray | None]] = queue.Queue(maxsize=1)
        self._taken = threading.Event()  # The learner took the batch made ready last.
        self._error: BaseException | None = None
        # Not a daemon, as the inference server's thread (builders/experiments/inference.py
        # says why: a daemon inside a JAX call at exit aborts the process); it ends at the stop.
        self._thread = threading.Thread(target=self._run, name="prefetch", daemon=False)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                batch = self._feed.next_batch()
                if batch is None:
                    continue
                versions = batch.pop(POLICY_VERSION, None)
                self._ready.put((self._prepare(batch), versions))  # Empty: taken before.
                while not self._stop.is_set() and not self._taken.wait(0.05):
                    pass
                self._taken.clear()
        except BaseException as e:  # Raised on the learner's thread by `next_batch`.
            self._error = e

    def next_batch(self) -> tuple[Any, np.ndarray | None] | None:
        """The next prepared batch and its policy versions [T + 1, B] (None from a feed
        that has none), or None if none was ready within a short wait.

        Raises:
          what taking or preparing a batch raised, in the thread.
        """
        try:
            ready = self._ready.get(timeout=0.05)
            self._taken.set()
            return ready
        except queue.Empty:
            if self._error is not None:
                raise self._error from None
            return None

    def join(self, timeout_s: float) -> None:
        """Waits for the thread to end (call after the stop)."""
        self._thread.join(timeout_s)

    def close(self, timeout_s: float) -> None:
        """Waits for the thread to end (call after the stop), then closes the feed."""
        self.join(timeout_s)
        self._feed.close()


def batch_sizes(queue_spec: QueueSpec, config: ExperimentConfig) -> tuple[int, ...]:
    """The batch sizes the learner may get, smallest first (see `UnrollFeed`).

    With `config.learner_batch == "auto"`: the agent's batch size B times powers of two, from
    the first that holds a quarter of all envs' unrolls (num_actors x envs_per_actor / 4:
    at most about 4 updates per round of unrolls, which bounds the policy lag) to the last
    that all envs' unrolls fill. A handful of sizes, so the update compiles a handful of
    times, each a multiple of B, so each divides over the learner devices as B does.
    "fixed": B alone.
    """
    b = queue_spec.batch_size
    if config.learner_batch == "fixed":
        return (b,)
    envs = config.num_actors * config.envs_per_actor
    smallest = b << max(0, math.ceil(envs / (4 * b)) - 1).bit_length()
    return tuple(size for size in (smallest << k for k in range(envs.bit_length()))
                 if size == smallest or size <= envs)


class UnrollBatcher:
    """Concatenates per-worker unroll chunks [T + 1, K, ...] into batches [T + 1, B, ...].

    Args:
      sizes: the batch sizes it may pop, ascending: the largest that the pending columns
        fill.
    """

    def __init__(self, sizes: tuple[int, ...]):
        self._sizes = sizes
        self._chunks: list[dict[str, np.ndarray]] = []
        self._columns = 0

    @property
    def columns(self) -> int:
        """Columns pending."""
        return self._columns

    def add(self, chunk: dict[str, np.ndarray]) -> None:
        self._chunks.append(chunk)
        self._columns += next(iter(chunk.values())).shape[1]

    def pop(self, limit: int | None = None) -> dict[str, np.ndarray] | None:
        """A full batch, of at most `limit` columns, if enough columns are pending; the rest
        stays for the next one."""
        if self._columns < self._sizes[0]:
            return None
        joined = {k: np.concatenate([c[k] for c in self._chunks], axis=1)
                  for k in self._chunks[0]}
        b = max(size for size in self._sizes
                if size <= min(self._columns, limit or self._columns))
        rest = {k: v[:, b:] for k, v in joined.items()}
        self._columns -= b
        self._chunks = [rest] if self._columns else []
        return {k: v[:, :b] for k, v in joined.items()}


# Batches in a row that the largest size allowed caps, while more unrolls wait, before the
# feed asks for the next size (`UnrollFeed.backlog`): one capped batch may be a burst.
_CAPPED_IN_A_ROW = 3


class UnrollFeed:
    """Unrolls from inference to the learner: a bounded queue, then batches.

    A batch takes at least the smallest of `sizes` columns (waiting for them), then every
    unroll already waiting in the queue, up to the largest: the largest size they fill goes
    to the learner, the rest waits for the next batch. So the batch follows the rate at which
    unrolls arrive: when env workers outrun the learner, each update learns from all that
    came during the one before, instead of the oldest unrolls of a growing backlog, and the
    policy lag stays at a few updates.

    Until `allow` raises it, the largest size is the smallest: the learner's update is
    compiled for one size after another, and a batch of a size not compiled yet would make the
    first update wait for its compilation. The next size is compiled once the feed asks for
    it (`backlog`): `_CAPPED_IN_A_ROW` batches in a row filled the largest size allowed while
    more unrolls waited. Meanwhile fewer unrolls may wait (`max_waiting`):
    a queue sized for the largest batches, drained in the smallest, would be learned from
    over many updates, and its last unrolls with that many updates of lag.

    Each batch carries `POLICY_VERSION` [T + 1, B] besides the unrolls' fields. The versions
    travel in the queue with each unroll (`UNROLL_VERSIONS`), so that the feeds of several
    learner processes may take their shares of one replay node's table.

    Args:
      unrolls: the queue (`builders.unroll_queue`: in-process, or a replay node's table).
      sizes: the batch sizes, in columns (envs), ascending (`batch_sizes`).
      stop: the program's stop event; a blocked `put` gives up once it is set.
      max_waiting: {largest size allowed: unrolls that may wait in the queue meanwhile}
        (`max_unrolls` of each size); None: as many as the queue holds.
    """

    def __init__(self, unrolls: UnrollQueue, sizes: tuple[int, ...], stop: StopEvent,
                 max_waiting: Mapping[int, int] | None = None):
        self._unrolls = unrolls
        self._min_columns = self._max_columns = sizes[0]
        self._batcher = UnrollBatcher(sizes)
        self._stop = stop
        self._max_waiting = max_waiting
        # Unrolls put and not yet taken; `put` waits on `_room` for fewer. (Where several
        # feeds take from one table, only the table bounds it: `max_waiting` None.)
        self._waiting = 0
        self._room = threading.Condition()
        self.backlog = threading.Event()  # Set: a larger size than allowed would be used.
        self._capped = 0  # Batches in a row capped at the largest size allowed.

    def allow(self, columns: int) -> None:
        """Batches of up to `columns` from now on (one of `sizes`: the update is compiled
        for it); `backlog` waits for batches that this size caps in turn."""
        with self._room:
            self._max_columns = max(self._max_columns, columns)
            self._capped = 0
            self.backlog.clear()
            self._room.notify_all()

    def put(self, chunk: dict[str, np.ndarray], versions: np.ndarray) -> None:
        """Queues one unroll [T + 1, K, ...] acted by params of `versions` [T + 1]; blocks
        while the queue is full (or holds `max_waiting` for the sizes allowed), until a
        stop."""
        with self._room:
            while (self._max_waiting is not None and not self._stop.is_set()
                   and self._waiting >= self._max_waiting[self._max_columns]):
                self._room.wait(0.1)
            # First: the learner may take the chunk as soon as it is queued.
            self._waiting += 1
        item = {**chunk, UNROLL_VERSIONS: versions}
        # Blocking while the learner is behind bounds policy lag; the stop ends the wait.
        while not self._stop.is_set():
            if self._unrolls.put(item, timeout_s=0.1):
                return

    def next_batch(self) -> dict[str, np.ndarray] | None:
        """The next batch [T + 1, B, ...], or None if the queue ran dry before one was full."""
        # Wait for the smallest batch, then take what is waiting, up to the largest.
        while self._batcher.columns < self._min_columns:
            if not self._take(timeout_s=0.05):
                return None
        limit = self._max_columns  # One read: `allow` may raise it meanwhile.
        while self._batcher.columns < limit and self._take(timeout_s=0.0):
            pass
        capped = self._batcher.columns > limit or (
            self._batcher.columns == limit and self._unrolls.size() > 0)
        self._capped = self._capped + 1 if capped else 0
        if self._capped >= _CAPPED_IN_A_ROW:
            self.backlog.set()
        return self._batcher.pop(limit)

    def _take(self, timeout_s: float) -> bool:
        """Moves one unroll from the queue to the batcher; False if none came in time."""
        chunk = self._unrolls.get(timeout_s=timeout_s)
        if chunk is None:
            return False
        versions = chunk.pop(UNROLL_VERSIONS)
        columns = next(iter(chunk.values())).shape[1]
        with self._room:
            self._waiting -= 1
            self._room.notify()
        self._batcher.add({**chunk, POLICY_VERSION: np.repeat(versions[:, None], columns, 1)})
        return True

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
        self.backlog = threading.Event()  # Never set: the one size is compiled first.

    def put(self, chunk: dict[str, np.ndarray], versions: np.ndarray) -> None:
        """Streams one item per env slot of `chunk` [T + 1, K, ...]; blocks while the rate
        limiter holds inserts back, until a stop. A stop loses only what the rate limiter
        holds back: an unroll recorded as the program stops still goes in. `versions` are
        not kept: a sampled item's age is the replay ratio's business, not a lag."""
        del versions
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

    def allow(self, columns: int) -> None:
        """Nothing to allow: every sampled batch has the one size, compiled first."""
        del columns

    def close(self) -> None:
        """Waits until the table has every item sent (those a stop cut short aside)."""
        try:
            self._writer.close()
        except RateLimiterTimeout:
            if not self._stop.is_set():
                raise
            # Stopping: what the rate limiter still held back is given up, as `put` does.

    @staticmethod
    def batch_shapes(items: dict[str, jax.ShapeDtypeStruct]) -> dict[str, jax.ShapeDtypeStruct]:
        """What `next_batch` gives for sampled items shaped as `items` (time-major, [T + 1, B,
        ...]): the same, with the keys and sampling fields."""
        b = items["first"].shape[1]
        return {**items, REPLAY_KEY: jax.ShapeDtypeStruct((b,), np.uint64),
                REPLAY_PROBABILITY: jax.ShapeDtypeStruct((1, b), np.float32),
                REPLAY_TABLE_SIZE: jax.ShapeDtypeStruct((1, b), np.float32)}

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


def max_unrolls(queue_spec: QueueSpec, config: ExperimentConfig,
                largest: int | None = None) -> int:
    """Bound of the unroll queue, in unrolls of one group of envs [T + 1, K]
    (`ExperimentConfig.envs_per_group`): `max_batches` batches of the smallest size, and with
    auto batches no more than two of the largest (one taken while the next fills: more would
    only age), `largest` if given (the largest the learner takes for now), else the largest
    of `batch_sizes`."""
    sizes = batch_sizes(queue_spec, config)
    bound = queue_spec.max_batches * math.ceil(sizes[0] / config.envs_per_group)
    if config.learner_batch == "fixed":
        return bound
    return min(bound, 2 * math.ceil((largest or sizes[-1]) / config.envs_per_group))


def agent_table(builder: Builder[Any], spec: EnvSpec | MultiAgentSpec) -> TableSpec | None:
    """The builder's own replay table (`Builder.replay_table`), for items that are one env
    slot's unroll {field: [T + 1, ...]}; None for most agents."""
    return builder.replay_table(unroll_signature(agent_step_specs(builder, spec),
                                                 builder.queue_spec().unroll_length))


def unroll_queue(queue_spec: QueueSpec, config: ExperimentConfig,
                  replay: ReplayClient | None) -> UnrollQueue:
    """The queue from inference to learner: in-process, or the replay node's table."""
    if config.unroll_queue == "local":
        return LocalUnrollQueue(max_unrolls(queue_spec, config))
    return TableUnrollQueue(replay)
