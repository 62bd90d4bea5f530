"""The items of a native table, the indices over them, and when items leave (private).

`ItemStore` owns, per slot (a row of preallocated storage): the item's data, key, priority,
times sampled, insertion order and update order; the key -> slot map; the free slots; and three
indices over the live slots (`_index`): `live` (the canonical order that checkpoints save), the
sampler's and the remover's. Every change goes to all of them at once, so they agree. It also
decides which items leave: the remover's choice when an insert overfills the table (eviction),
an item sampled max_times_sampled times (expiry), and deletions by key.

Storage: with a signature, each leaf has one preallocated array of rows and an item is a slot;
inserts copy into the slot and samples gather rows with fancy indexing, so the hot path creates
no per-item Python object. Without a signature, items are kept as (treedef, leaves) objects and
stacked at sample time.

It neither locks nor counts for the rate limiter: the table does both around every call,
told by each call whether an item left.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any

import numpy as np

from trellis.reverb_tables import _index
from trellis.reverb_tables import spec as spec_lib
from trellis.reverb_tables import tree as tree_lib
from trellis.reverb_tables.checks import DataChecker


class ItemStore:
    """The items of one table.

    Args:
        spec: the table's spec (max_size, sampler, remover, max_times_sampled).
        checker: the table's `DataChecker` (signature: treedef, leaf paths and specs).
    """

    def __init__(self, spec: spec_lib.TableSpec, checker: DataChecker):
        self._name = spec.name
        self._checker = checker
        self.capacity = int(spec.max_size)
        self._max_times_sampled = spec.max_times_sampled
        # One spare slot: as in Reverb, an insert into a full table adds the new item first and
        # then evicts the remover's choice, which may be the new item itself (e.g. with Lifo).
        cap = self.capacity + 1
        self.keys = np.zeros(cap, np.uint64)
        self.priorities = np.zeros(cap, np.float64)
        self._times_sampled = np.zeros(cap, np.int64)
        self._seq = np.zeros(cap, np.int64)  # insertion order (Fifo / Lifo)
        self._useq = np.zeros(cap, np.int64)  # order of inserts and priority updates (heap ties)
        self._next_seq = 0
        self._next_useq = 0
        self._slot_of_key: dict[int, int] = {}
        self._free = list(range(cap - 1, -1, -1))  # pop() hands out slot 0 first
        if checker.treedef is not None:
            self.leaves = [np.zeros((cap, *s.shape), s.dtype) for s in checker.leaf_specs]
            self._objects: list[Any] | None = None
        else:
            self.leaves = []
            self._objects = [None] * cap
        # Every uniform index sees the same operations, so they all keep `live`'s order.
        self._live = _index.UniformIndex(cap)
        self._sampler = _index.make_index(spec.sampler, cap)
        self._remover = _index.make_index(spec.remover, cap)

    @property
    def size(self) -> int:
        return self._live.size

    def _slot_of(self, key: Any) -> int | None:
        return self._slot_of_key.get(int(key) if isinstance(key, numbers.Integral) else key)

    def add(self, key: int, prepared: Any, priority: float, rng: np.random.Generator) -> bool:
        """Stores a new item (data from `DataChecker.prepare`); when that overfills the table,
        evicts the remover's choice, which may be the new item itself (as in Reverb).

        Returns:
            Whether an item was evicted.

        Raises:
            ValueError: the table already holds an item with `key` (nothing changes).
        """
        if key in self._slot_of_key:
            raise ValueError(f"table {self._name!r} already holds an item with key {key}")
        slot = self._free.pop()
        if self._objects is None:
            for storage, leaf in zip(self.leaves, prepared, strict=True):
                storage[slot] = leaf
        else:
            self._objects[slot] = prepared
        seq, useq = self._next_seq, self._next_useq
        self._next_seq += 1
        self._next_useq += 1
        self.keys[slot] = key
        self.priorities[slot] = priority
        self._times_sampled[slot] = 0
        self._seq[slot] = seq
        self._useq[slot] = useq
        self._slot_of_key[key] = slot
        self._live.insert(slot, priority, seq, useq)
        self._sampler.insert(slot, priority, seq, useq)
        self._remover.insert(slot, priority, seq, useq)
        if self._live.size <= self.capacity:
            return False
        self._remove(int(self._remover.sample(1, rng)[0][0]))
        return True

    def delete(self, key: Any) -> bool:
        """Removes the item with `key`; returns False (and does nothing) if there is none."""
        slot = self._slot_of(key)
        if slot is None:
            return False
        self._remove(slot)
        return True

    def _remove(self, slot: int, release: bool = True) -> None:
        """Removes the item in `slot`. With `release=False` an object-stored item stays readable
        until `release_removed` (a sample gathers the items that expire in it afterwards)."""
        del self._slot_of_key[int(self.keys[slot])]
        # One call per index, not a loop over them: this runs once per expiring sample.
        self._live.remove(slot)
        self._sampler.remove(slot)
        self._remover.remove(slot)
        if release and self._objects is not None:
            self._objects[slot] = None
        self._free.append(slot)

    def release_removed(self, slots: np.ndarray) -> None:
        """Drops the objects of those `slots` whose items were removed with `release=False`."""
        if self._objects is not None:
            for s in slots.tolist():
                if self._live.pos[s] < 0:
                    self._objects[s] = None

    def update_priorities(self, updates: Mapping[Any, float]) -> int:
        """Sets the priorities of the items with these keys (checked priorities); unknown keys
        are skipped. Returns the number of items updated."""
        found = [(slot, p) for k, p in updates.items() if (slot := self._slot_of(k)) is not None]
        n = len(found)
        if not n:
            return 0
        slots = np.fromiter((s for s, _ in found), np.int64, n)
        priorities = np.fromiter((p for _, p in found), np.float64, n)
        useqs = np.arange(self._next_useq, self._next_useq + n, dtype=np.int64)
        self._next_useq += n
        self.priorities[slots] = priorities
        self._useq[slots] = useqs
        self._sampler.update_many(slots, priorities, useqs)
        self._remover.update_many(slots, priorities, useqs)
        return n

    def sample(self, want: int, rng: np.random.Generator
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
        """Draws `want` items from the sampler and counts them as sampled (needs size > 0).

        With max_times_sampled > 0 an item may have to leave mid-batch, which changes the
        distribution of later draws: the draws stop at the first item reaching it, the last one
        returned, which is removed (its data readable until `release_removed`).

        Returns:
            Slots, selection probabilities and times_sampled after this sample, one per draw,
            and whether the last one expired.
        """
        slots, probs = self._sampler.sample(want, rng)
        mts = self._max_times_sampled
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
            return slots, probs, times, False
        times = np.empty(want, np.int64)
        for i, slot in enumerate(slots.tolist()):
            self._times_sampled[slot] += 1
            times[i] = self._times_sampled[slot]
            if times[i] >= mts:
                self._remove(slot, release=False)
                return slots[:i + 1], probs[:i + 1], times[:i + 1], True
        return slots, probs, times, False

    def gather(self, slots: np.ndarray, out: list[np.ndarray] | None = None, row: int = 0
               ) -> Any:
        """Data of `slots`, leaves stacked on a leading axis.

        With `out` (a table with a signature), written into its rows from `row` on instead.
        """
        if out is not None:
            for leaf, dest in zip(self.leaves, out, strict=True):
                # "clip": slots are valid, and the default "raise" buffers `out` (a copy more).
                np.take(leaf, slots, axis=0, out=dest[row:row + len(slots)], mode="clip")
            return None
        if self._objects is None:
            assert self._checker.treedef is not None  # a store without objects has a signature
            return tree_lib.unflatten(self._checker.treedef, [leaf[slots] for leaf in self.leaves])
        items = [self._objects[s] for s in slots.tolist()]
        treedef = items[0][0]
        for td, _ in items[1:]:
            if td != treedef:
                raise ValueError(
                    f"table {self._name!r} has no signature and holds items of different "
                    f"structures; they cannot be stacked into one batch (give the table a "
                    f"signature)"
                )
        stacked = []
        for i in range(treedef.num_leaves):
            column = [leaves[i] for _, leaves in items]
            first = column[0]
            if any(a.dtype != first.dtype or a.shape != first.shape for a in column):
                raise ValueError(
                    f"table {self._name!r} has no signature and leaf {i} differs in shape or "
                    f"dtype between sampled items: "
                    f"{sorted({(a.shape, str(a.dtype)) for a in column})}"
                )
            stacked.append(np.stack(column))
        return tree_lib.unflatten(treedef, stacked)

    # ---------------------------------------------------------------- checkpoints
    def snapshot(self) -> tuple[dict[str, int], dict[str, np.ndarray], list[Any] | None]:
        """Copies the items in canonical order: json meta, arrays, objects (None with a
        signature)."""
        order = self._live.order()
        meta = {"next_seq": self._next_seq, "next_useq": self._next_useq}
        arrays = {
            "slots": order,
            "keys": self.keys[order],
            "priorities": self.priorities[order],
            "times_sampled": self._times_sampled[order],
            "seq": self._seq[order],
            "useq": self._useq[order],
            "free": np.asarray(self._free, np.int64),
        }
        for i, leaf in enumerate(self.leaves):
            arrays[f"leaf_{i}"] = leaf[order]
        objects = None if self._objects is None else [self._objects[s] for s in order.tolist()]
        return meta, arrays, objects

    def check_snapshot(self, arrays: Mapping[str, np.ndarray], objects: list[Any] | None) -> None:
        """Raises ValueError unless a `snapshot`'s arrays and objects fit this store."""
        n = len(arrays["slots"])
        if n > self.capacity or len(arrays["free"]) != self.capacity + 1 - n:
            raise ValueError(f"checkpoint of table {self._name!r} is inconsistent (sizes)")
        for i, s in enumerate(self._checker.leaf_specs):
            leaf = arrays[f"leaf_{i}"]
            if leaf.shape != (n, *s.shape) or leaf.dtype != s.dtype:
                raise ValueError(
                    f"checkpoint of table {self._name!r}, leaf {self._checker.paths[i]}: "
                    f"expected {(n, *s.shape)} {s.dtype}, got {leaf.shape} {leaf.dtype}"
                )
        if (objects is None) != (self._objects is None) or (objects is not None
                                                              and len(objects) != n):
            raise ValueError(f"checkpoint of table {self._name!r} is inconsistent (objects)")

    def load(self, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray],
             objects: list[Any] | None) -> None:
        """Fills this new, empty store with a checked `snapshot`."""
        slots = np.asarray(arrays["slots"], np.int64)
        self.keys[slots] = arrays["keys"]
        self.priorities[slots] = arrays["priorities"]
        self._times_sampled[slots] = arrays["times_sampled"]
        self._seq[slots] = arrays["seq"]
        self._useq[slots] = arrays["useq"]
        self._next_seq = int(meta["next_seq"])
        self._next_useq = int(meta["next_useq"])
        self._slot_of_key = dict(zip(arrays["keys"].tolist(), slots.tolist(), strict=True))
        self._free = arrays["free"].tolist()
        for i, leaf in enumerate(self.leaves):
            leaf[slots] = arrays[f"leaf_{i}"]
        if objects is not None and self._objects is not None:  # both or neither: check_snapshot
            for s, obj in zip(slots.tolist(), objects, strict=True):
                self._objects[s] = obj
        args = (slots, self.priorities[slots], self._seq[slots], self._useq[slots])
        for index in (self._live, self._sampler, self._remover):
            index.bulk_load(*args)
