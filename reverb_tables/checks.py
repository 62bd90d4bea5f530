"""Checks of what callers hand a table: priorities, timeouts, item keys, data.

Both backends use them (the native one alone takes caller-chosen keys). Each check raises
before anything changes, with a message naming the value and what would be accepted; the
backends call them outside their locks.
"""

from __future__ import annotations

import math
import numbers
import time
from typing import Any

import numpy as np

from trellis.reverb_tables import spec as spec_lib
from trellis.reverb_tables import tree as tree_lib
from trellis.reverb_tables.errors import SignatureError


def check_priority(priority: Any, table: str, key: Any = None) -> float:
    """Returns `priority` as a float, or raises ValueError unless it is a finite number >= 0."""
    what = f"priority for table {table!r}" + ("" if key is None else f" (key {key})")
    if isinstance(priority, bool) or not isinstance(priority, numbers.Real):
        raise ValueError(f"{what} must be a finite number >= 0, got {priority!r}")
    value = float(priority)
    if not math.isfinite(value) or value < 0.0:
        raise ValueError(f"{what} must be a finite number >= 0, got {value!r}")
    return value


def check_timeout(timeout_s: float | None) -> float | None:
    """Returns the deadline (time.monotonic) of a call with this timeout, None = no deadline."""
    if timeout_s is None:
        return None
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, numbers.Real) \
            or math.isnan(timeout_s) or timeout_s < 0:
        raise ValueError(
            f"timeout_s must be None (wait forever) or a number >= 0, got {timeout_s!r}"
        )
    return time.monotonic() + float(timeout_s)


def check_key(key: Any) -> int:
    """Returns `key` as an int, or raises ValueError unless it is an int in [0, 2**64)."""
    if isinstance(key, bool) or not isinstance(key, numbers.Integral) or not 0 <= int(key) < 2**64:
        raise ValueError(f"item keys are ints in [0, 2**64), got {key!r}")
    return int(key)


class DataChecker:
    """Checks inserted data against a table's signature (shared by both backends).

    Args:
        spec: the table's spec; without a signature any pytree of arrays is accepted.
    """

    def __init__(self, spec: spec_lib.TableSpec):
        self.name = spec.name
        self.treedef: tree_lib.TreeDef | None
        if spec.signature is not None:
            pairs, self.treedef = tree_lib.flatten_with_paths(spec.signature)
            self.paths = [p for p, _ in pairs]
            self.leaf_specs: list[spec_lib.ArraySpec] = [s for _, s in pairs]
        else:
            self.treedef = None
            self.paths, self.leaf_specs = [], []

    def prepare(self, data: Any) -> Any:
        """Validates and converts `data` for this table (no lock, no state change).

        Returns:
            With a signature, the list of leaves as arrays of the signature's dtypes; without,
            a (treedef, leaves) pair of copied arrays.

        Raises:
            SignatureError: the structure, a shape or a dtype differs from the signature.
        """
        pairs, treedef = tree_lib.flatten_with_paths(data)
        if self.treedef is None:
            return treedef, [np.array(leaf, copy=True) for _, leaf in pairs]
        if treedef != self.treedef:
            got = [p for p, _ in pairs]
            missing = [p for p in self.paths if p not in got]
            extra = [p for p in got if p not in self.paths]
            raise SignatureError(
                f"data does not match the signature of table {self.name!r}: expected leaves "
                f"{self.paths}, got {got}" + (f"; missing {missing}" if missing else "")
                + (f"; unexpected {extra}" if extra else "")
                + ("" if missing or extra else " (same paths, different container types)")
            )
        out = []
        for (path, leaf), s in zip(pairs, self.leaf_specs, strict=True):
            if hasattr(leaf, "dtype"):
                arr = np.asarray(leaf)
                if arr.dtype != s.dtype:
                    raise SignatureError(
                        f"table {self.name!r}, leaf {path}: expected dtype {s.dtype}, got "
                        f"{arr.dtype} (shape {arr.shape})"
                    )
            else:  # Python scalars and lists: convert when no precision class is crossed.
                arr = np.asarray(leaf)
                if not np.can_cast(arr.dtype, s.dtype, casting="same_kind"):
                    raise SignatureError(
                        f"table {self.name!r}, leaf {path}: expected dtype {s.dtype}, got a "
                        f"{type(leaf).__name__} of dtype {arr.dtype}"
                    )
                arr = arr.astype(s.dtype)
            if arr.shape != s.shape:
                raise SignatureError(
                    f"table {self.name!r}, leaf {path}: expected shape {s.shape}, got {arr.shape}"
                )
            out.append(arr)
        return out
