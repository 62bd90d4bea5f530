"""XLA_FLAGS entries a run adds unless the user's XLA_FLAGS names them already.

XLA reads XLA_FLAGS once per process, when JAX starts its first backend; node processes
started meanwhile (local_mp, a local Ray instance) inherit it from the launcher's environment.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping

# XLA's GPU autotuning of convolutions and matmuls at level 1 instead of its default 4: it
# still times the candidate kernels and keeps the fastest, but neither fills their buffers
# first nor checks each candidate's output against a reference. On an H100 that halved the
# cold start of Pong's IMPALA (first update 50.9 s -> 25.2-25.4 s from launch) and its steady
# frame rate was not lower (docs/benchmarks.md). XLA_FLAGS=--xla_gpu_autotune_level=4 restores
# the checks. No effect without a GPU.
FAST_GPU_AUTOTUNE = {"xla_gpu_autotune_level": "1"}


@contextlib.contextmanager
def xla_flags_unless_set(flags: Mapping[str, str]) -> Iterator[None]:
    """Inside, XLA_FLAGS also has `--NAME=VALUE` for each of `flags` whose NAME it does not
    name already. Restored on leaving: a backend started inside keeps the flags, processes
    started afterwards do not inherit them."""
    previous = os.environ.get("XLA_FLAGS")
    added = [f"--{name}={value}" for name, value in flags.items()
             if name not in (previous or "")]
    os.environ["XLA_FLAGS"] = " ".join([previous or "", *added]).strip()
    try:
        yield
    finally:
        if previous is None:
            del os.environ["XLA_FLAGS"]
        else:
            os.environ["XLA_FLAGS"] = previous
