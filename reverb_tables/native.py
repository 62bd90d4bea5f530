"""The native backend: thread-safe in-process tables with Reverb's semantics.

`Table` serves one `TableSpec`; `NativeClient` serves several tables by name with the API of a
Reverb client (insert into several tables at once, sample, update priorities, delete, info,
checkpoint / restore).

Storage: with a signature, each leaf has one preallocated array of `max_size` rows and an item is
a row index ("slot"); inserts copy into the slot and samples gather rows with fancy indexing, so
the hot path creates no per-item Python object. Without a signature, items are kept as objects
and their leaves are stacked at sample time.

Concurrency: one lock and one condition per table. Blocking calls wait on the condition and
re-check the rate limiter after every change of the table's counters; `close()` wakes them all.
"""

from __future__ import annotations

import contextlib
import json
import math
import numbers
import os
import pickle
import secrets
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from trellis.reverb_tables import _index
from trellis.reverb_tables import spec as spec_lib
from trellis.reverb_tables import tree as tree_lib
from trellis.reverb_tables.errors import (
    RateLimiterTimeout,
    SignatureError,
    TableClosedError,
    UnknownTableError,
)
from trellis.reverb_tables.types import SampleBatch

_FORMAT = "trellis-reverb-tables/1"
_MANIFEST = "manifest.json"


def check_priority(priority: Any, table: str, key: Any = None) -> float:
    """Returns `priority` as a float, or raises ValueError unless it is a finite number >= 0."""
    what = f"priority for table {table!r}" + ("" if key is None else f" (key {key})")
    if isinstance(priority, bool) or not isinstance(priority, numbers.Real):
        raise ValueError(f"{what} must be a finite number >= 0, got {priority!r}")
    value = float(priority)
    if not math.isfinite(value) or value < 0.0:
        raise ValueError(f"{what} must be a finite number >= 0, got {value!r}")
    return value


def check_timeout(timeout_s: float | None) -> float | None:
    """Returns the deadline (time.monotonic) of a call with this timeout, None = no deadline."""
    if timeout_s is None:
        return None
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, numbers.Real) \
            or math.isnan(timeout_s) or timeout_s < 0:
        raise ValueError(
            f"timeout_s must be None (wait forever) or a number >= 0, got {timeout_s!r}"
        )
    return time.monotonic() + float(timeout_s)


class DataChecker:
    """Checks inserted data against a table's signature (shared by both backends).

    Args:
        spec: the table's spec; without a signature any pytree of arrays is accepted.
    """

    def __init__(self, spec: spec_lib.TableSpec):
        self.name = spec.name
        if spec.signature is not None:
            pairs, self.treedef = tree_lib.flatten_with_paths(spec.signature)
            self.paths = [p for p, _ in pairs]
            self.leaf_specs: list[spec_lib.ArraySpec] = [s for _, s in pairs]
        else:
            self.treedef = None
            self.paths, self.leaf_specs = [], []

    def prepare(self, data: Any) -> Any:
        """Validates and converts `data` for this table (no lock, no state change).

        Returns:
            With a signature, the list of leaves as arrays of the signature's dtypes; without,
            a (treedef, leaves) pair of copied arrays.

        Raises:
            SignatureError: the structure, a shape or a dtype differs from the signature.
        """
        pairs, treedef = tree_lib.flatten_with_paths(data)
        if self.treedef is None:
            return treedef, [np.array(leaf, copy=True) for _, leaf in pairs]
        if treedef != self.treedef:
            got = [p for p, _ in pairs]
            missing = [p for p in self.paths if p not in got]
            extra = [p for p in got if p not in self.paths]
            raise SignatureError(
                f"data does not match the signature of table {self.name!r}: expected leaves "
                f"{self.paths}, got {got}" + (f"; missing {missing}" if missing else "")
                + (f"; unexpected {extra}" if extra else "")
                + ("" if missing or extra else " (same paths, different container types)")
            )
        out = []
        for (path, leaf), s in zip(pairs, self.leaf_specs, strict=True):
            if hasattr(leaf, "dtype"):
                arr = np.asarray(leaf)
                if arr.dtype != s.dtype:
                    raise SignatureError(
                        f"table {self.name!r}, leaf {path}: expected dtype {s.dtype}, got "
                        f"{arr.dtype} (shape {arr.shape})"
                    )
            else:  # Python scalars and lists: convert when no precision class is crossed.
                arr = np.asarray(leaf)
                if not np.can_cast(arr.dtype, s.dtype, casting="same_kind"):
                    raise SignatureError(
                        f"table {self.name!r}, leaf {path}: expected dtype {s.dtype}, got a "
                        f"{type(leaf).__name__} of dtype {arr.dtype}"
                    )
                arr = arr.astype(s.dtype)
            if arr.shape != s.shape:
                raise SignatureError(
                    f"table {self.name!r}, leaf {path}: expected shape {s.shape}, got {arr.shape}"
                )
            out.append(arr)
        return out


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
        self._treedef = self._checker.treedef
        self._paths, self._leaf_specs = self._checker.paths, self._checker.leaf_specs
        self._init_state()

    # ---------------------------------------------------------------- state
    def _init_state(self) -> None:
        """(Re)allocates empty storage, indices and counters."""
        spec = self._spec
        self._capacity = int(spec.max_size)
        # One spare slot: as in Reverb, an insert into a full table adds the new item first and
        # then evicts the remover's choice, which may be the new item itself (e.g. with Lifo).
        cap = self._capacity + 1
        self._keys = np.zeros(cap, np.uint64)
        self._priorities = np.zeros(cap, np.float64)
        self._times_sampled = np.zeros(cap, np.int64)
        self._seq = np.zeros(cap, np.int64)  # insertion order (Fifo / Lifo)
        self._useq = np.zeros(cap, np.int64)  # order of inserts and priority updates (heap ties)
        self._slot_of_key: dict[int, int] = {}
        self._free = list(range(cap - 1, -1, -1))  # pop() hands out slot 0 first
        if self._treedef is not None:
            self._leaves = [np.zeros((cap, *s.shape), s.dtype) for s in self._leaf_specs]
            self._objects: list[Any] | None = None
        else:
            self._leaves = []
            self._objects = [None] * cap
        # `_live` gives the canonical item order that checkpoints save; every uniform index sees
        # the same operations, so they all keep this order.
        self._live = _index.UniformIndex(cap)
        self._sampler = _index.make_index(spec.sampler, cap)
        self._remover = _index.make_index(spec.remover, cap)
        self._next_seq = 0
        self._next_useq = 0
        self._counters = dict.fromkeys(
            ("inserts", "samples", "deletes", "evicted", "expired", "deleted", "updates"), 0
        )
        self._waiting = {"insert": 0, "sample": 0}
        self._closed = False

    @property
    def spec(self) -> spec_lib.TableSpec:
        return self._spec

    @property
    def name(self) -> str:
        return self._spec.name

    def __len__(self) -> int:
        with self._cond:
            return self._live.size

    # ---------------------------------------------------------------- rate limiter
    def _diff(self) -> float:
        spi = self._spec.rate_limiter.samples_per_insert
        return self._counters["inserts"] * spi - self._counters["samples"]

    def _can_insert(self) -> bool:
        c = self._counters
        return spec_lib.insert_admitted(self._spec.rate_limiter, c["inserts"], c["samples"],
                                        c["deletes"])

    def _admissible_samples(self, limit: int) -> int:
        """How many of `limit` samples the limiter admits now, without blocking."""
        if self._closed:
            return 0
        c = self._counters
        return spec_lib.samples_admitted(self._spec.rate_limiter, c["inserts"], c["samples"],
                                         c["deletes"], limit)

    def _limiter_state(self) -> str:
        c = self._counters
        return (
            f"rate limiter {type(self._spec.rate_limiter).__name__}("
            + ", ".join(f"{k}={v:g}" for k, v in self._spec.rate_limiter.params().items())
            + f"); table size="
            f"{self._live.size}/{self._capacity}, inserts={c['inserts']}, samples={c['samples']}, "
            f"deletes={c['deletes']}, diff=inserts*samples_per_insert-samples={self._diff():g}. "
            f"A sample needs size >= min_size_to_sample and diff-1 >= min_diff; an insert needs "
            f"size+1 <= min_size_to_sample or (inserts+1)*samples_per_insert-samples <= max_diff"
        )

    def _wait(self, ready, deadline: float | None, operation: str) -> None:
        """Waits (lock held) until `ready()`; raises on close or when `deadline` passes."""
        while True:
            if self._closed:
                raise TableClosedError(
                    f"table {self.name!r} is closed; {operation} refused (calls waiting on the "
                    f"rate limiter are woken by close())"
                )
            if ready():
                return
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise RateLimiterTimeout(
                    f"table {self.name!r}: timed out waiting for the rate limiter to admit "
                    f"{'a sample' if operation == 'sample' else 'an insert'}; "
                    f"{self._limiter_state()}",
                    table=self.name, operation=operation,
                )
            self._waiting[operation] += 1
            try:
                self._cond.wait(remaining)
            finally:
                self._waiting[operation] -= 1

    # ---------------------------------------------------------------- data
    def prepare(self, data: Any) -> Any:
        """Validates and converts `data` for this table (see `DataChecker.prepare`)."""
        return self._checker.prepare(data)

    def _gather(self, slots: np.ndarray, out: list[np.ndarray] | None = None, row: int = 0
                ) -> Any:
        """Data of `slots`, leaves stacked on a leading axis (lock held).

        With `out` (a table with a signature), written into its rows from `row` on instead.
        """
        if out is not None:
            for leaf, dest in zip(self._leaves, out, strict=True):
                # "clip": slots are valid, and the default "raise" buffers `out` (a copy more).
                np.take(leaf, slots, axis=0, out=dest[row:row + len(slots)], mode="clip")
            return None
        if self._treedef is not None:
            return tree_lib.unflatten(self._treedef, [leaf[slots] for leaf in self._leaves])
        items = [self._objects[s] for s in slots.tolist()]
        treedef = items[0][0]
        for td, _ in items[1:]:
            if td != treedef:
                raise ValueError(
                    f"table {self.name!r} has no signature and holds items of different "
                    f"structures; they cannot be stacked into one batch (give the table a "
                    f"signature)"
                )
        stacked = []
        for i in range(treedef.num_leaves):
            column = [leaves[i] for _, leaves in items]
            first = column[0]
            if any(a.dtype != first.dtype or a.shape != first.shape for a in column):
                raise ValueError(
                    f"table {self.name!r} has no signature and leaf {i} differs in shape or dtype "
                    f"between sampled items: {sorted({(a.shape, str(a.dtype)) for a in column})}"
                )
            stacked.append(np.stack(column))
        return tree_lib.unflatten(treedef, stacked)

    # ---------------------------------------------------------------- item operations
    def _remove_slot(self, slot: int, reason: str, release: bool = True) -> None:
        """Removes the item in `slot`. With `release=False` an object-stored item stays readable
        until `_release_removed` (sample gathers removed items after removing them)."""
        del self._slot_of_key[int(self._keys[slot])]
        self._live.remove(slot)
        self._sampler.remove(slot)
        self._remover.remove(slot)
        if release and self._objects is not None:
            self._objects[slot] = None
        self._free.append(slot)
        self._counters["deletes"] += 1
        self._counters[reason] += 1

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
        if key is None:
            key = secrets.randbits(64)
        elif isinstance(key, bool) or not isinstance(key, numbers.Integral) \
                or not 0 <= int(key) < 2**64:
            raise ValueError(f"item keys are ints in [0, 2**64), got {key!r}")
        key = int(key)
        with self._cond:
            self._wait(self._can_insert, deadline, "insert")
            if key in self._slot_of_key:
                raise ValueError(f"table {self.name!r} already holds an item with key {key}")
            slot = self._free.pop()
            if self._objects is None:
                for storage, leaf in zip(self._leaves, prepared, strict=True):
                    storage[slot] = leaf
            else:
                self._objects[slot] = prepared
            seq, useq = self._next_seq, self._next_useq
            self._next_seq += 1
            self._next_useq += 1
            self._keys[slot] = key
            self._priorities[slot] = priority
            self._times_sampled[slot] = 0
            self._seq[slot] = seq
            self._useq[slot] = useq
            self._slot_of_key[key] = slot
            self._live.insert(slot, priority, seq, useq)
            self._sampler.insert(slot, priority, seq, useq)
            self._remover.insert(slot, priority, seq, useq)
            self._counters["inserts"] += 1
            if self._live.size > self._capacity:
                victim = int(self._remover.sample(1, self._rng)[0][0])
                self._remove_slot(victim, "evicted")
            self._cond.notify_all()
        return key

    def _take(self, want: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Samples up to `want` admissible items now (lock held; admits >= 1 by precondition).

        Returns slots, probabilities, times_sampled (after this sample) and table sizes, one per
        sampled item. Items reaching max_times_sampled are removed after being recorded.
        """
        mts = self._spec.max_times_sampled
        size = self._live.size
        slots, probs = self._sampler.sample(want, self._rng)
        if mts == 0:
            # Duplicates in a batch each count: the k-th occurrence reports times_sampled + k.
            order = np.argsort(slots, kind="stable")
            s_sorted = slots[order]
            starts = np.r_[True, s_sorted[1:] != s_sorted[:-1]]
            first = np.maximum.accumulate(np.where(starts, np.arange(want), 0))
            rank = np.empty(want, np.int64)
            rank[order] = np.arange(want) - first
            times = self._times_sampled[slots] + rank + 1
            np.add.at(self._times_sampled, slots, 1)
            self._counters["samples"] += want
            return slots, probs, times, np.full(want, size, np.int64)
        # With max_times_sampled an item may leave mid-batch, which changes the distribution and
        # the limiter (size): accept draws in order and stop at the first removal.
        n = 0
        times = np.empty(want, np.int64)
        for i, slot in enumerate(slots.tolist()):
            self._times_sampled[slot] += 1
            times[i] = self._times_sampled[slot]
            self._counters["samples"] += 1
            n = i + 1
            if times[i] >= mts:
                self._remove_slot(slot, "expired", release=False)
                break
        return slots[:n], probs[:n], times[:n], np.full(n, size, np.int64)

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
            out = self._check_out(out, batch_size)
        parts: list[tuple] = []
        taken = 0
        with self._cond:
            while taken < batch_size:
                try:
                    self._wait(lambda: self._admissible_samples(1) > 0, deadline, "sample")
                except RateLimiterTimeout as e:
                    e.partial = self._assemble(parts, out) if parts else None
                    raise
                row = taken
                chunks = []
                while taken < batch_size:
                    want = self._admissible_samples(batch_size - taken)
                    if want == 0:
                        break
                    chunks.append(self._take(want))
                    taken += len(chunks[-1][0])
                slots, probs, times, sizes = (
                    chunks[0] if len(chunks) == 1
                    else [np.concatenate(col) for col in zip(*chunks, strict=True)]
                )
                # Gather before the lock is released: until then no insert can reuse the slots
                # of items that expired in this batch, so their rows are still intact.
                parts.append((self._gather(slots, out, row), self._keys[slots], probs,
                              self._priorities[slots], times, sizes))
                if self._objects is not None:  # now drop the objects of expired items
                    for s in slots.tolist():
                        if self._live.pos[s] < 0:
                            self._objects[s] = None
                self._cond.notify_all()
        return self._assemble(parts, out)

    def _check_out(self, out: Sequence[np.ndarray], batch_size: int) -> list[np.ndarray]:
        if self._treedef is None:
            raise ValueError(f"table {self.name!r} has no signature: it cannot sample into `out`")
        want = [((batch_size, *s.shape), s.dtype) for s in self._leaf_specs]
        got = [(a.shape, a.dtype) if isinstance(a, np.ndarray) else (type(a), None) for a in out]
        if got != want:
            raise ValueError(f"table {self.name!r}: `out` must be arrays of (shape, dtype) {want}, "
                             f"got {got}")
        return list(out)

    def _assemble(self, parts: list[tuple], out: list[np.ndarray] | None) -> SampleBatch:
        if out is not None:
            taken = sum(len(p[1]) for p in parts)
            parts = [(tree_lib.unflatten(self._treedef, [a[:taken] for a in out]),
                      *(np.concatenate([p[j] for p in parts]) for j in range(1, 6)))]
        if len(parts) == 1:
            data, keys, probs, prios, times, sizes = parts[0]
        else:
            datas = [p[0] for p in parts]
            leaves0, treedef = tree_lib.flatten(datas[0])
            columns = [tree_lib.flatten(d)[0] for d in datas]
            data = tree_lib.unflatten(
                treedef, [np.concatenate([c[i] for c in columns]) for i in range(len(leaves0))]
            )
            keys, probs, prios, times, sizes = (np.concatenate([p[j] for p in parts])
                                                for j in range(1, 6))
        return SampleBatch(data=data, keys=keys, probabilities=probs, priorities=prios,
                           times_sampled=times, table_size=sizes)

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
            if self._closed:
                raise TableClosedError(f"table {self.name!r} is closed; update refused")
            found = [(self._slot_of_key[int(k)], p) for k, p in checked.items()
                     if _as_key(k) in self._slot_of_key]
            if not found:
                return 0
            slots = np.fromiter((s for s, _ in found), np.int64, len(found))
            prios = np.fromiter((p for _, p in found), np.float64, len(found))
            useqs = np.arange(self._next_useq, self._next_useq + len(found), dtype=np.int64)
            self._next_useq += len(found)
            self._priorities[slots] = prios
            self._useq[slots] = useqs
            self._sampler.update_many(slots, prios, useqs)
            self._remover.update_many(slots, prios, useqs)
            self._counters["updates"] += len(found)
            return len(found)

    def delete(self, keys: Iterable[int]) -> int:
        """Deletes items by key; unknown keys are ignored, as in Reverb.

        Returns:
            The number of items deleted.
        """
        keys = list(keys)
        with self._cond:
            if self._closed:
                raise TableClosedError(f"table {self.name!r} is closed; delete refused")
            n = 0
            for k in keys:
                slot = self._slot_of_key.get(_as_key(k))
                if slot is not None:
                    self._remove_slot(slot, "deleted")
                    n += 1
            if n:
                self._cond.notify_all()
            return n

    def info(self) -> dict[str, Any]:
        """Size, counters and rate limiter state, as a plain dict.

        `num_deletes` counts every removal (= evicted + expired + deleted), which is what the
        rate limiter counts.
        """
        with self._cond:
            c = self._counters
            return {
                "name": self.name,
                "size": self._live.size,
                "max_size": self._capacity,
                "max_times_sampled": self._spec.max_times_sampled,
                "sampler": repr(self._spec.sampler),
                "remover": repr(self._spec.remover),
                "num_inserts": c["inserts"],
                "num_samples": c["samples"],
                "num_deletes": c["deletes"],
                "num_evicted": c["evicted"],
                "num_expired": c["expired"],
                "num_deleted": c["deleted"],
                "num_updates": c["updates"],
                "closed": self._closed,
                "rate_limiter": {
                    "type": type(self._spec.rate_limiter).__name__,
                    **self._spec.rate_limiter.params(),
                    "inserts": c["inserts"],
                    "samples": c["samples"],
                    "deletes": c["deletes"],
                    "diff": self._diff(),
                    "can_insert": (not self._closed) and self._can_insert(),
                    "can_sample": self._admissible_samples(1) > 0,
                    "blocked_inserts": self._waiting["insert"],
                    "blocked_samples": self._waiting["sample"],
                },
            }

    def close(self) -> None:
        """Closes the table: waiting and later inserts / samples raise TableClosedError."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    # ---------------------------------------------------------------- checkpoints
    def _snapshot(self) -> tuple[dict[str, Any], dict[str, np.ndarray], list | None]:
        """Copies the full state (lock held by the caller): json meta, arrays, objects."""
        order = self._live.order()
        meta = {
            "spec": self._spec.describe(),
            "counters": dict(self._counters),
            "next_seq": self._next_seq,
            "next_useq": self._next_useq,
            "rng_state": self._rng.bit_generator.state,
        }
        arrays = {
            "slots": order,
            "keys": self._keys[order],
            "priorities": self._priorities[order],
            "times_sampled": self._times_sampled[order],
            "seq": self._seq[order],
            "useq": self._useq[order],
            "free": np.asarray(self._free, np.int64),
        }
        for i, leaf in enumerate(self._leaves):
            arrays[f"leaf_{i}"] = leaf[order]
        objects = None if self._objects is None else [self._objects[s] for s in order.tolist()]
        return meta, arrays, objects

    def _check_snapshot(self, meta: dict, arrays: Mapping[str, np.ndarray],
                        objects: list | None) -> None:
        """Raises ValueError unless the snapshot fits this table (no state change)."""
        ours = json.loads(json.dumps(self._spec.describe()))
        if meta["spec"] != ours:
            diffs = [f"{k}: checkpoint {meta['spec'].get(k)!r} vs table {v!r}"
                     for k, v in ours.items() if meta["spec"].get(k) != v]
            raise ValueError(
                f"checkpoint of table {self.name!r} was written for a different spec: "
                + "; ".join(diffs)
            )
        n = len(arrays["slots"])
        if n > self._capacity or len(arrays["free"]) != self._capacity + 1 - n:
            raise ValueError(f"checkpoint of table {self.name!r} is inconsistent (sizes)")
        for i, s in enumerate(self._leaf_specs):
            leaf = arrays[f"leaf_{i}"]
            if leaf.shape != (n, *s.shape) or leaf.dtype != s.dtype:
                raise ValueError(
                    f"checkpoint of table {self.name!r}, leaf {self._paths[i]}: expected "
                    f"{(n, *s.shape)} {s.dtype}, got {leaf.shape} {leaf.dtype}"
                )
        if (objects is None) != (self._objects is None) or (objects is not None
                                                              and len(objects) != n):
            raise ValueError(f"checkpoint of table {self.name!r} is inconsistent (objects)")

    def _load_snapshot(self, meta: dict, arrays: Mapping[str, np.ndarray],
                       objects: list | None) -> None:
        """Replaces the state with a checked snapshot (lock held by the caller)."""
        closed, waiting = self._closed, self._waiting
        self._init_state()
        self._closed, self._waiting = closed, waiting
        slots = np.asarray(arrays["slots"], np.int64)
        self._keys[slots] = arrays["keys"]
        self._priorities[slots] = arrays["priorities"]
        self._times_sampled[slots] = arrays["times_sampled"]
        self._seq[slots] = arrays["seq"]
        self._useq[slots] = arrays["useq"]
        self._slot_of_key = dict(zip(arrays["keys"].tolist(), slots.tolist(), strict=True))
        self._free = arrays["free"].tolist()
        for i, leaf in enumerate(self._leaves):
            leaf[slots] = arrays[f"leaf_{i}"]
        if objects is not None:
            for s, obj in zip(slots.tolist(), objects, strict=True):
                self._objects[s] = obj
        args = (slots, self._priorities[slots], self._seq[slots], self._useq[slots])
        for index in (self._live, self._sampler, self._remover):
            index.bulk_load(*args)
        self._counters = {k: int(v) for k, v in meta["counters"].items()}
        self._next_seq = int(meta["next_seq"])
        self._next_useq = int(meta["next_useq"])
        self._rng.bit_generator.state = meta["rng_state"]
        self._cond.notify_all()


def _as_key(k: Any) -> int:
    return int(k) if isinstance(k, numbers.Integral) else k


class NativeClient:
    """In-process tables served by name, with the API of a Reverb client.

    Args:
        tables: the specs of the tables (unique names).
        seed: seeds the tables' generators (one independent stream per table); None = entropy.
    """

    def __init__(self, tables: Sequence[spec_lib.TableSpec], *, seed: int | None = None):
        tables = list(tables)
        if not tables:
            raise ValueError("NativeClient needs at least one TableSpec")
        names = [t.name if isinstance(t, spec_lib.TableSpec) else t for t in tables]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"table names must be unique, got duplicates {dupes}")
        seeds = np.random.SeedSequence(seed).spawn(len(tables))
        self._tables = {t.name: Table(t, seed=s) for t, s in zip(tables, seeds, strict=True)}

    @property
    def table_names(self) -> list[str]:
        return list(self._tables)

    def table(self, name: str) -> Table:
        """The table called `name`.

        Raises:
            UnknownTableError: no such table (the message lists the tables).
        """
        try:
            return self._tables[name]
        except (KeyError, TypeError):
            raise UnknownTableError(
                f"unknown table {name!r}; this client serves {sorted(self._tables)}"
            ) from None

    def insert(self, data: Any, priorities: Mapping[str, float],
               timeout_s: float | None = None) -> int:
        """Inserts `data` as one item into each table of `priorities` (with that priority).

        Everything is validated for every table before anything is written. The item has the
        same key in every table. Each table's rate limiter is awaited in turn (all within one
        deadline); if a later table times out or is closed, the earlier tables keep the item.

        Args:
            data: pytree of arrays.
            priorities: {table name: priority >= 0}, at least one table.
            timeout_s: None waits forever; otherwise RateLimiterTimeout after this many seconds.

        Returns:
            The key of the new item.
        """
        if not isinstance(priorities, Mapping) or not priorities:
            raise ValueError(
                f"priorities must be a non-empty {{table name: priority}} dict, got {priorities!r}"
            )
        deadline = check_timeout(timeout_s)
        plan = []
        for name, p in priorities.items():
            table = self.table(name)
            plan.append((table, table.prepare(data), check_priority(p, name)))
        key = secrets.randbits(64)
        for table, prepared, p in plan:
            table.insert_prepared(prepared, p, key=key, deadline=deadline)
        return key

    def sample(self, table: str, batch_size: int, timeout_s: float | None = None,
               out: Sequence[np.ndarray] | None = None) -> SampleBatch:
        """Samples `batch_size` items from `table` (see `Table.sample`)."""
        return self.table(table).sample(batch_size, timeout_s=timeout_s, out=out)

    def update_priorities(self, table: str, updates: Mapping[int, float]) -> int:
        """Updates priorities by key; unknown keys are ignored (see `Table.update_priorities`)."""
        return self.table(table).update_priorities(updates)

    def delete(self, table: str, keys: Iterable[int]) -> int:
        """Deletes items by key; unknown keys are ignored. Returns the number deleted."""
        return self.table(table).delete(keys)

    def info(self, table: str) -> dict[str, Any]:
        """Size, counters and rate limiter state of `table` (see `Table.info`)."""
        return self.table(table).info()

    def close(self) -> None:
        """Closes every table, waking all waiting calls with TableClosedError."""
        for table in self._tables.values():
            table.close()

    def __enter__(self) -> NativeClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---------------------------------------------------------------- checkpoints
    def checkpoint(self, directory: str | os.PathLike) -> str:
        """Writes every table to `directory`, atomically.

        All tables are locked while their state is copied (a consistent cut, as Reverb blocks
        the server while checkpointing); files are written after the locks are released, to a
        temporary sibling directory that then replaces `directory`.

        Layout: `manifest.json` (format, per table: spec, counters, generator state) and per
        table `table_<i>.npz` (items in canonical order: slots, keys, priorities, times_sampled,
        insertion order, data leaves) plus `table_<i>.pkl` for tables without a signature.

        Returns:
            The absolute path of the checkpoint directory.
        """
        directory = os.path.abspath(os.fspath(directory))
        tables = [self._tables[n] for n in sorted(self._tables)]
        with contextlib.ExitStack() as stack:
            for t in tables:
                stack.enter_context(t._cond)
            snapshots = [t._snapshot() for t in tables]
        parent = os.path.dirname(directory)
        os.makedirs(parent, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(directory)}.tmp-", dir=parent)
        try:
            manifest = {"format": _FORMAT, "tables": []}
            for i, (table, (meta, arrays, objects)) in enumerate(zip(tables, snapshots,
                                                                     strict=True)):
                entry = {"name": table.name, "file": f"table_{i:03d}.npz", **meta}
                with open(os.path.join(tmp, entry["file"]), "wb") as f:
                    np.savez(f, **arrays)
                if objects is not None:
                    entry["objects"] = f"table_{i:03d}.pkl"
                    with open(os.path.join(tmp, entry["objects"]), "wb") as f:
                        pickle.dump(objects, f, protocol=pickle.HIGHEST_PROTOCOL)
                manifest["tables"].append(entry)
            with open(os.path.join(tmp, _MANIFEST), "w") as f:
                json.dump(manifest, f, indent=1)
            old = None
            if os.path.exists(directory):
                old = f"{directory}.old-{uuid.uuid4().hex[:8]}"
                os.rename(directory, old)
            os.rename(tmp, directory)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return directory

    def restore(self, directory: str | os.PathLike) -> None:
        """Replaces the state of every table with a checkpoint written by `checkpoint`.

        The checkpoint must hold exactly this client's tables, with the same specs. Everything is
        read and checked before any table changes. Restores items, keys, priorities,
        times_sampled, insertion order, free slots, counters and random generator states, so a
        restored client samples exactly as the original would have.

        Raises:
            FileNotFoundError: no checkpoint in `directory`.
            ValueError: the checkpoint does not match the tables (nothing is changed).
        """
        directory = os.fspath(directory)
        with open(os.path.join(directory, _MANIFEST)) as f:
            manifest = json.load(f)
        if manifest.get("format") != _FORMAT:
            raise ValueError(f"{directory} holds format {manifest.get('format')!r}, expected "
                             f"{_FORMAT!r}")
        saved = {e["name"]: e for e in manifest["tables"]}
        if sorted(saved) != sorted(self._tables):
            raise ValueError(f"checkpoint holds tables {sorted(saved)}, this client serves "
                             f"{sorted(self._tables)}")
        loaded = {}
        for name, entry in saved.items():
            with np.load(os.path.join(directory, entry["file"]), allow_pickle=False) as npz:
                arrays = {k: npz[k] for k in npz.files}
            objects = None
            if "objects" in entry:
                with open(os.path.join(directory, entry["objects"]), "rb") as f:
                    objects = pickle.load(f)
            self._tables[name]._check_snapshot(entry, arrays, objects)
            loaded[name] = (entry, arrays, objects)
        tables = [self._tables[n] for n in sorted(self._tables)]
        with contextlib.ExitStack() as stack:
            for t in tables:
                stack.enter_context(t._cond)
            for t in tables:
                t._load_snapshot(*loaded[t.name])
