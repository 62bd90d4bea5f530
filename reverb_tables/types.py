"""Values returned by replay tables (shared by all backends)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np


@dataclasses.dataclass(frozen=True)
class SampleBatch:
    """A batch of sampled items; every field has a leading batch axis.

    Attributes:
        data: the items' pytree, each leaf stacked on a leading axis [B, ...].
        keys: [B] uint64 item keys (for `update_priorities` / `delete`).
        probabilities: [B] float64 probability with which each item was selected (1.0 for the
            deterministic Fifo / Lifo / heap samplers).
        priorities: [B] float64 priority of each item when it was sampled.
        times_sampled: [B] int64 times each item has been sampled, this sample included.
        table_size: [B] int64 size of the table when each item was sampled.
    """

    data: Any
    keys: np.ndarray
    probabilities: np.ndarray
    priorities: np.ndarray
    times_sampled: np.ndarray
    table_size: np.ndarray

    def __len__(self) -> int:
        return len(self.keys)
