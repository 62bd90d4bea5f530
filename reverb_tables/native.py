"""The native backend's client: in-process tables served by name, with a Reverb client's API.

`NativeClient` serves several `Table`s (table.py) by name: insert into several tables at once,
sample, update priorities, delete, info, and checkpoint / restore (a consistent cut of every
table, in the format of `_checkpoint`).
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from trellis.reverb_tables import _checkpoint
from trellis.reverb_tables import spec as spec_lib
from trellis.reverb_tables.checks import check_priority, check_timeout
from trellis.reverb_tables.errors import UnknownTableError
from trellis.reverb_tables.table import Table
from trellis.reverb_tables.types import SampleBatch


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

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------- checkpoints
    def checkpoint(self, directory: str | os.PathLike[str]) -> str:
        """Writes every table to `directory`, atomically (layout: `_checkpoint`).

        All tables are locked while their state is copied (a consistent cut, as Reverb blocks
        the server while checkpointing); files are written after the locks are released, to a
        temporary sibling directory that then replaces `directory`.

        Returns:
            The absolute path of the checkpoint directory.
        """
        directory = os.path.abspath(os.fspath(directory))
        tables = [self._tables[n] for n in sorted(self._tables)]
        with contextlib.ExitStack() as stack:
            for t in tables:
                stack.enter_context(t._cond)
            snapshots = [(t.name, t._snapshot()) for t in tables]
        _checkpoint.write(directory, snapshots)
        return directory

    def restore(self, directory: str | os.PathLike[str]) -> None:
        """Replaces the state of every table with a checkpoint written by `checkpoint`.

        The checkpoint must hold exactly this client's tables, with the same specs. Everything is
        read and checked before any table changes. Restores items, keys, priorities,
        times_sampled, insertion order, free slots, counters and random generator states, so a
        restored client samples exactly as the original would have.

        Raises:
            FileNotFoundError: no checkpoint in `directory`.
            ValueError: the checkpoint does not match the tables (nothing is changed).
        """
        loaded = _checkpoint.read(os.fspath(directory), list(self._tables))
        for name, snapshot in loaded.items():
            self._tables[name]._check_snapshot(*snapshot)
        tables = [self._tables[n] for n in sorted(self._tables)]
        with contextlib.ExitStack() as stack:
            for t in tables:
                stack.enter_context(t._cond)
            for t in tables:
                t._load_snapshot(*loaded[t.name])
