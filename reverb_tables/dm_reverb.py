"""The dm-reverb backend: the same specs and client API, served by a real `reverb.Server`.

Only importable where dm-reverb is installed (`make test-reverb` builds that environment:
Python 3.11, tensorflow-cpu 2.15, dm-reverb 0.14, numpy < 2). Differences from the native
backend, all inherent to dm-reverb:

- `insert` returns None: Reverb assigns item keys on the server and does not report them
  (keys come back with samples).
- A `sample` with a timeout first waits, polling the server's rate-limiter counters, until
  the whole batch is admissible, then samples; Reverb's Python client has no sample timeout.
- Checkpoints use Reverb's own format (`checkpoint()` returns its path on the server side).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from reverb_tables import spec as spec_lib
from reverb_tables import tree as tree_lib
from reverb_tables.errors import (
    RateLimiterTimeout,
    SignatureError,
    TableClosedError,
    UnknownTableError,
)
from reverb_tables.native import check_priority
from reverb_tables.types import SampleBatch

_POLL_S = 0.002


def _selector(reverb, selector: spec_lib.Selector):
    kinds = {
        spec_lib.Uniform: lambda s: reverb.selectors.Uniform(),
        spec_lib.Prioritized: lambda s: reverb.selectors.Prioritized(s.priority_exponent),
        spec_lib.Fifo: lambda s: reverb.selectors.Fifo(),
        spec_lib.Lifo: lambda s: reverb.selectors.Lifo(),
        spec_lib.MaxHeap: lambda s: reverb.selectors.MaxHeap(),
        spec_lib.MinHeap: lambda s: reverb.selectors.MinHeap(),
    }
    return kinds[type(selector)](selector)


def _signature(tf, signature: Any):
    if signature is None:
        return None
    return tree_lib.map_leaves(lambda s: tf.TensorSpec(s.shape, tf.as_dtype(s.dtype)), signature)


def _finite(x: float) -> float:
    # Reverb's limiter takes +-DBL_MAX where ours says +-inf.
    return float(np.clip(x, -np.finfo(np.float64).max, np.finfo(np.float64).max))


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

    def _check_signature(self, spec: spec_lib.TableSpec, data: Any) -> list[np.ndarray]:
        pairs, treedef = tree_lib.flatten_with_paths(data)
        leaves = [np.asarray(leaf) for _, leaf in pairs]
        if spec.signature is None:
            return leaves
        expected, expected_def = tree_lib.flatten_with_paths(spec.signature)
        if treedef != expected_def:
            raise SignatureError(
                f"data does not match the signature of table {spec.name!r}: expected leaves "
                f"{[p for p, _ in expected]}, got {[p for p, _ in pairs]}"
            )
        for (path, s), leaf in zip(expected, leaves, strict=True):
            if leaf.shape != s.shape or leaf.dtype != s.dtype:
                raise SignatureError(
                    f"table {spec.name!r}, leaf {path}: expected {s.dtype}{list(s.shape)}, got "
                    f"{leaf.dtype}{list(leaf.shape)}"
                )
        return leaves

    def insert(self, data: Any, priorities: Mapping[str, float],
               timeout_s: float | None = None) -> None:
        """Inserts `data` as one item into each table of `priorities`; see NativeClient."""
        if not isinstance(priorities, Mapping) or not priorities:
            raise ValueError(
                f"priorities must be a non-empty {{table name: priority}} dict, got {priorities!r}"
            )
        checked = {}
        for name, p in priorities.items():
            self._check_signature(self._spec(name), data)
            checked[name] = check_priority(p, name)
        timeout_ms = None if timeout_s is None else max(0, int(timeout_s * 1000))
        with self._client.trajectory_writer(num_keep_alive_refs=1) as writer:
            writer.append(data)
            step = tree_lib.map_leaves(lambda column: column[-1], writer.history)
            for name, p in checked.items():
                writer.create_item(name, p, step)
            try:
                if timeout_ms is None:
                    writer.flush()
                else:
                    writer.flush(timeout_ms=timeout_ms)
            except self._reverb.errors.DeadlineExceededError as e:
                raise RateLimiterTimeout(
                    f"insert into {sorted(checked)} not admitted by the rate limiter within "
                    f"{timeout_s:g} s", table=",".join(sorted(checked)), operation="insert",
                ) from e

    def _wait_admissible(self, name: str, batch_size: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            info = self.info(name)
            limiter = info["rate_limiter"]
            allowed = (info["size"] >= max(1, limiter["min_size_to_sample"]) and
                       limiter["inserts"] * limiter["samples_per_insert"]
                       - (limiter["samples"] + batch_size) >= limiter["min_diff"])
            if allowed:
                return
            if time.monotonic() >= deadline:
                raise RateLimiterTimeout(
                    f"sample of {batch_size} from table {name!r} not admitted by the rate "
                    f"limiter within {timeout_s:g} s (state: {limiter})",
                    table=name, operation="sample",
                )
            time.sleep(_POLL_S)

    def sample(self, table: str, batch_size: int, timeout_s: float | None = None) -> SampleBatch:
        """Samples `batch_size` items from `table`; see NativeClient."""
        spec = self._spec(table)
        if timeout_s is not None:
            self._wait_admissible(table, batch_size, timeout_s)
        samples = list(self._client.sample(table, num_samples=batch_size, emit_timesteps=False,
                                           unpack_as_table_signature=spec.signature is not None))
        infos = [s.info for s in samples]
        data = [s.data for s in samples]
        if spec.signature is None:
            stacked = [np.stack(leaves) for leaves in zip(*data, strict=True)]
        else:
            flat = [tree_lib.flatten(d)[0] for d in data]
            treedef = tree_lib.flatten(spec.signature)[1]
            stacked = tree_lib.unflatten(
                treedef, [np.stack(leaves) for leaves in zip(*flat, strict=True)])
        return SampleBatch(
            data=stacked,
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
        return {
            "name": table,
            "size": int(info.current_size),
            "max_size": int(info.max_size),
            "num_inserts": int(limiter.insert_stats.completed),
            "num_samples": int(limiter.sample_stats.completed),
            "num_unique_samples": int(info.num_unique_samples),
            "rate_limiter": {
                "samples_per_insert": float(limiter.samples_per_insert),
                "min_size_to_sample": int(limiter.min_size_to_sample),
                "min_diff": float(limiter.min_diff),
                "max_diff": float(limiter.max_diff),
                "inserts": int(limiter.insert_stats.completed),
                "samples": int(limiter.sample_stats.completed),
            },
        }

    def checkpoint(self) -> str:
        """Writes a Reverb checkpoint on the server; returns its path."""
        return self._client.checkpoint()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._server.stop()

    def __enter__(self) -> ReverbClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

