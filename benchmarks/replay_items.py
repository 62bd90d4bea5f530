"""The items of the replay benchmark (CartPole- and Atari-size trajectories) and its timer.

Shared by benchmarks/replay.py and benchmarks/reverb_raw.py (dm-reverb's own client paths).
"""

from __future__ import annotations

import time

import numpy as np

from trellis.reverb_tables import spec as S

ITEMS = {
    "cartpole": {"obs": S.ArraySpec((20, 4), np.float32), "action": S.ArraySpec((20,), np.int32),
                 "reward": S.ArraySpec((20,), np.float32)},
    "atari": {"obs": S.ArraySpec((20, 84, 84, 4), np.uint8), "action": S.ArraySpec((20,), np.int32),
              "reward": S.ArraySpec((20,), np.float32)},
}


def make_item(item: str) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {k: (rng.integers(0, 255, s.shape) if s.dtype == np.uint8 else
                rng.normal(size=s.shape)).astype(s.dtype) for k, s in ITEMS[item].items()}


def rate(fn, seconds: float) -> float:
    """Calls `fn()` (which returns items done) for `seconds`; items per second."""
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        n += fn()
    return n / (time.perf_counter() - start)
