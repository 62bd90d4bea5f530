"""Table specs with Reverb's semantics: selectors, rate limiters, signatures.

These are plain frozen dataclasses, independent of any backend, so that the same spec can be
served by the native backend or by dm-reverb. The semantics follow Reverb
(`reverb/selectors.py`, `reverb/rate_limiters.py`, `reverb/cc/rate_limiter.cc`).

Rate limiting, as in Reverb. A limiter holds `samples_per_insert` (spi), `min_size_to_sample`,
`min_diff` and `max_diff`, and counts `inserts`, `samples` (one per sampled item) and `deletes`
(every item that leaves the table: evicted by the remover, removed after `max_times_sampled`
samples, or deleted by the client). With `diff = inserts * spi - samples`:

* a sample of one item is admitted iff `inserts - deletes >= min_size_to_sample` and
  `diff - 1 >= min_diff`;
* an insert is admitted iff `inserts + 1 - deletes <= min_size_to_sample` (inserts are free until
  the table reaches the min size), or else `(inserts + 1) * spi - samples <= max_diff`.

A call that is not admitted blocks until another call changes the counters (or its timeout
expires, or the table is closed).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import warnings
from typing import Any

import numpy as np

from trellis.reverb_tables import tree

# --------------------------------------------------------------------------------------------
# Signatures.


@dataclasses.dataclass(frozen=True)
class ArraySpec:
    """Shape and dtype of one array: a leaf of a table's signature, and (re-exported by the
    agent contract, `builders.contract.agent`) a field that inference records per step.

    Attributes:
        shape: tuple of non-negative ints (no unknown dimensions: storage is preallocated).
        dtype: anything `np.dtype` accepts; stored as a `np.dtype`.
    """

    shape: tuple[int, ...]
    dtype: Any

    def __post_init__(self) -> None:
        try:
            shape = tuple(int(d) for d in self.shape)
        except (TypeError, ValueError) as e:
            raise ValueError(
                f"ArraySpec.shape must be a tuple of non-negative ints, got {self.shape!r}"
            ) from e
        if any(d < 0 for d in shape):
            raise ValueError(f"ArraySpec.shape must be non-negative, got {self.shape!r}")
        try:
            dtype = np.dtype(self.dtype)
        except TypeError as e:
            raise ValueError(f"ArraySpec.dtype {self.dtype!r} is not a numpy dtype") from e
        if dtype.hasobject:
            raise ValueError("ArraySpec.dtype must not be `object`: tables store numeric arrays")
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "dtype", dtype)

    def zeros(self, batch: tuple[int, ...]) -> np.ndarray:
        """Zeros of this spec with leading `batch` dimensions: [*batch, *shape]."""
        return np.zeros(batch + self.shape, self.dtype)


# --------------------------------------------------------------------------------------------
# Selectors: usable both as a sampler and as a remover.


class Selector:
    """Base class of item selection strategies (Reverb's `reverb.selectors`)."""

    def describe(self) -> str:
        return repr(self)


@dataclasses.dataclass(frozen=True)
class Uniform(Selector):
    """Selects any item with equal probability (1 / size)."""


@dataclasses.dataclass(frozen=True)
class Prioritized(Selector):
    """Selects item i with probability p_i^a / sum_j p_j^a (Schaul et al., 2016, PER).

    An item of priority 0 is never sampled, even with `priority_exponent` 0 (where every other
    item is equally likely), as in dm-reverb. When every priority is 0 the native backend falls
    back to uniform.

    Attributes:
        priority_exponent: a >= 0.
    """

    priority_exponent: float

    def __post_init__(self) -> None:
        a = self.priority_exponent
        if isinstance(a, bool) or not isinstance(a, numbers.Real) or not math.isfinite(a) or a < 0:
            raise ValueError(
                f"Prioritized.priority_exponent must be a finite number >= 0, got {a!r}"
            )
        object.__setattr__(self, "priority_exponent", float(a))


@dataclasses.dataclass(frozen=True)
class Fifo(Selector):
    """Selects the oldest item (by insertion order; priority updates do not change it)."""


@dataclasses.dataclass(frozen=True)
class Lifo(Selector):
    """Selects the newest item (by insertion order)."""


@dataclasses.dataclass(frozen=True)
class MaxHeap(Selector):
    """Selects the item with the highest priority; ties go to the least recently inserted or
    updated item."""


@dataclasses.dataclass(frozen=True)
class MinHeap(Selector):
    """Selects the item with the lowest priority; ties go to the least recently inserted or
    updated item."""


# --------------------------------------------------------------------------------------------
# Rate limiters.


class RateLimiterSpec:
    """Base of rate limiters. Every limiter exposes the four parameters of Reverb's limiter:
    `samples_per_insert`, `min_size_to_sample`, `min_diff`, `max_diff` (see the module doc)."""

    samples_per_insert: float
    min_size_to_sample: int
    min_diff: float
    max_diff: float

    def params(self) -> dict[str, float]:
        """The four canonical parameters, as a dict."""
        return {
            "samples_per_insert": float(self.samples_per_insert),
            "min_size_to_sample": int(self.min_size_to_sample),
            "min_diff": float(self.min_diff),
            "max_diff": float(self.max_diff),
        }


def _check_min_size(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name}.min_size_to_sample must be an int >= 1, got {value!r}")


def _check_spi(name: str, value: Any) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Real)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError(f"{name}.samples_per_insert must be a finite number > 0, got {value!r}")


@dataclasses.dataclass(frozen=True)
class RateLimiter(RateLimiterSpec):
    """Reverb's general limiter, from its four parameters (see the module doc for when inserts
    and samples block). Prefer `MinSize`, `SampleToInsertRatio` or `Queue`."""

    samples_per_insert: float
    min_size_to_sample: int
    min_diff: float
    max_diff: float

    def __post_init__(self) -> None:
        _check_spi("RateLimiter", self.samples_per_insert)
        _check_min_size("RateLimiter", self.min_size_to_sample)
        if math.isnan(self.min_diff) or math.isnan(self.max_diff) or self.min_diff > self.max_diff:
            raise ValueError(
                f"RateLimiter needs min_diff <= max_diff, got min_diff={self.min_diff!r}, "
                f"max_diff={self.max_diff!r}"
            )


@dataclasses.dataclass(frozen=True)
class MinSize(RateLimiterSpec):
    """Samples block until the table holds `min_size_to_sample` items; inserts never block.

    Reverb: samples_per_insert=1, min_diff=-inf, max_diff=+inf (Reverb uses +-DBL_MAX).
    """

    min_size_to_sample: int

    def __post_init__(self) -> None:
        _check_min_size("MinSize", self.min_size_to_sample)

    samples_per_insert = 1.0
    min_diff = -math.inf
    max_diff = math.inf


@dataclasses.dataclass(frozen=True)
class SampleToInsertRatio(RateLimiterSpec):
    """Keeps the number of samples per insert near `samples_per_insert`.

    Stage 1: until the table holds `min_size_to_sample` items, inserts never block and samples
    always block. Stage 2: with `diff = inserts * spi - samples`, a sample blocks while
    `diff - 1 < min_diff` (samples ran ahead), an insert blocks while
    `(inserts + 1) * spi - samples > max_diff` (inserts ran ahead).

    A number `error_buffer` gives `min_diff, max_diff = offset -+ error_buffer` with
    `offset = spi * min_size_to_sample`, so that the error counts only operations after stage 1;
    a `(min_diff, max_diff)` pair is used as given.

    Attributes:
        samples_per_insert: average number of times each item is sampled (> 0).
        min_size_to_sample: items the table must hold before sampling (>= 1).
        error_buffer: a number, or a (min_diff, max_diff) pair.

    Raises:
        ValueError: (as Reverb) when `max_diff - min_diff < 2 * max(1, spi)` (the limiter could
            block both sides), or `min_diff > spi * min_size_to_sample` (deadlock once the min size
            is reached). A warning is issued when `max_diff < spi * min_size_to_sample`
            (deadlock unless samples run concurrently with inserts).
    """

    samples_per_insert: float
    min_size_to_sample: int
    error_buffer: float | tuple[float, float]

    def __post_init__(self) -> None:
        _check_spi("SampleToInsertRatio", self.samples_per_insert)
        _check_min_size("SampleToInsertRatio", self.min_size_to_sample)
        eb = self.error_buffer
        if isinstance(eb, bool) or not (
            isinstance(eb, numbers.Real)
            or (isinstance(eb, (tuple, list)) and len(eb) == 2
                and all(isinstance(v, numbers.Real) for v in eb))
        ):
            raise ValueError(
                f"SampleToInsertRatio.error_buffer must be a number or a (min_diff, max_diff) "
                f"pair, got {eb!r}"
            )
        if isinstance(eb, list):
            object.__setattr__(self, "error_buffer", tuple(eb))
        if not all(math.isfinite(v) for v in (self.min_diff, self.max_diff)):
            raise ValueError(f"SampleToInsertRatio.error_buffer must be finite, got {eb!r}")
        spi, offset = self.samples_per_insert, self.samples_per_insert * self.min_size_to_sample
        if self.max_diff - self.min_diff < 2 * max(1.0, spi):
            raise ValueError(
                f"SampleToInsertRatio: the error buffer range [min_diff={self.min_diff}, "
                f"max_diff={self.max_diff}] must span at least 2 * max(1, samples_per_insert) = "
                f"{2 * max(1.0, spi)}; smaller ranges can block both inserts and samples"
            )
        if self.min_diff > offset:
            raise ValueError(
                f"SampleToInsertRatio: min_diff={self.min_diff} is above samples_per_insert * "
                f"min_size_to_sample = {offset}: sampling would deadlock once min_size_to_sample "
                f"items are inserted"
            )
        if self.max_diff < offset:
            warnings.warn(
                f"SampleToInsertRatio: max_diff={self.max_diff} is below samples_per_insert * "
                f"min_size_to_sample = {offset}: inserts deadlock once min_size_to_sample items "
                f"are inserted unless samples run concurrently",
                stacklevel=3,
            )

    @property
    def min_diff(self) -> float:  # type: ignore[override]
        if isinstance(self.error_buffer, tuple):
            return float(self.error_buffer[0])
        return self.samples_per_insert * self.min_size_to_sample - float(self.error_buffer)

    @property
    def max_diff(self) -> float:  # type: ignore[override]
        if isinstance(self.error_buffer, tuple):
            return float(self.error_buffer[1])
        return self.samples_per_insert * self.min_size_to_sample + float(self.error_buffer)


@dataclasses.dataclass(frozen=True)
class Queue(RateLimiterSpec):
    """At most `size` unsampled items: inserts block while `size` items wait to be sampled,
    samples block while none waits.

    Reverb: samples_per_insert=1, min_size_to_sample=1, min_diff=0, max_diff=size. Use it with
    Fifo sampler and remover and max_times_sampled=1, i.e. `TableSpec.queue(...)`.
    """

    size: int

    def __post_init__(self) -> None:
        size = self.size
        if isinstance(size, bool) or not isinstance(size, numbers.Integral) or size < 1:
            raise ValueError(f"Queue.size must be an int >= 1, got {self.size!r}")

    samples_per_insert = 1.0
    min_size_to_sample = 1
    min_diff = 0.0

    @property
    def max_diff(self) -> float:  # type: ignore[override]
        return float(self.size)


@dataclasses.dataclass(frozen=True)
class Stack(Queue):
    """As `Queue`, for Lifo sampler and remover (`TableSpec.stack(...)`)."""


def insert_admitted(limiter: RateLimiterSpec, inserts: int, samples: int, deletes: int) -> bool:
    """Whether `limiter` admits one more insert, given the table's counters (module doc)."""
    if inserts + 1 - deletes <= limiter.min_size_to_sample:
        return True  # Inserts are free until the table reaches min_size_to_sample.
    return (inserts + 1) * limiter.samples_per_insert - samples <= limiter.max_diff


def samples_admitted(limiter: RateLimiterSpec, inserts: int, samples: int, deletes: int,
                     limit: int) -> int:
    """How many of `limit` samples `limiter` admits now, given the table's counters."""
    if inserts - deletes < limiter.min_size_to_sample:
        return 0
    room = inserts * limiter.samples_per_insert - samples - limiter.min_diff  # n <= room
    return limit if room >= limit else max(0, math.floor(room))


# --------------------------------------------------------------------------------------------
# Table spec.


@dataclasses.dataclass(frozen=True)
class TableSpec:
    """A replay table, as `reverb.Table` describes it (argument order as in Reverb).

    Attributes:
        name: unique table name.
        sampler: selector choosing the items to sample.
        remover: selector choosing the item to evict when an insert finds the table full.
        max_size: maximum number of items (>= 1).
        rate_limiter: a `RateLimiterSpec` (`MinSize`, `SampleToInsertRatio`, `Queue`, ...).
        max_times_sampled: an item is removed once sampled this many times; 0 means unlimited.
        signature: optional pytree (dicts / lists / tuples) of `ArraySpec`; when given, inserted
            data must match it exactly and the native backend preallocates storage.
    """

    name: str
    sampler: Selector
    remover: Selector
    max_size: int
    rate_limiter: RateLimiterSpec
    max_times_sampled: int = 0
    signature: Any = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"TableSpec.name must be a non-empty str, got {self.name!r}")
        where = f"TableSpec {self.name!r}"
        for field in ("sampler", "remover"):
            value = getattr(self, field)
            if not isinstance(value, Selector):
                raise ValueError(
                    f"{where}: {field} must be a selector (Uniform(), Prioritized(a), Fifo(), "
                    f"Lifo(), MaxHeap(), MinHeap()), got {value!r}"
                )
        if isinstance(self.max_size, bool) or not isinstance(self.max_size, numbers.Integral) \
                or self.max_size < 1:
            raise ValueError(f"{where}: max_size must be an int >= 1, got {self.max_size!r}")
        if not isinstance(self.rate_limiter, RateLimiterSpec):
            raise ValueError(
                f"{where}: rate_limiter must be MinSize, SampleToInsertRatio, Queue, Stack or "
                f"RateLimiter, got {self.rate_limiter!r}"
            )
        mts = self.max_times_sampled
        if isinstance(mts, bool) or not isinstance(mts, numbers.Integral) or mts < 0:
            raise ValueError(
                f"{where}: max_times_sampled must be an int >= 0 (0 = unlimited), got {mts!r}"
            )
        if self.signature is not None:
            pairs, _ = tree.flatten_with_paths(self.signature)
            if not pairs:
                raise ValueError(f"{where}: signature has no leaves; use None for no signature")
            for path, leaf in pairs:
                if not isinstance(leaf, ArraySpec):
                    raise ValueError(
                        f"{where}: every signature leaf must be an ArraySpec, got {leaf!r} at "
                        f"{path}"
                    )

    @classmethod
    def queue(cls, name: str, max_size: int, signature: Any = None) -> TableSpec:
        """A FIFO queue of `max_size` items, each sampled exactly once (Reverb's Table.queue)."""
        return cls(name=name, sampler=Fifo(), remover=Fifo(), max_size=max_size,
                   rate_limiter=Queue(max_size), max_times_sampled=1, signature=signature)

    @classmethod
    def stack(cls, name: str, max_size: int, signature: Any = None) -> TableSpec:
        """A LIFO stack of `max_size` items, each sampled exactly once (Reverb's Table.stack)."""
        return cls(name=name, sampler=Lifo(), remover=Lifo(), max_size=max_size,
                   rate_limiter=Stack(max_size), max_times_sampled=1, signature=signature)

    def describe(self) -> dict[str, Any]:
        """A JSON-able description, used to check that a checkpoint matches its table."""
        sig = None
        if self.signature is not None:
            pairs, _ = tree.flatten_with_paths(self.signature)
            sig = [[path, list(s.shape), s.dtype.str] for path, s in pairs]
        return {
            "name": self.name,
            "sampler": repr(self.sampler),
            "remover": repr(self.remover),
            "max_size": int(self.max_size),
            "max_times_sampled": int(self.max_times_sampled),
            "rate_limiter": self.rate_limiter.params(),
            "signature": sig,
        }
