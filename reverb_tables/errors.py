"""Errors raised by replay tables (shared by all backends)."""

from __future__ import annotations

from typing import Any


class RateLimiterTimeout(TimeoutError):
    """A blocking insert or sample waited `timeout_s` without the rate limiter admitting it.

    Attributes:
        table: name of the table.
        operation: "insert" or "sample".
        partial: for a sample, the `SampleBatch` of the items already taken before the deadline
            (they count as sampled, exactly as in Reverb where a stream that times out has
            consumed what it yielded), or None when nothing was taken.
    """

    def __init__(self, message: str, *, table: str, operation: str, partial: Any = None):
        super().__init__(message)
        self.table = table
        self.operation = operation
        self.partial = partial


class TableClosedError(RuntimeError):
    """The table was closed (before or while the call waited)."""


class UnknownTableError(KeyError):
    """A table name that the client does not serve."""

    def __str__(self) -> str:  # KeyError would quote the whole message.
        return str(self.args[0]) if self.args else ""


class SignatureError(ValueError):
    """Data does not match the signature of a table."""
