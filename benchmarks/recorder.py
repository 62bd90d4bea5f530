"""Time central inference's recording of a step into its worker's unroll, with pixel steps.

Usage: python benchmarks/recorder.py [--workers 14] [--envs_per_worker 32]
       [--obs_shape 84,84,4] [--unroll_length 20] [--rounds 400] [--repeats 3]

Records `--rounds` steps of every worker (each step: K uint8 observations of `--obs_shape`,
and IMPALA's other fields) through an `UnrollRecorder`, as the inference thread does after
each batch, while the unrolls it hands over are joined into learner batches of 4 unrolls
and dropped, as the learner's feed does. Prints the time per recorded worker step
(excluding the joins) for each repeat after a warm-up, then one JSON line
(`worker_steps_per_s`: worker steps recorded per second of recording, from the median).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
from common import rounded

from trellis.builders.contract.agent import ArraySpec
from trellis.builders.experiments.feeds import UnrollBatcher
from trellis.builders.experiments.inference import UnrollRecorder

# The flags of this script's smoke run in the default test suite (tests/test_benchmarks.py).
SMOKE_FLAGS = ["--workers=2", "--envs_per_worker=4", "--rounds=30", "--repeats=1"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=14)
    p.add_argument("--envs_per_worker", type=int, default=32)
    p.add_argument("--obs_shape", default="84,84,4")
    p.add_argument("--unroll_length", type=int, default=20)
    p.add_argument("--rounds", type=int, default=400)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    w, k = args.workers, args.envs_per_worker
    obs_shape = tuple(int(d) for d in args.obs_shape.split(","))
    specs = {"obs": ArraySpec(obs_shape, np.uint8), "first": ArraySpec((), np.bool_),
             "reward": ArraySpec((), np.float32), "action": ArraySpec((), np.int32),
             "logits": ArraySpec((6,), np.float32)}
    batcher = UnrollBatcher(sizes=(4 * k,))
    joining = [0.0]

    def on_unroll(unroll, versions):
        batcher.add(unroll)
        start = time.perf_counter()
        batcher.pop()  # Joined once 4 unrolls are in, then dropped.
        joining[0] += time.perf_counter() - start

    recorder = UnrollRecorder(specs, w, k, args.unroll_length, on_unroll)
    rng = np.random.default_rng(0)
    steps = [{name: (rng.integers(0, 256, (k, *s.shape), np.uint8) if name == "obs"
                     else s.zeros((k,))) for name, s in specs.items()} for _ in range(w)]
    per_step_us = []
    for repeat in range(args.repeats + 1):  # The first warms the allocator up.
        joining[0] = 0.0
        start = time.perf_counter()
        for _ in range(args.rounds):
            for worker, step in enumerate(steps):
                recorder.record(worker, 0, step)
        elapsed = time.perf_counter() - start - joining[0]
        if repeat:
            per_step_us.append(1e6 * elapsed / (args.rounds * w))
            print(f"repeat {repeat}: {per_step_us[-1]:.1f} us per recorded worker step "
                  f"({joining[0]:.2f} s joining batches besides)", flush=True)
    step_mb = k * np.prod(obs_shape) / 1e6
    print(f"median {statistics.median(per_step_us):.1f} us per worker step of {k} envs "
          f"({step_mb:.2f} MB of observations)")
    print(json.dumps(rounded({"workers": w, "envs_per_worker": k, "obs_shape": list(obs_shape),
                              "unroll_length": args.unroll_length, "rounds": args.rounds,
                              "record_us_per_step": per_step_us,
                              "median_record_us_per_step": statistics.median(per_step_us),
                              "worker_steps_per_s": 1e6 / statistics.median(per_step_us)})))


if __name__ == "__main__":
    main()
