"""Runs a script in a fresh Python that sees several (forced) host CPU devices.

XLA fixes the device count at JAX's first use, so data-parallel tests run their learners in
a subprocess with XLA_FLAGS=--xla_force_host_platform_device_count=N.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any


def run_with_cpu_devices(script: str, num_devices: int = 2, timeout: float = 120) -> Any:
    """Runs `script` with `num_devices` CPU devices; returns its last stdout line, as JSON."""
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=f"--xla_force_host_platform_device_count={num_devices}")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=env, timeout=timeout)
    if out.returncode:
        raise AssertionError(f"script failed ({out.returncode}):\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])
