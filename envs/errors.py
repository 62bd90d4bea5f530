"""Errors of the env factories, apart so that every factory module can raise them."""

from __future__ import annotations

import difflib
from collections.abc import Collection


class UnknownEnvError(ValueError):
    """The env id is not registered (or its package is not installed)."""


def check_registered(prefix: str, name: str, registered: Collection[str], what: str) -> None:
    """Raises UnknownEnvError for `prefix + name` when `name` is not in `registered`, naming
    the close matches; `what` says what the name should be (e.g. "a gymnax id")."""
    if name in registered:
        return
    close = difflib.get_close_matches(name, list(registered), n=5, cutoff=0.5)
    hint = f" Did you mean: {', '.join(prefix + c for c in close)}?" if close else ""
    raise UnknownEnvError(f"unknown env {prefix + name!r}: not {what}.{hint}")
