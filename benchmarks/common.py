"""Helpers shared by the benchmark scripts (run as `python benchmarks/NAME.py`)."""

from __future__ import annotations

import os


def rounded(value):
    """Floats in nested dicts and lists rounded to 0.1, for the one-line JSON benchmarks print."""
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [rounded(v) for v in value]
    return round(value, 1) if isinstance(value, float) else value


def cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
