"""Choosing a backend for a set of table specs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from trellis.reverb_tables.native import NativeClient
from trellis.reverb_tables.spec import TableSpec

if TYPE_CHECKING:
    from trellis.reverb_tables.dm_reverb import ReverbClient

BACKENDS = ("native", "reverb")


def reverb_available() -> bool:
    """Whether dm-reverb can be imported here."""
    try:
        import reverb  # noqa: F401
    except ImportError:
        return False
    return True


def make_client(tables: Sequence[TableSpec], backend: str = "native", *,
                seed: int | None = None) -> NativeClient | ReverbClient:
    """Serves `tables` with the chosen backend, in this process.

    Args:
        tables: the table specs (unique names).
        backend: "native" (the default) or "reverb" (a real `reverb.Server`; needs dm-reverb).
        seed: seed of the tables' random generators (native backend).

    Raises:
        ValueError: an unknown backend.
        ImportError: "reverb" where dm-reverb is not installed, saying how to get it.
    """
    if backend == "native":
        return NativeClient(tables, seed=seed)
    if backend == "reverb":
        if not reverb_available():
            raise ImportError(
                "replay backend 'reverb' needs dm-reverb (Python 3.11, tensorflow-cpu 2.15, "
                "numpy<2); `make test-reverb` builds such an environment in .venv-reverb"
            )
        from trellis.reverb_tables.dm_reverb import ReverbClient

        return ReverbClient(tables, seed=seed)
    raise ValueError(f"unknown replay backend {backend!r}; available: {list(BACKENDS)}")
