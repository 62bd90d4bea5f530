"""A sample's batch, assembled from the chunks it takes between waits (private).

A native `Table.sample` takes items in chunks, one per time the rate limiter admits some; each
chunk is a tuple (data, keys, probabilities, priorities, times_sampled, table sizes). With `out`
arrays, the chunks' data were already written into consecutive rows of `out`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from trellis.reverb_tables import tree as tree_lib
from trellis.reverb_tables.checks import DataChecker
from trellis.reverb_tables.types import SampleBatch

# One wake-up's take: (data, keys, probabilities, priorities, times_sampled, table sizes).
Chunk = tuple[Any, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def check_out(checker: DataChecker, out: Sequence[np.ndarray], batch_size: int
              ) -> list[np.ndarray]:
    """Returns `out` as a list, or raises ValueError unless it fits a batch of this table."""
    if checker.treedef is None:
        raise ValueError(f"table {checker.name!r} has no signature: it cannot sample into `out`")
    want = [((batch_size, *s.shape), s.dtype) for s in checker.leaf_specs]
    got = [(a.shape, a.dtype) if isinstance(a, np.ndarray) else (type(a), None) for a in out]
    if got != want:
        raise ValueError(f"table {checker.name!r}: `out` must be arrays of (shape, dtype) {want}, "
                         f"got {got}")
    return list(out)


def assemble(chunks: list[Chunk], out: list[np.ndarray] | None, treedef: tree_lib.TreeDef | None
             ) -> SampleBatch:
    """The batch of `chunks` (at least one); with `out`, its data are views of `out`'s rows."""
    if out is not None:
        assert treedef is not None, "check_out refuses `out` to a table without a signature"
        taken = sum(len(c[1]) for c in chunks)
        chunks = [(tree_lib.unflatten(treedef, [a[:taken] for a in out]),
                   *(np.concatenate([c[j] for c in chunks]) for j in range(1, 6)))]
    if len(chunks) == 1:
        data, keys, probs, prios, times, sizes = chunks[0]
    else:
        datas = [c[0] for c in chunks]
        leaves0, treedef = tree_lib.flatten(datas[0])
        columns = [tree_lib.flatten(d)[0] for d in datas]
        data = tree_lib.unflatten(
            treedef, [np.concatenate([col[i] for col in columns]) for i in range(len(leaves0))]
        )
        keys, probs, prios, times, sizes = (np.concatenate([c[j] for c in chunks])
                                            for j in range(1, 6))
    return SampleBatch(data=data, keys=keys, probabilities=probs, priorities=prios,
                       times_sampled=times, table_size=sizes)
