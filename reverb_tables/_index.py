"""Index structures behind the selectors of the native backend (private).

Each index tracks the live slots of one table (slots are rows of the preallocated storage,
0 <= slot < capacity) and answers `sample(n, rng) -> (slots, probabilities)`. The table calls
them under its lock, so they are not thread-safe themselves.

Costs: Uniform O(1) insert/remove/sample; Prioritized O(log n) (a sum-tree over the preallocated
capacity, sampled with one vectorised descent per batch); Fifo/Lifo amortised O(1); heaps
O(log n) with lazy invalidation.
"""

from __future__ import annotations

import collections
import heapq

import numpy as np

from trellis.reverb_tables import spec as spec_lib


class Index:
    """Interface of an index over live slots."""

    def insert(self, slot: int, priority: float, seq: int, useq: int) -> None:
        raise NotImplementedError

    def update(self, slot: int, priority: float, useq: int) -> None:
        """Priority change; `useq` orders inserts and updates (heap tie-breaks)."""

    def update_many(self, slots: np.ndarray, priorities: np.ndarray, useqs: np.ndarray) -> None:
        for s, p, u in zip(slots.tolist(), priorities.tolist(), useqs.tolist(), strict=True):
            self.update(s, p, u)

    def remove(self, slot: int) -> None:
        raise NotImplementedError

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Returns `n` slots (int64) and their selection probabilities (float64). Needs size > 0."""
        raise NotImplementedError

    def bulk_load(self, slots: np.ndarray, priorities: np.ndarray, seqs: np.ndarray,
                  useqs: np.ndarray) -> None:
        """Rebuilds the (empty) index from live items; `slots` in the table's canonical order."""
        for s, p, q, u in zip(slots.tolist(), priorities.tolist(), seqs.tolist(), useqs.tolist(),
                              strict=True):
            self.insert(s, p, q, u)


class UniformIndex(Index):
    """Dense array of live slots; removal swaps the last slot into the hole."""

    def __init__(self, capacity: int):
        self.dense: np.ndarray = np.empty(capacity, np.int64)
        self.pos = np.full(capacity, -1, np.int64)
        self.size = 0

    def insert(self, slot: int, priority: float, seq: int, useq: int) -> None:
        self.dense[self.size] = slot
        self.pos[slot] = self.size
        self.size += 1

    def remove(self, slot: int) -> None:
        i = int(self.pos[slot])
        last = int(self.dense[self.size - 1])
        self.dense[i] = last
        self.pos[last] = i
        self.pos[slot] = -1
        self.size -= 1

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        idx = rng.integers(0, self.size, size=n)
        return self.dense[idx], np.full(n, 1.0 / self.size)

    def order(self) -> np.ndarray:
        """Live slots in dense order (the table's canonical order, saved by checkpoints)."""
        order: np.ndarray = self.dense[: self.size].copy()
        return order


class PrioritizedIndex(Index):
    """Sum-tree of weights p^a over a power-of-two number of leaves (leaf of slot s: P + s)."""

    def __init__(self, capacity: int, exponent: float):
        self.exponent = exponent
        self.num_leaves = 1 << max(0, (capacity - 1).bit_length())
        self.depth = self.num_leaves.bit_length() - 1
        self.tree = np.zeros(2 * self.num_leaves, np.float64)
        # Live slots, for the size and for the uniform fallback when every weight is 0.
        self.live = UniformIndex(capacity)

    def _weight(self, priority: float | np.ndarray) -> np.ndarray:
        # Priority 0 weighs 0 even with exponent 0 (where np.power(0, 0) == 1): dm-reverb
        # never samples such an item (checked by the conformance suite on both backends).
        p = np.asarray(priority, np.float64)
        return np.where(p > 0, np.power(p, self.exponent), 0.0)

    def _set(self, slot: int, weight: float) -> None:
        i = self.num_leaves + slot
        tree = self.tree
        tree[i] = weight
        i >>= 1
        while i >= 1:
            # Recompute from the children (no running +=/-=) so rounding never accumulates.
            tree[i] = tree[2 * i] + tree[2 * i + 1]
            i >>= 1

    def _set_many(self, slots: np.ndarray, weights: np.ndarray) -> None:
        nodes = np.unique(slots + self.num_leaves)
        self.tree[slots + self.num_leaves] = weights
        for _ in range(self.depth):
            nodes = np.unique(nodes >> 1)
            self.tree[nodes] = self.tree[2 * nodes] + self.tree[2 * nodes + 1]

    def insert(self, slot: int, priority: float, seq: int, useq: int) -> None:
        self.live.insert(slot, priority, seq, useq)
        self._set(slot, float(self._weight(priority)))

    def update(self, slot: int, priority: float, useq: int) -> None:
        self._set(slot, float(self._weight(priority)))

    def update_many(self, slots: np.ndarray, priorities: np.ndarray, useqs: np.ndarray
                    ) -> None:
        if len(slots) <= 4:
            super().update_many(slots, priorities, useqs)
        else:
            self._set_many(np.asarray(slots, np.int64), self._weight(priorities))

    def remove(self, slot: int) -> None:
        self.live.remove(slot)
        self._set(slot, 0.0)

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        total = self.tree[1]
        if not total > 0.0:
            return self.live.sample(n, rng)
        tree = self.tree
        u = rng.random(n) * total
        node = np.ones(n, np.int64)
        for _ in range(self.depth):
            left_child = 2 * node
            left = tree[left_child]
            right = tree[left_child + 1]
            # Go right when u is past the left mass, unless rounding would send us into an empty
            # right subtree; always go right when the left subtree is empty.
            go_right = ((u >= left) & (right > 0.0)) | (left <= 0.0)
            u = np.where(go_right, u - left, u)
            node = left_child + go_right
        return node - self.num_leaves, tree[node] / total

    def bulk_load(self, slots: np.ndarray, priorities: np.ndarray, seqs: np.ndarray,
                  useqs: np.ndarray) -> None:
        for s in slots.tolist():
            self.live.insert(s, 0.0, 0, 0)
        leaves = np.zeros(self.num_leaves, np.float64)
        leaves[slots] = self._weight(priorities)
        self.tree[self.num_leaves:] = leaves
        for level in range(self.depth - 1, -1, -1):
            lo, hi = 1 << level, 1 << (level + 1)
            self.tree[lo:hi] = self.tree[2 * lo:2 * hi:2] + self.tree[2 * lo + 1:2 * hi:2]


class _OrderIndex(Index):
    """Fifo (oldest first) or Lifo (newest first) by insertion sequence number."""

    def __init__(self, capacity: int, newest_first: bool):
        self.newest_first = newest_first
        self.seq_of = np.full(capacity, -1, np.int64)
        self.entries: collections.deque[tuple[int, int]] = collections.deque()  # (seq, slot)
        self.size = 0

    def insert(self, slot: int, priority: float, seq: int, useq: int) -> None:
        self.seq_of[slot] = seq
        self.entries.append((seq, slot))
        self.size += 1

    def remove(self, slot: int) -> None:
        # Lazy deletion: the entry stays until it reaches an end, or a compaction drops it.
        self.seq_of[slot] = -1
        self.size -= 1
        if len(self.entries) > 2 * self.size + 64:
            live = [(q, s) for q, s in self.entries if self.seq_of[s] == q]
            self.entries = collections.deque(live)

    def _peek(self) -> int:
        entries = self.entries
        while True:
            seq, slot = entries[-1] if self.newest_first else entries[0]
            if self.seq_of[slot] == seq:
                return slot
            if self.newest_first:
                entries.pop()
            else:
                entries.popleft()

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        return np.full(n, self._peek(), np.int64), np.ones(n)

    def bulk_load(self, slots: np.ndarray, priorities: np.ndarray, seqs: np.ndarray,
                  useqs: np.ndarray) -> None:
        order = np.argsort(seqs, kind="stable")
        for s, q in zip(slots[order].tolist(), seqs[order].tolist(), strict=True):
            self.insert(s, 0.0, q, 0)


class _HeapIndex(Index):
    """Max- or min-heap on priority; ties go to the smallest `useq` (least recently inserted or
    updated). Updates push a fresh entry; stale entries are skipped when they surface."""

    def __init__(self, capacity: int, largest_first: bool):
        self.sign = -1.0 if largest_first else 1.0
        self.current: dict[int, tuple[float, int]] = {}
        self.heap: list[tuple[float, int, int]] = []  # (sign * priority, useq, slot)

    def insert(self, slot: int, priority: float, seq: int, useq: int) -> None:
        self.update(slot, priority, useq)

    def update(self, slot: int, priority: float, useq: int) -> None:
        key = (self.sign * float(priority), int(useq))
        self.current[slot] = key
        heapq.heappush(self.heap, (key[0], key[1], slot))
        if len(self.heap) > 2 * len(self.current) + 64:
            self.heap = [(k[0], k[1], s) for s, k in self.current.items()]
            heapq.heapify(self.heap)

    def remove(self, slot: int) -> None:
        del self.current[slot]

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        heap = self.heap
        while True:
            p, useq, slot = heap[0]
            if self.current.get(slot) == (p, useq):
                return np.full(n, slot, np.int64), np.ones(n)
            heapq.heappop(heap)


def make_index(selector: spec_lib.Selector, capacity: int) -> Index:
    """The index implementing `selector` for a table of `capacity` slots."""
    if isinstance(selector, spec_lib.Uniform):
        return UniformIndex(capacity)
    if isinstance(selector, spec_lib.Prioritized):
        return PrioritizedIndex(capacity, selector.priority_exponent)
    if isinstance(selector, spec_lib.Fifo):
        return _OrderIndex(capacity, newest_first=False)
    if isinstance(selector, spec_lib.Lifo):
        return _OrderIndex(capacity, newest_first=True)
    if isinstance(selector, spec_lib.MaxHeap):
        return _HeapIndex(capacity, largest_first=True)
    if isinstance(selector, spec_lib.MinHeap):
        return _HeapIndex(capacity, largest_first=False)
    raise ValueError(f"unsupported selector {selector!r}")
