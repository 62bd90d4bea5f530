"""Replay tables with Reverb semantics (native backend by default, dm-reverb optional).

Specs (`TableSpec`, selectors, rate limiters, `ArraySpec`) are backend-independent; the native
backend (`NativeClient`, `Table`) serves them in-process with Reverb's sampling, removal and
rate-limiting semantics. Importing this package needs only numpy.
"""

from trellis.reverb_tables.client import BACKENDS, make_client, reverb_available
from trellis.reverb_tables.errors import (
    RateLimiterTimeout,
    SignatureError,
    TableClosedError,
    UnknownTableError,
)
from trellis.reverb_tables.native import NativeClient
from trellis.reverb_tables.node import ReplayClient, ReplayNode, StreamingWriter
from trellis.reverb_tables.spec import (
    ArraySpec,
    Fifo,
    Lifo,
    MaxHeap,
    MinHeap,
    MinSize,
    Prioritized,
    Queue,
    RateLimiter,
    RateLimiterSpec,
    SampleToInsertRatio,
    Selector,
    Stack,
    TableSpec,
    Uniform,
)
from trellis.reverb_tables.table import Table
from trellis.reverb_tables.types import SampleBatch

__all__ = [
    "BACKENDS",
    "ArraySpec",
    "Fifo",
    "Lifo",
    "MaxHeap",
    "MinHeap",
    "MinSize",
    "NativeClient",
    "Prioritized",
    "Queue",
    "RateLimiter",
    "RateLimiterSpec",
    "RateLimiterTimeout",
    "ReplayClient",
    "ReplayNode",
    "StreamingWriter",
    "SampleBatch",
    "SampleToInsertRatio",
    "Selector",
    "SignatureError",
    "Stack",
    "Table",
    "TableClosedError",
    "TableSpec",
    "Uniform",
    "UnknownTableError",
    "make_client",
    "reverb_available",
]
