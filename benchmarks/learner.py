"""SGD throughput of the data-parallel IMPALA learner per device count.

For 1, 2 and 4 devices, a fresh Python (XLA fixes the device count at JAX's first use) times
jitted IMPALA updates on random batches of [T + 1, B] steps, on vector (CartPole-size, 4
floats) and on Atari-size (84x84x4 uint8) observations. On a CPU machine the devices are
forced host devices (XLA_FLAGS=--xla_force_host_platform_device_count=N) that share the same
cores, so more of them add no compute there; on a GPU machine JAX uses the accelerators it
finds (pass `--devices` with counts it has).

Usage: python benchmarks/learner.py [--devices 1,2,4] [--inputs vector,atari] [--batch_size 32]
       [--unroll_length 20] [--seconds 5]
Prints a table, then one JSON object with every figure as the last line. Samples/s counts
the B * T transitions each update learns from.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

from common import rounded

# The flags of this script's smoke run in the default test suite (tests/test_benchmarks.py):
# its main path on a budget of seconds.
SMOKE_FLAGS = ["--devices=1", "--inputs=vector", "--seconds=0.2", "--batch_size=2",
               "--unroll_length=2"]

# Input name -> (observation shape, dtype, actions).
INPUTS = {
    "vector": ((4,), "float32", 2),
    "atari": ((84, 84, 4), "uint8", 6),
}


def measure(input_name: str, num_devices: int, args) -> dict:
    """Updates/s and samples/s of IMPALA's learner on `num_devices` devices (in this process)."""
    import jax
    import numpy as np

    from trellis.agents.impala import ImpalaBuilder, ImpalaConfig
    from trellis.envs.specs import EnvSpec

    shape, dtype, actions = INPUTS[input_name]
    spec = EnvSpec(shape, dtype, actions, (), "int32")
    config = ImpalaConfig(batch_size=args.batch_size, unroll_length=args.unroll_length)
    builder = ImpalaBuilder(config)
    learner = builder.make_learner(builder.make_networks(spec), spec, jax.random.PRNGKey(0),
                                   devices=jax.devices()[:num_devices])
    rng = np.random.default_rng(0)
    steps, b = args.unroll_length + 1, args.batch_size
    obs = rng.integers(0, 256, (steps, b) + shape) if dtype == "uint8" else rng.normal(
        size=(steps, b) + shape)
    batch = {
        "obs": obs.astype(dtype),
        "action": rng.integers(0, actions, (steps, b)).astype(np.int32),
        "logits": rng.normal(size=(steps, b, actions)).astype(np.float32),
        "reward": rng.normal(size=(steps, b)).astype(np.float32),
        "terminated": rng.random((steps, b)) < 0.01,
        "truncated": np.zeros((steps, b), bool),
        "first": rng.random((steps, b)) < 0.01,
    }
    jax.block_until_ready(learner.step(batch))  # Compile outside the timing.
    updates, start = 0, time.perf_counter()
    while time.perf_counter() - start < args.seconds:
        jax.block_until_ready(learner.step(batch))
        updates += 1
    elapsed = time.perf_counter() - start
    return {"updates_per_s": updates / elapsed,
            "samples_per_s": updates * b * args.unroll_length / elapsed}


def run_child(num_devices: int, args) -> dict:
    """Runs `measure` for every input in a fresh Python that sees `num_devices` devices."""
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={num_devices}")
    command = [sys.executable, __file__, f"--child={num_devices}", f"--inputs={args.inputs}",
               f"--batch_size={args.batch_size}", f"--unroll_length={args.unroll_length}",
               f"--seconds={args.seconds}"]
    out = subprocess.run(command, capture_output=True, text=True, env=env)
    if out.returncode:
        raise RuntimeError(f"{num_devices} device(s): benchmark failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--devices", default="1,2,4", help="device counts, comma-separated")
    p.add_argument("--inputs", default=",".join(INPUTS),
                   help=f"observations, comma-separated, of {sorted(INPUTS)}")
    p.add_argument("--batch_size", type=int, default=32, help="B, unrolls per update")
    p.add_argument("--unroll_length", type=int, default=20, help="T")
    p.add_argument("--seconds", type=float, default=5.0, help="timed per input and count")
    p.add_argument("--child", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    inputs = args.inputs.split(",")
    if unknown := [name for name in inputs if name not in INPUTS]:
        p.error(f"unknown --inputs {unknown}; choose from {sorted(INPUTS)}")
    if args.child:
        import jax

        if len(jax.devices()) < args.child:
            raise SystemExit(f"asked for {args.child} devices, JAX sees {len(jax.devices())}")
        result = {name: measure(name, args.child, args) for name in inputs}
        result["backend"] = jax.default_backend()
        print(json.dumps(result))
        return

    counts = [int(n) for n in args.devices.split(",")]
    results: dict = {"batch_size": args.batch_size, "unroll_length": args.unroll_length,
                     "machine": platform.machine(), "cpus": os.cpu_count(), "devices": {}}
    for n in counts:
        print(f"timing {n} device(s) ...", flush=True)
        results["devices"][str(n)] = run_child(n, args)
    print()
    print(f"IMPALA learner, B={args.batch_size} x T={args.unroll_length}, "
          f"backend {results['devices'][str(counts[0])]['backend']}")
    print(f"{'devices':>8}{'input':>8}{'updates/s':>12}{'samples/s':>14}")
    for n in counts:
        for name in inputs:
            r = results["devices"][str(n)][name]
            print(f"{n:>8}{name:>8}{r['updates_per_s']:>12,.1f}{r['samples_per_s']:>14,.0f}")
    print(json.dumps(rounded(results)))


if __name__ == "__main__":
    main()
