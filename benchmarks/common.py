"""Helpers shared by the benchmark scripts (run as `python benchmarks/NAME.py`)."""

from __future__ import annotations

import os


def rounded(value):
    """Floats in nested dicts rounded to 0.1, for the one-line JSON each benchmark prints."""
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    return round(value, 1) if isinstance(value, float) else value


def cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
