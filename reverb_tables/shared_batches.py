"""Sampled batches through shared memory, between a replay node and a client on one host.

The client owns the memory: it creates a segment (an anonymous memfd of one batch's bytes,
`launch.shm.connect`) and hands it to the node's hub for that size. A sample call then names a
free segment; the node samples into it (a native table with a signature gathers the items
straight into it; otherwise the sampled batch is copied in) and replies with a small
`SharedSample` header (each leaf's offset, shape and dtype, plus the keys and priorities), and
the client returns arrays that are views of the segment. An Atari batch (18 MB) thus crosses
no socket and lands in no fresh memory.

Why these choices:
- A segment serves one call at a time and then belongs to the batch it holds: it goes back to
  the client's free list only when every array of that batch is gone (a finalizer on the
  batch's base array). So the node never writes into memory a caller can still read, and
  callers may keep batches as long as they like, as with the socket path.
- The client owns its segments: when it dies, its end of each segment's channel closes and the
  node drops its mappings at its next call; the node keeps no leases of its own. memfd: no name
  in /dev/shm, nothing outlives the processes that map it, even after kill -9.
- Where a segment cannot be had (the node is on another host or in another network namespace,
  no memfd, not enough memory), the client says so in one line and samples over the socket.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import secrets
import sys
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from trellis.launch.runtime import shm
from trellis.reverb_tables import tree as tree_lib
from trellis.reverb_tables.types import SampleBatch

_FIELD = "batch"
_ALIGN = 64  # Each leaf starts on a cache line (and at any dtype's alignment).
# Free segments kept per size: a learner holds one or two batches at a time; more free ones
# than this after a burst of held batches are closed, not kept.
_MAX_FREE = 4


def _layout(nbytes: int) -> shm.Layout:
    return {_FIELD: ((nbytes,), "uint8")}


Leaves = Sequence[tuple[tuple[int, ...], np.dtype]]  # (shape, dtype) of each leaf


def _nbytes(shape: tuple[int, ...], dtype: np.dtype) -> int:
    return math.prod(shape) * dtype.itemsize


def leaf_layout(leaves: Leaves) -> tuple[list[int], int]:
    """Where each leaf starts in a segment, and the segment's size."""
    offsets, end = [], 0
    for shape, dtype in leaves:
        offsets.append(end)
        end += -(-_nbytes(shape, dtype) // _ALIGN) * _ALIGN
    return offsets, max(end, _ALIGN)


def batch_layout(data: Any) -> tuple[list[int], int] | None:
    """`leaf_layout` of `data`'s leaves; None if not sharable (only plain numpy arrays are)."""
    leaves = tree_lib.flatten(data)[0]
    if not all(isinstance(a, np.ndarray) and not a.dtype.hasobject for a in leaves):
        return None
    return leaf_layout([(a.shape, a.dtype) for a in leaves])


def segment_views(buffer: np.ndarray, offsets: Sequence[int], leaves: Leaves
                  ) -> list[np.ndarray]:
    """The leaves as arrays living in `buffer` (a segment's bytes) at `offsets`."""
    return [buffer[o:o + _nbytes(shape, dtype)].view(dtype).reshape(shape)
            for o, (shape, dtype) in zip(offsets, leaves, strict=True)]


@dataclasses.dataclass(frozen=True)
class SharedSample:
    """The reply to a shared sample: where each leaf lies in the segment, and the small fields."""

    treedef: tree_lib.TreeDef
    leaves: tuple[tuple[int, tuple[int, ...], np.dtype], ...]  # (offset, shape, dtype) per leaf
    keys: np.ndarray
    probabilities: np.ndarray
    priorities: np.ndarray
    times_sampled: np.ndarray
    table_size: np.ndarray


@dataclasses.dataclass(frozen=True)
class Unshared:
    """The reply when the batch could not go through the named segment: it comes in full.

    `reason` is None when the batch did not fit the segment (its size changed, or it holds
    objects); otherwise it says why the node has no such segment.
    """

    batch: SampleBatch
    reason: str | None


class NodeSegments:
    """The node's side: one hub per segment size; writes batches into the clients' segments."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # Hubs are not thread-safe; RPCs come on many threads.
        self._hubs: dict[int, shm.Hub] = {}
        self._closed = False

    def address(self, nbytes: int) -> str | None:
        """The address where clients hand over segments of `nbytes`; None: no shared memory here."""
        if not shm.available() or self._closed:
            return None
        with self._lock:
            self._poll()
            hub = self._hubs.get(nbytes)
            if hub is None:
                hub = self._hubs[nbytes] = shm.Hub(_layout(nbytes))
            return hub.address

    def lend(self, nbytes: int, token: bytes) -> np.ndarray | None:
        """The bytes of the client's segment `token` of `nbytes`; None if there is none.

        The client waits in the call that asked for it and reads it only after that call.
        """
        with self._lock:
            self._poll()
            channel = self._find(nbytes, token)
        return None if channel is None else channel.arrays[_FIELD]

    def _poll(self) -> None:
        """Accepts new segments and drops those whose client closed them or died (lock held)."""
        for hub in self._hubs.values():
            hub.poll(0.0)

    def _find(self, nbytes: int, token: bytes) -> shm.Channel | None:
        hub = self._hubs.get(nbytes)
        if hub is None:
            return None
        while True:
            for channel in hub.channels:
                if channel.hello == token:
                    return channel
            # The client handed it over before calling, so it waits to be accepted; one is
            # accepted per poll.
            known = set(map(id, hub.channels))
            hub.poll(0.0)
            if all(id(c) in known for c in hub.channels):
                return None

    def close(self) -> None:
        """Closes every hub (and so every segment's channel); later writes send batches whole."""
        with self._lock:
            self._closed = True
            for hub in self._hubs.values():
                hub.close()
            self._hubs.clear()


def share(batch: SampleBatch, buffer: np.ndarray, in_place: bool) -> SharedSample | Unshared:
    """The header of `batch` in the segment `buffer`, copying its leaves in unless `in_place`.

    `Unshared` with the batch when it does not fit (its size changed, or it holds objects).
    """
    layout = batch_layout(batch.data)
    if layout is None or layout[1] != len(buffer):
        return Unshared(batch, None)
    leaves, treedef = tree_lib.flatten(batch.data)
    if not in_place:
        views = segment_views(buffer, layout[0], [(a.shape, a.dtype) for a in leaves])
        for dest, leaf in zip(views, leaves, strict=True):
            dest[...] = leaf
    return SharedSample(
        treedef, tuple((o, a.shape, a.dtype) for o, a in zip(layout[0], leaves, strict=True)),
        batch.keys, batch.probabilities, batch.priorities, batch.times_sampled,
        batch.table_size)


@dataclasses.dataclass(eq=False)
class _Segment:
    channel: shm.Channel
    token: bytes
    nbytes: int


class ClientSegments:
    """A client's segments for one replay node, lent to one call and then to its batch.

    Args:
      address: `ReplayNode.shared_memory_address` of the node (an RPC).
      min_bytes: smaller batches come over the socket.
    """

    def __init__(self, address: Callable[[int], str | None], min_bytes: int = 0):
        self._address = address
        self._min_bytes = min_bytes
        self._lock = threading.Lock()
        self._free: dict[int, list[_Segment]] = {}  # nbytes -> free segments (lock held)
        # Segments whose batch is gone. Their finalizers only append here, without the lock:
        # a finalizer may run inside any code of any thread, this client's locked code too.
        self._returned: collections.deque[_Segment] = collections.deque()
        self._sizes: dict[tuple[str, int], int | None] = {}
        self._closed = False
        self.fallback: str | None = None  # Why batches come over the socket, once they do.

    def expected(self, table: str, batch_size: int) -> int | None:
        """The segment size for a (table, batch_size) batch; None: it comes over the socket.

        None until a batch of that table and size has been seen.
        """
        return self._sizes.get((table, batch_size))

    def learn(self, table: str, batch_size: int, batch: SampleBatch) -> None:
        """Records the size of segment that batches like `batch` need (None: too small)."""
        layout = batch_layout(batch.data)
        self._sizes[(table, batch_size)] = (
            None if layout is None or layout[1] < self._min_bytes else layout[1])

    def take(self, nbytes: int) -> _Segment | None:
        """A free segment of `nbytes`, or a new one; None once shared memory cannot be had."""
        if self._done:
            return None
        with self._lock:
            while self._returned:
                self._keep(self._returned.popleft())
            if self._free.get(nbytes):
                return self._free[nbytes].pop()
        return self._create(nbytes)

    @property
    def _done(self) -> bool:
        return self._closed or self.fallback is not None

    def _create(self, nbytes: int) -> _Segment | None:
        try:
            address = self._address(nbytes)
            if address is None:
                raise OSError("no memfd on its platform, or it is closing")
            token = secrets.token_bytes(16)
            channel = shm.connect(address, _layout(nbytes), token)
        except OSError as e:  # Another host, another network namespace, not enough memory.
            self.disable(str(e))
            return None
        return _Segment(channel, token, nbytes)

    def _keep(self, segment: _Segment) -> None:
        """Puts a segment on the free list, or closes it (lock held)."""
        free = self._free.setdefault(segment.nbytes, [])
        if self._done or len(free) >= _MAX_FREE:
            segment.channel.close()
        else:
            free.append(segment)

    def give_back(self, segment: _Segment) -> None:
        """Returns a segment that the node did not write into."""
        with self._lock:
            self._keep(segment)

    def discard(self, segment: _Segment) -> None:
        """Closes a segment whose call failed: the node might still be writing into it."""
        segment.channel.close()

    def read(self, segment: _Segment, header: SharedSample) -> SampleBatch:
        """The batch the node wrote into `segment`: views of it, which keep it lent until gone."""
        # The one base array of this batch's views (numpy collapses views onto it, as its own
        # base is not an array): when it is collected, no array of the batch is left.
        # numpy's stubs give ndarray `__buffer__` (typing's Buffer) from Python 3.12 only.
        base = np.frombuffer(memoryview(segment.channel.arrays[_FIELD]),  # type: ignore[arg-type]
                             np.uint8)
        weakref.finalize(base, self._release, segment).atexit = False
        leaves = segment_views(base, [o for o, _, _ in header.leaves],
                               [(shape, dtype) for _, shape, dtype in header.leaves])
        return SampleBatch(data=tree_lib.unflatten(header.treedef, leaves), keys=header.keys,
                           probabilities=header.probabilities, priorities=header.priorities,
                           times_sampled=header.times_sampled, table_size=header.table_size)

    def _release(self, segment: _Segment) -> None:
        """A batch's finalizer: its segment may be lent again (or closed, once done)."""
        self._returned.append(segment)
        if self._done:
            self._close_returned()

    def _close_returned(self) -> None:
        while True:
            try:
                self._returned.popleft().channel.close()
            except IndexError:
                return

    def disable(self, reason: str) -> None:
        """From now on batches come over the socket; says so once, in one line."""
        with self._lock:
            if self.fallback is not None:
                return
            self.fallback = reason
        print(f"replay client: no shared memory with the replay node ({reason}); sampled "
              f"batches come over the socket", file=sys.stderr, flush=True)
        self._close_free()

    def close(self) -> None:
        """Closes the free segments; those held by batches close when the batches are gone."""
        self._closed = True
        self._close_free()

    def _close_free(self) -> None:
        self._close_returned()
        with self._lock:
            for free in self._free.values():
                for segment in free:
                    segment.channel.close()
            self._free.clear()
