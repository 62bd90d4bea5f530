"""Replay as a program node: tables served over the program's RPC, on either backend.

In `local_mt` a client of the node calls the tables in-process (no copy); in `local_mp` the
same calls go over loopback RPC. The node's public methods are the client API; wrap the
node's client in `ReplayClient` to get the tables' own exceptions back from remote calls.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from trellis.reverb_tables import errors
from trellis.reverb_tables import spec as spec_lib
from trellis.reverb_tables.client import make_client


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

    def pid(self) -> int:
        return os.getpid()

    def table_names(self) -> list[str]:
        return list(self._client.table_names)

    def insert(self, data: Any, priorities: Mapping[str, float], timeout_s: float | None = None):
        return self._client.insert(data, priorities, timeout_s=timeout_s)

    def sample(self, table: str, batch_size: int, timeout_s: float | None = None):
        """A `SampleBatch`, or on a rate-limiter timeout a `SampleTimeout` (see ReplayClient)."""
        try:
            return self._client.sample(table, batch_size, timeout_s=timeout_s)
        except errors.RateLimiterTimeout as e:
            # Items taken before the deadline count as sampled (a queue has dropped them):
            # they must reach the caller, and an RPC error carries only text.
            return SampleTimeout(str(e), table, e.partial)

    def update_priorities(self, table: str, updates: Mapping[int, float]):
        return self._client.update_priorities(table, updates)

    def delete(self, table: str, keys: Iterable[int]):
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
        self._client.close()

    def _native(self, operation: str):
        if not hasattr(self._client, "checkpoint"):
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


# The replay errors a caller may handle; any other remote error stays a launch RemoteError.
_ERRORS = {cls.__name__: cls for cls in (errors.TableClosedError, errors.UnknownTableError,
                                         errors.SignatureError)}


class ReplayClient:
    """The client API of a `ReplayNode`, given the node's RPC client (a dereferenced handle).

    Calls go to the node unchanged; a replay error raised on the node comes back as the same
    exception type (`RateLimiterTimeout`, `TableClosedError`, ...) rather than as the
    platform's generic remote error, so callers handle timeouts the same way in-process and
    across processes. A node that has died raises `ConnectionError` naming it.
    """

    def __init__(self, node: Any):
        self._node = node

    def _call(self, method: str, *args, **kwargs):
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
        return self._call("table_names")

    def insert(self, data: Any, priorities: Mapping[str, float], timeout_s: float | None = None):
        return self._call("insert", data, priorities, timeout_s=timeout_s)

    def sample(self, table: str, batch_size: int, timeout_s: float | None = None):
        result = self._call("sample", table, batch_size, timeout_s=timeout_s)
        if isinstance(result, SampleTimeout):
            raise errors.RateLimiterTimeout(result.message, table=result.table,
                                            operation="sample", partial=result.partial)
        return result

    def update_priorities(self, table: str, updates: Mapping[int, float]):
        return self._call("update_priorities", table, updates)

    def delete(self, table: str, keys: Iterable[int]):
        return self._call("delete", table, keys)

    def info(self, table: str) -> dict[str, Any]:
        return self._call("info", table)

    def checkpoint(self, directory: str) -> str:
        return self._call("checkpoint", directory)

    def restore(self, directory: str) -> None:
        self._call("restore", directory)
