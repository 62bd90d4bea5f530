"""Replay as a program node: tables served over the program's RPC, on either backend.

In `local_mt` a client of the node calls the tables in-process (no copy); in `local_mp` the
same calls go over loopback RPC. The node's public methods are the client API.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from reverb_tables import spec as spec_lib
from reverb_tables.client import make_client


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

    def table_names(self) -> list[str]:
        return list(self._client.table_names)

    def insert(self, data: Any, priorities: Mapping[str, float], timeout_s: float | None = None):
        return self._client.insert(data, priorities, timeout_s=timeout_s)

    def sample(self, table: str, batch_size: int, timeout_s: float | None = None):
        return self._client.sample(table, batch_size, timeout_s=timeout_s)

    def update_priorities(self, table: str, updates: Mapping[int, float]):
        return self._client.update_priorities(table, updates)

    def delete(self, table: str, keys: Iterable[int]):
        return self._client.delete(table, keys)

    def info(self, table: str) -> dict[str, Any]:
        return self._client.info(table)

    def close(self) -> None:
        self._client.close()
