"""The dm-reverb backend: the same specs and client API, served by a real `reverb.Server`.

Only importable where dm-reverb is installed (`make test-reverb` builds that environment:
Python 3.11, tensorflow-cpu 2.15, dm-reverb 0.14, numpy < 2). Differences from the native
backend, all inherent to dm-reverb:

- `insert` returns None, and `update_priorities` / `delete` return None: Reverb's writer
  makes item keys without reporting them (keys come back with samples) and reports no
  counts for mutations.
- Calls with a timeout first wait, polling the server's rate-limiter counters, until the
  call is admitted (Reverb's Python client has no sample timeout, and an insert cannot be
  withdrawn once sent); the limiter rules are `spec.insert_admitted` / `samples_admitted`.
- `info` has the counters both backends share (size, inserts, samples, deletes, limiter
  parameters); the native backend adds evicted / expired / deleted / updates / waiting calls.
- No `checkpoint` / `restore`: checkpoints are the native backend's; a dm-reverb user
  checkpoints with Reverb's own `reverb.Server(checkpointer=...)`.
"""

from __future__ import annotations

import math
import threading
import time
import types
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from trellis.reverb_tables import spec as spec_lib
from trellis.reverb_tables import tree as tree_lib
from trellis.reverb_tables.checks import DataChecker, check_priority, check_timeout
from trellis.reverb_tables.errors import (
    RateLimiterTimeout,
    TableClosedError,
    UnknownTableError,
)
from trellis.reverb_tables.types import SampleBatch

_POLL_S = 0.002
_DBL_MAX = float(np.finfo(np.float64).max)


# dm-reverb and TensorFlow have no annotations here (nor in this venv): their objects are Any.
def _selector(reverb: types.ModuleType, selector: spec_lib.Selector) -> Any:
    kinds = {
        spec_lib.Uniform: lambda s: reverb.selectors.Uniform(),
        spec_lib.Prioritized: lambda s: reverb.selectors.Prioritized(s.priority_exponent),
        spec_lib.Fifo: lambda s: reverb.selectors.Fifo(),
        spec_lib.Lifo: lambda s: reverb.selectors.Lifo(),
        spec_lib.MaxHeap: lambda s: reverb.selectors.MaxHeap(),
        spec_lib.MinHeap: lambda s: reverb.selectors.MinHeap(),
    }
    return kinds[type(selector)](selector)


def _signature(tf: types.ModuleType, signature: Any) -> Any:
    if signature is None:
        return None
    return tree_lib.map_leaves(lambda s: tf.TensorSpec(s.shape, tf.as_dtype(s.dtype)), signature)


def _finite(x: float) -> float:
    # Reverb's limiter takes +-DBL_MAX where ours says +-inf.
    return float(np.clip(x, -_DBL_MAX, _DBL_MAX))


def _infinite(x: float) -> float:
    return math.copysign(math.inf, x) if abs(x) >= _DBL_MAX else float(x)


class ReverbClient:
    """Tables served by an in-process `reverb.Server`, with the NativeClient API.

    Args:
        tables: the table specs (unique names).
        seed: unused (Reverb seeds its samplers itself); accepted for API parity.
        port: the server's port (default: a free one).
    """

    def __init__(self, tables: Sequence[spec_lib.TableSpec], *, seed: int | None = None,
                 port: int | None = None):
        import reverb
        import tensorflow as tf

        del seed
        self._reverb = reverb
        self._specs = {t.name: t for t in tables}
        reverb_tables = []
        for t in tables:
            params = t.rate_limiter.params()
            limiter = reverb.rate_limiters.RateLimiter(
                samples_per_insert=params["samples_per_insert"],
                min_size_to_sample=params["min_size_to_sample"],
                min_diff=_finite(params["min_diff"]),
                max_diff=_finite(params["max_diff"]),
            )
            reverb_tables.append(reverb.Table(
                name=t.name,
                sampler=_selector(reverb, t.sampler),
                remover=_selector(reverb, t.remover),
                max_size=t.max_size,
                rate_limiter=limiter,
                max_times_sampled=t.max_times_sampled,
                signature=_signature(tf, t.signature),
            ))
        self._checkers = {t.name: DataChecker(t) for t in tables}
        # Admission is checked, then acted on: these make the pair atomic for this client's
        # threads (every remote caller of a replay node goes through one client), so two
        # callers never both act on the same admitted room.
        self._insert_lock = threading.Lock()
        self._sample_lock = threading.Lock()
        # Reverb returns the leaves of signature-less items flat: their structure is kept here
        # (per table, from the latest insert through this client) to rebuild sampled data.
        self._treedefs: dict[str, Any] = {}
        self._server = reverb.Server(reverb_tables, port=port)
        self._client = reverb.Client(f"localhost:{self._server.port}")
        self._closed = False

    @property
    def table_names(self) -> list[str]:
        return list(self._specs)

    def _spec(self, name: str) -> spec_lib.TableSpec:
        if self._closed:
            raise TableClosedError(f"table {name!r}: the client is closed")
        try:
            return self._specs[name]
        except (KeyError, TypeError):
            raise UnknownTableError(
                f"unknown table {name!r}; this client serves {sorted(self._specs)}"
            ) from None

    def _limiter(self, name: str) -> tuple[spec_lib.RateLimiterSpec, int, int, int]:
        """The table's limiter and its counters (inserts, samples, deletes) on the server."""
        info = self.info(name)
        return (self._specs[name].rate_limiter, info["num_inserts"], info["num_samples"],
                info["num_deletes"])

    def _poll_or_raise(self, deadline: float | None, what: str, tables: list[str]) -> None:
        """Sleeps one poll interval, or raises RateLimiterTimeout once `deadline` has passed."""
        if deadline is not None and time.monotonic() >= deadline:
            state = "; ".join(
                f"table {t!r}: " + ", ".join(
                    f"{k}={v:g}" for k, v in self.info(t)["rate_limiter"].items())
                for t in tables)
            raise RateLimiterTimeout(
                f"timed out waiting for the rate limiter to admit {what}; {state}",
                table=",".join(tables), operation="insert" if "insert" in what else "sample")
        time.sleep(_POLL_S)

    def insert(self, data: Any, priorities: Mapping[str, float],
               timeout_s: float | None = None) -> None:
        """Inserts `data` as one item into each table of `priorities`; see NativeClient.

        The call first waits (polling the server's counters) until every table admits an
        insert, and sends nothing if the deadline passes or the client is closed meanwhile:
        an item handed to Reverb's writer cannot be withdrawn and would land later.
        """
        if not isinstance(priorities, Mapping) or not priorities:
            raise ValueError(
                f"priorities must be a non-empty {{table name: priority}} dict, got {priorities!r}"
            )
        checked, prepared = {}, {}
        for name, p in priorities.items():
            self._spec(name)
            prepared[name] = self._checkers[name].prepare(data)
            checked[name] = check_priority(p, name)
        deadline = check_timeout(timeout_s)
        names = sorted(checked)
        while True:
            with self._insert_lock:
                if all(spec_lib.insert_admitted(*self._limiter(t)) for t in names):
                    self._write(checked, prepared)
                    return
            self._poll_or_raise(deadline, "an insert", names)

    def _write(self, checked: dict[str, float], prepared: dict[str, Any]) -> None:
        first = next(iter(checked))
        treedef = self._checkers[first].treedef
        if treedef is None:
            treedef, leaves = prepared[first]
            for name in checked:
                self._treedefs[name] = treedef
        else:
            leaves = prepared[first]
        with self._client.trajectory_writer(num_keep_alive_refs=1) as writer:
            writer.append(tree_lib.unflatten(treedef, leaves))
            step = tree_lib.map_leaves(lambda column: column[-1], writer.history)
            for name, p in checked.items():
                writer.create_item(name, p, step)
            writer.flush()

    def sample(self, table: str, batch_size: int, timeout_s: float | None = None) -> SampleBatch:
        """Samples `batch_size` items from `table`; see NativeClient.

        The call takes items as the rate limiter admits them (polling the server's counters);
        at the deadline it raises RateLimiterTimeout with the items already taken as
        `partial`, as the native backend does.
        """
        spec = self._spec(table)
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        deadline = check_timeout(timeout_s)
        parts: list[SampleBatch] = []
        taken = 0
        while taken < batch_size:
            with self._sample_lock:
                ready = spec_lib.samples_admitted(*self._limiter(table), batch_size - taken)
                if ready:
                    parts.append(self._sample(spec, ready))
                    taken += ready
                    continue
            try:
                self._poll_or_raise(deadline, f"a sample ({taken} of {batch_size} taken)",
                                    [table])
            except RateLimiterTimeout as e:
                e.partial = _concat(parts) if parts else None
                raise
        return _concat(parts)

    def _sample(self, spec: spec_lib.TableSpec, batch_size: int) -> SampleBatch:
        try:
            samples = list(self._client.sample(
                spec.name, num_samples=batch_size, emit_timesteps=False,
                unpack_as_table_signature=spec.signature is not None))
        except Exception as e:
            if self._closed:  # close() stopped the server under a waiting sample.
                raise TableClosedError(f"table {spec.name!r} is closed; sample refused") from e
            raise
        infos = [s.info for s in samples]
        flat = [tree_lib.flatten(s.data)[0] for s in samples]
        leaves = [np.stack(column) for column in zip(*flat, strict=True)]
        treedef = (self._checkers[spec.name].treedef if spec.signature is not None
                   else self._treedefs.get(spec.name))
        return SampleBatch(
            data=leaves if treedef is None else tree_lib.unflatten(treedef, leaves),
            keys=np.array([i.key for i in infos], np.uint64),
            probabilities=np.array([i.probability for i in infos], np.float64),
            priorities=np.array([i.priority for i in infos], np.float64),
            times_sampled=np.array([i.times_sampled for i in infos], np.int64),
            table_size=np.array([i.table_size for i in infos], np.int64),
        )

    def update_priorities(self, table: str, updates: Mapping[int, float]) -> None:
        """Updates priorities by key; unknown keys are ignored (as Reverb does)."""
        self._spec(table)
        checked = {int(k): check_priority(p, table, k) for k, p in updates.items()}
        self._client.mutate_priorities(table, updates=checked)

    def delete(self, table: str, keys: Iterable[int]) -> None:
        """Deletes items by key; unknown keys are ignored (as Reverb does)."""
        self._spec(table)
        self._client.mutate_priorities(table, deletes=[int(k) for k in keys])

    def info(self, table: str) -> dict[str, Any]:
        """Size, counters and rate limiter state of `table`."""
        self._spec(table)
        info = self._client.server_info()[table]
        limiter = info.rate_limiter_info
        size = int(info.current_size)
        inserts = int(limiter.insert_stats.completed)
        samples = int(limiter.sample_stats.completed)
        # Reverb 0.14 reports no delete counter; every inserted item is either still in the
        # table or was removed (evicted, expired or deleted).
        deletes = inserts - size
        return {
            "name": table,
            "size": size,
            "max_size": int(info.max_size),
            "max_times_sampled": int(info.max_times_sampled),
            "num_inserts": inserts,
            "num_samples": samples,
            "num_deletes": deletes,
            "rate_limiter": {
                "samples_per_insert": float(limiter.samples_per_insert),
                "min_size_to_sample": int(limiter.min_size_to_sample),
                "min_diff": _infinite(limiter.min_diff),
                "max_diff": _infinite(limiter.max_diff),
                "inserts": inserts,
                "samples": samples,
                "deletes": deletes,
            },
        }

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._server.stop()

    def __enter__(self) -> ReverbClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _concat(parts: list[SampleBatch]) -> SampleBatch:
    """One batch from the batches of successive samples (in order)."""
    if len(parts) == 1:
        return parts[0]
    leaves, treedef = tree_lib.flatten(parts[0].data)
    columns = zip(*[tree_lib.flatten(p.data)[0] for p in parts], strict=True)
    return SampleBatch(
        data=tree_lib.unflatten(treedef, [np.concatenate(c) for c in columns]),
        **{f: np.concatenate([getattr(p, f) for p in parts])
           for f in ("keys", "probabilities", "priorities", "times_sampled", "table_size")},
    )
