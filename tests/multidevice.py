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

import numpy as np


def run_with_cpu_devices(script: str, num_devices: int = 2, timeout: float = 120) -> Any:
    """Runs `script` with `num_devices` CPU devices; returns its last stdout line, as JSON."""
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=f"--xla_force_host_platform_device_count={num_devices}")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=env, timeout=timeout)
    if out.returncode:
        raise AssertionError(f"script failed ({out.returncode}):\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def assert_devices_match(result: dict[str, Any]) -> None:
    """`result` maps a device count to {"params", "loss", "shards"} after the same updates:
    every count's params (replicated on all its devices) and loss match 1 device's."""
    one = result["1"]
    for n, many in result.items():
        assert many["shards"] == int(n)  # Params replicated on every device.
        for a, b in zip(one["params"], many["params"], strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(one["loss"], many["loss"], rtol=1e-5)
