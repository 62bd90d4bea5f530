"""Replay as a program node: tables served over the program's RPC, on either backend.

In `local_mt` a client of the node calls the tables in-process (no copy); in `local_mp` the
same calls go over loopback RPC. The node's public methods are the client API; wrap the
node's client in `ReplayClient` to get the tables' own exceptions back from remote calls and
sampled batches through shared memory when the node is on the same host
(`shared_batches`), and write through a `StreamingWriter` to insert without waiting for each
insert's round trip.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from trellis.reverb_tables import errors
from trellis.reverb_tables import shared_batches as shared
from trellis.reverb_tables import spec as spec_lib
from trellis.reverb_tables import tree as tree_lib
from trellis.reverb_tables.client import make_client
from trellis.reverb_tables.native import NativeClient
from trellis.reverb_tables.types import SampleBatch


class ReplayNode:
    """Service node holding replay tables; add with `launch.CourierNode(ReplayNode, specs)`.

    Args:
        tables: the table specs.
        backend: "native" (default) or "reverb".
        seed: seeds the native tables' samplers.
    """

    def __init__(self, tables: Sequence[spec_lib.TableSpec], backend: str = "native",
                 seed: int | None = None):
        self._client = make_client(tables, backend, seed=seed)
        # Native tables with a signature sample straight into a client's shared segment.
        self._signatures = {t.name: tree_lib.flatten(t.signature)[0] for t in tables
                            if backend == "native" and t.signature is not None}
        self._segments = shared.NodeSegments()

    def pid(self) -> int:
        return os.getpid()

    def table_names(self) -> list[str]:
        return list(self._client.table_names)

    def insert(self, data: Any, priorities: Mapping[str, float], timeout_s: float | None = None
               ) -> int | None:
        return self._client.insert(data, priorities, timeout_s=timeout_s)

    def insert_many(self, items: Sequence[tuple[Any, Mapping[str, float], float | None]]
                    ) -> InsertFailure | None:
        """Inserts (data, priorities, timeout_s) items in order, up to the first that fails.

        Returns:
          None when all were inserted; else an `InsertFailure` naming the first that failed
          (the ones before it are in, the ones after it were not tried).
        """
        for index, (data, priorities, timeout_s) in enumerate(items):
            try:
                self._client.insert(data, priorities, timeout_s=timeout_s)
            except Exception as e:
                # An RPC error carries only text: the type and the position travel as data.
                return InsertFailure(index, type(e).__name__, str(e),
                                     ",".join(sorted(priorities)))
        return None

    def sample(self, table: str, batch_size: int, timeout_s: float | None = None
               ) -> SampleBatch | SampleTimeout:
        """A `SampleBatch`, or on a rate-limiter timeout a `SampleTimeout` (see ReplayClient)."""
        return self._sample(table, batch_size, timeout_s)

    def _sample(self, table: str, batch_size: int, timeout_s: float | None,
                out: list[np.ndarray] | None = None) -> SampleBatch | SampleTimeout:
        try:
            if out is None:
                return self._client.sample(table, batch_size, timeout_s=timeout_s)
            # `out` is only made for native tables (`_signatures`).
            return self._native("sample into shared memory").sample(
                table, batch_size, timeout_s=timeout_s, out=out)
        except errors.RateLimiterTimeout as e:
            # Items taken before the deadline count as sampled (a queue has dropped them):
            # they must reach the caller, and an RPC error carries only text.
            return SampleTimeout(str(e), table, e.partial)

    def shared_memory_address(self, nbytes: int) -> str | None:
        """Where a client on this host hands over its segments of `nbytes` (see `sample_shared`).

        None where this node has no shared memory (not Linux, or closing). Like every shared
        sample, the call also unmaps the segments of clients that closed them or died.
        """
        return self._segments.address(nbytes)

    def sample_shared(self, table: str, batch_size: int, nbytes: int, token: bytes,
                      timeout_s: float | None = None
                      ) -> shared.SharedSample | shared.Unshared | SampleTimeout:
        """`sample`, writing the batch into the caller's segment `token` of `nbytes`.

        Returns:
          The batch's `SharedSample` header; or `Unshared` with the whole batch when it does not
          fit that segment or the node has no such segment; or a `SampleTimeout`.
        """
        buffer = self._segments.lend(nbytes, token)
        out = None
        if buffer is not None and table in self._signatures:
            leaves = [((batch_size, *s.shape), s.dtype) for s in self._signatures[table]]
            offsets, size = shared.leaf_layout(leaves)
            if size == nbytes:
                out = shared.segment_views(buffer, offsets, leaves)
        result = self._sample(table, batch_size, timeout_s, out)
        if isinstance(result, SampleTimeout):
            return result
        if buffer is None:
            return shared.Unshared(result, "the replay node has no such segment")
        return shared.share(result, buffer, in_place=out is not None)

    def update_priorities(self, table: str, updates: Mapping[int, float]) -> int | None:
        return self._client.update_priorities(table, updates)

    def delete(self, table: str, keys: Iterable[int]) -> int | None:
        return self._client.delete(table, keys)

    def info(self, table: str) -> dict[str, Any]:
        return self._client.info(table)

    def checkpoint(self, directory: str) -> str:
        """Writes every table to `directory` (on this node's host); returns the path."""
        return self._native("checkpoint").checkpoint(directory)

    def restore(self, directory: str) -> None:
        """Replaces every table's state with the checkpoint in `directory`."""
        self._native("restore").restore(directory)

    def close(self) -> None:
        self._segments.close()
        self._client.close()

    def _native(self, operation: str) -> NativeClient:
        if not isinstance(self._client, NativeClient):
            raise NotImplementedError(
                f"{operation}: replay checkpoints are the native backend's; with dm-reverb use "
                f"Reverb's own checkpointer")
        return self._client


@dataclasses.dataclass(frozen=True)
class SampleTimeout:
    """What `ReplayNode.sample` returns when the rate limiter did not admit the whole batch."""

    message: str
    table: str
    partial: Any


@dataclasses.dataclass(frozen=True)
class InsertFailure:
    """What `ReplayNode.insert_many` returns when item `index` failed (the rest not tried)."""

    index: int
    error_type: str
    message: str
    tables: str


# The replay errors a caller may handle; any other remote error stays a launch RemoteError.
_ERRORS = {cls.__name__: cls for cls in (errors.TableClosedError, errors.UnknownTableError,
                                         errors.SignatureError)}


class ReplayClient:
    """The client API of a `ReplayNode`, given the node's RPC client (a dereferenced handle).

    Calls go to the node unchanged; a replay error raised on the node comes back as the same
    exception type (`RateLimiterTimeout`, `TableClosedError`, ...) rather than as the
    platform's generic remote error, so callers handle timeouts the same way in-process and
    across processes. A node that has died raises `ConnectionError` naming it.

    When the node runs in another process on this host, sampled batches of at least
    `shared_memory_min_bytes` come through shared memory (the first batch of each table and
    batch size comes over the socket, and tells the size): their arrays are views of a segment
    that is not written again while any of them is alive. Smaller batches, batches from a node
    on another host, and batches where shared memory cannot be had (said once on stderr) come
    over the socket.

    Args:
      node: the node's client (a dereferenced handle) or a `ReplayNode`.
      shared_memory_min_bytes: the smallest batch that goes through shared memory; None: none
        does. Below the default a segment's bookkeeping costs about what the socket's copy
        does (CartPole-size batches of 15 KB sample at the same rate either way).
    """

    def __init__(self, node: Any, shared_memory_min_bytes: int | None = 256 * 1024):
        self._node = node
        self._shared_memory = shared_memory_min_bytes is not None
        self._min_bytes = shared_memory_min_bytes or 0
        self._segments: shared.ClientSegments | None = None
        self._segments_lock = threading.Lock()

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return getattr(self._node, method)(*args, **kwargs)
        except Exception as e:
            remote_type = getattr(e, "remote_type", None)
            if remote_type == "RateLimiterTimeout":  # Only inserts time out remotely.
                raise errors.RateLimiterTimeout(
                    str(e), table=",".join(sorted(args[1])), operation=method) from e
            if remote_type in _ERRORS:
                raise _ERRORS[remote_type](str(e)) from e
            raise

    @property
    def table_names(self) -> list[str]:
        names: list[str] = self._call("table_names")
        return names

    def insert(self, data: Any, priorities: Mapping[str, float], timeout_s: float | None = None
               ) -> int | None:
        key: int | None = self._call("insert", data, priorities, timeout_s=timeout_s)
        return key

    def sample(self, table: str, batch_size: int, timeout_s: float | None = None
               ) -> SampleBatch:
        segments = self._client_segments()
        nbytes = None if segments is None else segments.expected(table, batch_size)
        segment = None if segments is None or nbytes is None else segments.take(nbytes)
        result: SampleBatch | SampleTimeout
        if segments is None or nbytes is None or segment is None:
            result = self._call("sample", table, batch_size, timeout_s=timeout_s)
        else:
            try:
                reply: shared.SharedSample | shared.Unshared | SampleTimeout = self._call(
                    "sample_shared", table, batch_size, nbytes, segment.token,
                    timeout_s=timeout_s)
            except BaseException:
                segments.discard(segment)
                raise
            if isinstance(reply, shared.SharedSample):
                return segments.read(segment, reply)
            segments.give_back(segment)
            if isinstance(reply, shared.Unshared):
                if reply.reason is not None:
                    segments.disable(reply.reason)
                result = reply.batch
            else:
                result = reply
        if isinstance(result, SampleTimeout):
            raise errors.RateLimiterTimeout(result.message, table=result.table,
                                            operation="sample", partial=result.partial)
        if segments is not None:
            segments.learn(table, batch_size, result)
        return result

    def _client_segments(self) -> shared.ClientSegments | None:
        """The shared-memory segments for this node; None when it shares this process."""
        if not self._shared_memory:
            return None
        with self._segments_lock:
            if self._segments is None:
                if self._call("pid") == os.getpid():  # In-process: batches are not copied.
                    self._shared_memory = False
                    return None
                self._segments = shared.ClientSegments(
                    lambda nbytes: self._call("shared_memory_address", nbytes), self._min_bytes)
            return self._segments

    def insert_many(self, items: Sequence[tuple[Any, Mapping[str, float], float | None]]
                    ) -> None:
        """Inserts (data, priorities, timeout_s) items in order in one call.

        Raises:
          The first failed insert's error (its type as for `insert`), saying how many of
          `items` went in; the items after it were not inserted.
        """
        failure = self._call("insert_many", list(items))
        if failure is None:
            return
        message = (f"{failure.message} (insert {failure.index + 1} of {len(items)} in one "
                   f"batch: the {failure.index} before it went in, the "
                   f"{len(items) - failure.index - 1} after it were not inserted)")
        if failure.error_type == "RateLimiterTimeout":
            raise errors.RateLimiterTimeout(message, table=failure.tables, operation="insert")
        raise _ERRORS.get(failure.error_type, RuntimeError)(message)

    def update_priorities(self, table: str, updates: Mapping[int, float]) -> int | None:
        updated: int | None = self._call("update_priorities", table, updates)
        return updated

    def delete(self, table: str, keys: Iterable[int]) -> int | None:
        deleted: int | None = self._call("delete", table, keys)
        return deleted

    def info(self, table: str) -> dict[str, Any]:
        info: dict[str, Any] = self._call("info", table)
        return info

    def checkpoint(self, directory: str) -> str:
        path: str = self._call("checkpoint", directory)
        return path

    def restore(self, directory: str) -> None:
        self._call("restore", directory)

    def close(self) -> None:
        """Gives back this client's shared-memory segments; batches already sampled stay valid."""
        with self._segments_lock:
            if self._segments is not None:
                self._segments.close()


class StreamingWriter:
    """Inserts into a replay node without waiting for each insert's round trip.

    `insert` queues the item and returns; a background thread sends whatever has queued up
    since its last call as one `insert_many` call, so inserts reach the node in order, many
    per round trip, while the writer goes on. At most `max_in_flight` inserts are queued or
    being sent; `insert` blocks beyond that (back-pressure).

    An insert that fails raises its error, with the same type as `ReplayClient.insert`, from
    the writer's next `insert` or `flush`, in the order they failed; the inserts queued behind
    it are dropped (the error says how many). `flush` waits until the node has confirmed
    every insert; `close` flushes and ends the thread.

    Args:
      client: a `ReplayClient` (of a node in this process or another).
      max_in_flight: inserts queued or being sent at most.
    """

    def __init__(self, client: ReplayClient, max_in_flight: int = 256):
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")
        self._client = client
        self._max_in_flight = max_in_flight
        self._changed = threading.Condition()
        self._queued: list[tuple[Any, Mapping[str, float], float | None]] = []
        self._in_flight = 0
        self._errors: list[BaseException] = []
        self._closed = False
        # A daemon: a writer never closed must not keep the interpreter from exiting; its
        # thread only does socket I/O, so ending it at exit is harmless.
        self._thread = threading.Thread(target=self._send_loop, name="replay-writer",
                                        daemon=True)
        self._thread.start()

    def insert(self, data: Any, priorities: Mapping[str, float],
               timeout_s: float | None = None) -> None:
        """Queues one insert (as `ReplayClient.insert`); raises an earlier insert's error."""
        with self._changed:
            self._raise_error()
            while self._in_flight >= self._max_in_flight:
                self._changed.wait()
                self._raise_error()
            if self._closed:
                raise errors.TableClosedError("the writer is closed")
            self._queued.append((data, dict(priorities), timeout_s))
            self._in_flight += 1
            self._changed.notify_all()

    def flush(self) -> None:
        """Waits until every queued insert is confirmed; raises the first error not raised yet."""
        with self._changed:
            while self._in_flight:
                self._changed.wait()
            self._raise_error()

    def close(self) -> None:
        """Flushes, then ends the background thread."""
        try:
            self.flush()
        finally:
            with self._changed:
                self._closed = True
                self._changed.notify_all()
            self._thread.join()

    def _raise_error(self) -> None:
        if self._errors:
            raise self._errors.pop(0)

    def _send_loop(self) -> None:
        while True:
            with self._changed:
                while not self._queued and not self._closed:
                    self._changed.wait()
                if not self._queued:
                    return
                batch, self._queued = self._queued, []
            error: BaseException | None = None
            try:
                self._client.insert_many(batch)
            except Exception as e:  # Raised to the writer, in order, by its next call.
                error = e
            with self._changed:
                self._in_flight -= len(batch)
                if error is not None:
                    # What queued behind the failed insert is dropped: nothing after a failure
                    # goes in unseen by the writer.
                    if self._queued and sys.version_info >= (3, 11):  # add_note: 3.11
                        error.add_note(f"{len(self._queued)} inserts queued after it were "
                                       "dropped")
                    self._in_flight -= len(self._queued)
                    self._queued = []
                    self._errors.append(error)
                self._changed.notify_all()
