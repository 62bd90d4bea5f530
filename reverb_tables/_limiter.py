"""The rate limiter of a native table: its counts, and the waits of the calls it holds (private).

`Limiter` owns what Reverb's rate limiter counts (inserts, samples, deletes: every removal,
whatever its cause), whether the table is closed, and the blocking waits of inserts and samples
until the limiter admits them. The rules themselves are `spec.insert_admitted` /
`spec.samples_admitted`, shared with the dm-reverb backend. It waits on the table's condition and
is only touched under the table's lock; the table notifies the condition after each change.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from trellis.reverb_tables import spec as spec_lib
from trellis.reverb_tables.errors import RateLimiterTimeout, TableClosedError


class Limiter:
    """Rate-limiter state of one table.

    Args:
        spec: the table's spec (its name, max_size and rate limiter).
        cond: the table's condition, notified by the table after every change of the counts.
    """

    def __init__(self, spec: spec_lib.TableSpec, cond: threading.Condition):
        self._name = spec.name
        self._capacity = int(spec.max_size)
        self._spec = spec.rate_limiter
        self._cond = cond
        self.inserts = 0
        self.samples = 0
        self.deletes = 0
        self.closed = False
        self._waiting = {"insert": 0, "sample": 0}

    def diff(self) -> float:
        return self.inserts * self._spec.samples_per_insert - self.samples

    def can_insert(self) -> bool:
        return spec_lib.insert_admitted(self._spec, self.inserts, self.samples, self.deletes)

    def admissible_samples(self, limit: int) -> int:
        """How many of `limit` samples the limiter admits now, without blocking."""
        if self.closed:
            return 0
        return spec_lib.samples_admitted(self._spec, self.inserts, self.samples, self.deletes,
                                         limit)

    def wait(self, operation: str, deadline: float | None) -> None:
        """Waits (lock held) until one `operation` ("insert" or "sample") is admitted.

        Raises:
            TableClosedError: the table is or gets closed.
            RateLimiterTimeout: `deadline` (time.monotonic) passed first.
        """
        ready = self.can_insert if operation == "insert" else lambda: self.admissible_samples(1) > 0
        while True:
            if self.closed:
                raise TableClosedError(
                    f"table {self._name!r} is closed; {operation} refused (calls waiting on the "
                    f"rate limiter are woken by close())"
                )
            if ready():
                return
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise RateLimiterTimeout(
                    f"table {self._name!r}: timed out waiting for the rate limiter to admit "
                    f"{'a sample' if operation == 'sample' else 'an insert'}; {self._describe()}",
                    table=self._name, operation=operation,
                )
            self._waiting[operation] += 1
            try:
                self._cond.wait(remaining)
            finally:
                self._waiting[operation] -= 1

    def close(self) -> None:
        """Marks the table closed and wakes every waiting call (lock held)."""
        self.closed = True
        self._cond.notify_all()

    def info(self) -> dict[str, Any]:
        """The limiter's part of `Table.info` (lock held)."""
        return {
            "type": type(self._spec).__name__,
            **self._spec.params(),
            "inserts": self.inserts,
            "samples": self.samples,
            "deletes": self.deletes,
            "diff": self.diff(),
            "can_insert": (not self.closed) and self.can_insert(),
            "can_sample": self.admissible_samples(1) > 0,
            "blocked_inserts": self._waiting["insert"],
            "blocked_samples": self._waiting["sample"],
        }

    def _describe(self) -> str:
        # The size is the limiter's (inserts - deletes), which is the table's: every removal
        # counts as a delete.
        return (
            f"rate limiter {type(self._spec).__name__}("
            + ", ".join(f"{k}={v:g}" for k, v in self._spec.params().items())
            + f"); table size={self.inserts - self.deletes}/{self._capacity}, "
            f"inserts={self.inserts}, samples={self.samples}, deletes={self.deletes}, "
            f"diff=inserts*samples_per_insert-samples={self.diff():g}. "
            f"A sample needs size >= min_size_to_sample and diff-1 >= min_diff; an insert needs "
            f"size+1 <= min_size_to_sample or (inserts+1)*samples_per_insert-samples <= max_diff"
        )
