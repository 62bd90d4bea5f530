"""SGD throughput of the data-parallel IMPALA learner per process and device count.

For each count of processes (1, and e.g. 2: one learner across processes, a `jax.distributed`
group as `--learner_processes` makes; builders/experiments/distributed.py) and of devices per
process (1, 2 and 4), fresh Pythons (XLA fixes the device count at JAX's first use) time
jitted IMPALA updates on random global batches of [T + 1, B] steps, each process feeding its
B / processes share, on vector (CartPole-size, 4 floats) and on Atari-size (84x84x4 uint8)
observations. Processes agree before every update as the learner loop does
(`LearnerGroup.agree`, a small all-gather), so their figures include it. On a CPU machine the
devices are forced host devices (XLA_FLAGS=--xla_force_host_platform_device_count=N) and the
processes share the same cores, so more of them add no compute there (and the processes'
gradients go through gloo's CPU collectives); on a GPU machine JAX uses the accelerators it
finds (pass `--devices` with counts it has, per process).

Usage: python benchmarks/learner.py [--processes 1,2] [--devices 1,2,4] [--inputs vector,atari]
       [--batch_size 32] [--unroll_length 20] [--seconds 5]
Prints a table, then one JSON object with every figure as the last line ("devices": the
single-process figures by device count, "processes": {processes: {devices per process: ...}}).
Samples/s counts the B * T transitions each update learns from.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
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


def measure(input_name: str, num_devices: int, args, group) -> dict:
    """Updates/s and samples/s of IMPALA's learner on `num_devices` devices of this process
    (and as many of each other process of `group`, a `distributed.LearnerGroup`)."""
    import jax
    import numpy as np

    from trellis.agents.impala import ImpalaBuilder, ImpalaConfig
    from trellis.envs.specs import EnvSpec

    shape, dtype, actions = INPUTS[input_name]
    spec = EnvSpec(shape, dtype, actions, (), "int32")
    config = ImpalaConfig(batch_size=args.batch_size, unroll_length=args.unroll_length)
    builder = ImpalaBuilder(config)
    devices = [d for p in range(group.processes)
               for d in [d for d in jax.devices() if d.process_index == p][:num_devices]]
    learner = builder.make_learner(builder.make_networks(spec), spec, jax.random.PRNGKey(0),
                                   devices=devices)
    rng = np.random.default_rng(0)
    # This process's share of the global batch of args.batch_size.
    steps, b = args.unroll_length + 1, args.batch_size // group.processes
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
    # Process 0's clock ends the timing for all: every update is a collective.
    while not group.agree(True, time.perf_counter() - start >= args.seconds, 0).stop:
        jax.block_until_ready(learner.step(batch))
        updates += 1
    elapsed = time.perf_counter() - start
    return {"updates_per_s": updates / elapsed,
            "samples_per_s": updates * args.batch_size * args.unroll_length / elapsed}


def run_children(processes: int, num_devices: int, args) -> dict:
    """Runs `measure` for every input in `processes` fresh Pythons of one learner group,
    each seeing `num_devices` devices; process 0's figures."""
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={num_devices}")
    with socket.socket() as sock:  # A port for the group's coordination service.
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    children = [subprocess.Popen(
        [sys.executable, __file__, f"--child={num_devices}", f"--processes={processes}",
         f"--process={i}", f"--port={port}", f"--inputs={args.inputs}",
         f"--batch_size={args.batch_size}", f"--unroll_length={args.unroll_length}",
         f"--seconds={args.seconds}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=env) for i in range(processes)]
    outs = [child.communicate() for child in children]
    for child, (_, err) in zip(children, outs, strict=True):
        if child.returncode:
            raise RuntimeError(f"{processes} process(es) x {num_devices} device(s): benchmark "
                               f"failed:\n{err[-3000:]}")
    return json.loads(outs[0][0].strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--processes", default="1",
                   help="learner process counts, comma-separated (one jax.distributed group)")
    p.add_argument("--devices", default="1,2,4",
                   help="device counts per process, comma-separated")
    p.add_argument("--inputs", default=",".join(INPUTS),
                   help=f"observations, comma-separated, of {sorted(INPUTS)}")
    p.add_argument("--batch_size", type=int, default=32, help="B, unrolls per update")
    p.add_argument("--unroll_length", type=int, default=20, help="T")
    p.add_argument("--seconds", type=float, default=5.0, help="timed per input and count")
    p.add_argument("--child", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--process", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    inputs = args.inputs.split(",")
    if unknown := [name for name in inputs if name not in INPUTS]:
        p.error(f"unknown --inputs {unknown}; choose from {sorted(INPUTS)}")
    if args.child:
        from trellis.builders.experiments import distributed

        processes = int(args.processes)
        group = (distributed.initialize(f"127.0.0.1:{args.port}", processes, args.process)
                 if processes > 1 else distributed.LearnerGroup())
        import jax

        if len(jax.local_devices()) < args.child:
            raise SystemExit(f"asked for {args.child} devices, JAX sees "
                             f"{len(jax.local_devices())}")
        result = {name: measure(name, args.child, args, group) for name in inputs}
        result["backend"] = jax.default_backend()
        print(json.dumps(result))
        return

    counts = [int(n) for n in args.devices.split(",")]
    process_counts = [int(n) for n in args.processes.split(",")]
    if bad := [n for n in process_counts if args.batch_size % n]:
        p.error(f"--processes {bad} must divide --batch_size={args.batch_size}")
    results: dict = {"batch_size": args.batch_size, "unroll_length": args.unroll_length,
                     "machine": platform.machine(), "cpus": os.cpu_count(), "processes": {}}
    for processes in process_counts:
        for n in counts:
            print(f"timing {processes} process(es) x {n} device(s) ...", flush=True)
            results["processes"].setdefault(str(processes), {})[str(n)] = run_children(
                processes, n, args)
    results["devices"] = results["processes"].get("1", {})
    first = results["processes"][str(process_counts[0])][str(counts[0])]
    print()
    print(f"IMPALA learner, B={args.batch_size} x T={args.unroll_length}, "
          f"backend {first['backend']}")
    print(f"{'processes':>9}{'devices':>8}{'input':>8}{'updates/s':>12}{'samples/s':>14}")
    for processes in process_counts:
        for n in counts:
            for name in inputs:
                r = results["processes"][str(processes)][str(n)][name]
                print(f"{processes:>9}{n:>8}{name:>8}{r['updates_per_s']:>12,.1f}"
                      f"{r['samples_per_s']:>14,.0f}")
    print(json.dumps(rounded(results)))


if __name__ == "__main__":
    main()
