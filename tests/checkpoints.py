"""Damaging a checkpoint as a full disk or a copy cut short would, for the tests of what reads
it (--resume, evaluate.py, trellis.load)."""

from __future__ import annotations

import os


def truncate_state(checkpoint: str) -> None:
    """Truncates every file of a checkpoint's state."""
    for folder, _, files in os.walk(os.path.join(checkpoint, "state")):
        for name in files:
            with open(os.path.join(folder, name), "r+b") as f:
                f.truncate(0)
