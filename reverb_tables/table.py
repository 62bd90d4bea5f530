"""`Table`: one thread-safe in-process replay table with Reverb's semantics (native backend).

A table is the composition of its parts, each in its own module:
- `checks`: what callers hand it (data against the signature, priorities, keys, timeouts),
  checked outside the lock;
- `_store.ItemStore`: the items (data, keys, priorities, times sampled, order), the sampler's
  and remover's indices over them, and which items leave (eviction, expiry, deletion);
- `_limiter.Limiter`: the rate limiter's counts and the waits of calls it holds back;
- `_batch`: a sample's batch, assembled from the chunks it takes between waits.
The table itself holds the lock, the random generator and the counts the limiter does not keep,
runs each operation through its parts in order (check, wait, change the store, count, wake the
waiting calls), and snapshots its state for checkpoints. `NativeClient` (native.py) serves
several tables and writes the checkpoints.

Concurrency: one lock and one condition per table. Blocking calls wait on the condition and
re-check the rate limiter after every change of the table's counts; `close()` wakes them all.
"""

from __future__ import annotations

import json
import numbers
import secrets
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from trellis.reverb_tables import _batch
from trellis.reverb_tables import spec as spec_lib
from trellis.reverb_tables._limiter import Limiter
from trellis.reverb_tables._store import ItemStore
from trellis.reverb_tables.checks import DataChecker, check_key, check_priority, check_timeout
from trellis.reverb_tables.errors import RateLimiterTimeout, TableClosedError
from trellis.reverb_tables.types import SampleBatch


class Table:
    """One replay table (thread-safe). See `reverb_tables.spec` for the semantics.

    Args:
        spec: the table's spec.
        seed: seed of the table's random generator (sampling, random removers); None = entropy.
    """

    def __init__(self, spec: spec_lib.TableSpec, *,
                 seed: int | np.random.SeedSequence | None = None):
        if not isinstance(spec, spec_lib.TableSpec):
            raise ValueError(f"Table needs a TableSpec, got {spec!r}")
        self._spec = spec
        self._cond = threading.Condition(threading.Lock())
        self._rng = np.random.default_rng(seed)
        self._checker = DataChecker(spec)
        self._store = ItemStore(spec, self._checker)
        self._limiter = Limiter(spec, self._cond)
        # The counts the limiter does not keep: priority updates, and removals by cause; every
        # removal is counted here and as one of the limiter's deletes (num_deletes = evicted +
        # expired + deleted), inline where it happens, as a call costs ~2% of a queue's sample.
        self._stats = dict.fromkeys(("evicted", "expired", "deleted", "updates"), 0)

    @property
    def spec(self) -> spec_lib.TableSpec:
        return self._spec

    @property
    def name(self) -> str:
        return self._spec.name

    def __len__(self) -> int:
        with self._cond:
            return self._store.size

    def prepare(self, data: Any) -> Any:
        """Validates and converts `data` for this table (see `DataChecker.prepare`)."""
        return self._checker.prepare(data)

    def _check_open(self, operation: str) -> None:
        if self._limiter.closed:
            raise TableClosedError(f"table {self.name!r} is closed; {operation} refused")

    # ---------------------------------------------------------------- insert
    def insert(self, data: Any, priority: float, *, key: int | None = None,
               timeout_s: float | None = None) -> int:
        """Inserts one item, blocking while the rate limiter refuses inserts.

        When the table is full, the remover's choice is evicted first (as in Reverb).

        Args:
            data: pytree of arrays (matching the signature, when there is one).
            priority: finite number >= 0.
            key: the item's key; None draws a random 64-bit key (as Reverb's client does).
            timeout_s: None waits forever; otherwise RateLimiterTimeout after this many seconds.

        Returns:
            The item's key.

        Raises:
            SignatureError, ValueError: bad data, priority, key or timeout (table unchanged).
            RateLimiterTimeout: the limiter did not admit the insert in time (table unchanged).
            TableClosedError: the table is or gets closed.
        """
        deadline = check_timeout(timeout_s)
        priority = check_priority(priority, self.name)
        prepared = self.prepare(data)
        return self.insert_prepared(prepared, priority, key=key, deadline=deadline)

    def insert_prepared(self, prepared: Any, priority: float, *, key: int | None,
                        deadline: float | None) -> int:
        """`insert` for data already checked by `prepare` and a checked priority."""
        key = secrets.randbits(64) if key is None else check_key(key)
        with self._cond:
            self._limiter.wait("insert", deadline)
            evicted = self._store.add(key, prepared, priority, self._rng)
            self._limiter.inserts += 1
            if evicted:
                self._limiter.deletes += 1
                self._stats["evicted"] += 1
            self._cond.notify_all()
        return key

    # ---------------------------------------------------------------- sample
    def sample(self, batch_size: int, timeout_s: float | None = None,
               out: Sequence[np.ndarray] | None = None) -> SampleBatch:
        """Samples `batch_size` items (with replacement, as independent Reverb samples).

        Every item counts as one sample for the rate limiter and waits for it on its own, so a
        batch larger than what the limiter admits at once (e.g. a Queue) is served as inserts
        arrive. Items whose times_sampled reaches max_times_sampled are removed.

        Args:
            batch_size: number of items (>= 1).
            timeout_s: None waits forever; otherwise RateLimiterTimeout after this many seconds.
            out: where to write the data (e.g. shared memory): one array per signature leaf, in
                `tree.flatten` order, of shape [batch_size, *leaf shape] and the leaf's dtype;
                the batch's data are then these arrays. Only for a table with a signature.

        Returns:
            A SampleBatch with data leaves stacked on a leading axis of `batch_size`.

        Raises:
            RateLimiterTimeout: the deadline passed; its `partial` holds the items already taken.
            TableClosedError: the table is or gets closed.
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) \
                or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        deadline = check_timeout(timeout_s)
        if out is not None:
            out = _batch.check_out(self._checker, out, batch_size)
        treedef = self._checker.treedef
        chunks: list[_batch.Chunk] = []  # one per wake-up: what the limiter admitted then
        taken = 0
        with self._cond:
            while taken < batch_size:
                try:
                    self._limiter.wait("sample", deadline)
                except RateLimiterTimeout as e:
                    e.partial = _batch.assemble(chunks, out, treedef) if chunks else None
                    raise
                row = taken
                draws = []
                while taken < batch_size:
                    want = self._limiter.admissible_samples(batch_size - taken)
                    if want == 0:
                        break
                    draws.append(self._draw(want))
                    taken += len(draws[-1][0])
                slots, probs, times, sizes = (
                    draws[0] if len(draws) == 1
                    else [np.concatenate(col) for col in zip(*draws, strict=True)]
                )
                # Gather before the lock is released: until then no insert can reuse the slots
                # of items that expired in this batch, so their rows are still intact.
                chunks.append((self._store.gather(slots, out, row), self._store.keys[slots],
                               probs, self._store.priorities[slots], times, sizes))
                self._store.release_removed(slots)
                self._cond.notify_all()
        return _batch.assemble(chunks, out, treedef)

    def _draw(self, want: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Samples up to `want` admitted items now (lock held; the limiter admits `want`).

        Returns slots, probabilities, times_sampled (after this sample) and table sizes, one per
        sampled item (see `ItemStore.sample`).
        """
        size = self._store.size
        slots, probs, times, expired = self._store.sample(want, self._rng)
        self._limiter.samples += len(slots)
        if expired:
            self._limiter.deletes += 1
            self._stats["expired"] += 1
        return slots, probs, times, np.full(len(slots), size, np.int64)

    # ---------------------------------------------------------------- other operations
    def update_priorities(self, updates: Mapping[int, float]) -> int:
        """Sets the priorities of items by key. Unknown keys are ignored, as in Reverb (the item
        may have been evicted since it was sampled).

        Returns:
            The number of items updated.

        Raises:
            ValueError: a priority is negative, NaN or infinite (nothing is updated).
        """
        checked = {k: check_priority(p, self.name, k) for k, p in updates.items()}
        with self._cond:
            self._check_open("update")
            n = self._store.update_priorities(checked)
            self._stats["updates"] += n
            return n

    def delete(self, keys: Iterable[int]) -> int:
        """Deletes items by key; unknown keys are ignored, as in Reverb.

        Returns:
            The number of items deleted.
        """
        keys = list(keys)
        with self._cond:
            self._check_open("delete")
            n = sum(self._store.delete(k) for k in keys)
            if n:
                self._limiter.deletes += n
                self._stats["deleted"] += n
                self._cond.notify_all()
            return n

    def info(self) -> dict[str, Any]:
        """Size, counters and rate limiter state, as a plain dict.

        `num_deletes` counts every removal (= evicted + expired + deleted), which is what the
        rate limiter counts.
        """
        with self._cond:
            return {
                "name": self.name,
                "size": self._store.size,
                "max_size": self._store.capacity,
                "max_times_sampled": self._spec.max_times_sampled,
                "sampler": repr(self._spec.sampler),
                "remover": repr(self._spec.remover),
                **{f"num_{k}": v for k, v in self._counts().items()},
                "closed": self._limiter.closed,
                "rate_limiter": self._limiter.info(),
            }

    def close(self) -> None:
        """Closes the table: waiting and later inserts / samples raise TableClosedError."""
        with self._cond:
            self._limiter.close()

    def _counts(self) -> dict[str, int]:
        lim = self._limiter
        return {"inserts": lim.inserts, "samples": lim.samples, "deletes": lim.deletes,
                **self._stats}

    # ---------------------------------------------------------------- checkpoints
    def _snapshot(self) -> tuple[dict[str, Any], dict[str, np.ndarray], list[Any] | None]:
        """Copies the full state (lock held by the caller): json meta, arrays, objects."""
        store_meta, arrays, objects = self._store.snapshot()
        meta = {"spec": self._spec.describe(), "counters": self._counts(), **store_meta,
                "rng_state": self._rng.bit_generator.state}
        return meta, arrays, objects

    def _check_snapshot(self, meta: dict[str, Any], arrays: Mapping[str, np.ndarray],
                        objects: list[Any] | None) -> None:
        """Raises ValueError unless the snapshot fits this table (no state change)."""
        ours = json.loads(json.dumps(self._spec.describe()))
        if meta["spec"] != ours:
            diffs = [f"{k}: checkpoint {meta['spec'].get(k)!r} vs table {v!r}"
                     for k, v in ours.items() if meta["spec"].get(k) != v]
            raise ValueError(
                f"checkpoint of table {self.name!r} was written for a different spec: "
                + "; ".join(diffs)
            )
        self._store.check_snapshot(arrays, objects)

    def _load_snapshot(self, meta: dict[str, Any], arrays: Mapping[str, np.ndarray],
                       objects: list[Any] | None) -> None:
        """Replaces the state with a checked snapshot (lock held by the caller).

        Whether the table is closed, and the calls waiting on it, stay as they are.
        """
        self._store = ItemStore(self._spec, self._checker)
        self._store.load(meta, arrays, objects)
        counts = {k: int(v) for k, v in meta["counters"].items()}
        lim = self._limiter
        lim.inserts, lim.samples, lim.deletes = (counts.pop(k)
                                                 for k in ("inserts", "samples", "deletes"))
        self._stats = counts
        self._rng.bit_generator.state = meta["rng_state"]
        self._cond.notify_all()
