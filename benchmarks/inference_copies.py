"""Time central inference's host copies of pixel steps: a batch's gather, and the recording.

Usage: python benchmarks/inference_copies.py [--workers 14] [--envs_per_worker 32]
       [--obs_shape 4,84,84] [--unroll_length 20] [--rounds 400] [--repeats 3]

Per round, as the inference thread does for a batch of every worker's step (uint8
observations of `--obs_shape`, and IMPALA's other fields): `gather` copies the workers' rows
of the shared slots [W, K, ...] into the policy's batch (in reverse worker order, as requests
come in any order), then `UnrollRecorder.record` copies each worker's step into its unroll;
the unrolls it hands over are joined into learner batches of 4 unrolls and dropped, as the
learner's feed does. Prints, for each repeat after a warm-up, the time per batch of the
gather and per worker step of the recording (the joins excluded), then one JSON line with
the medians and the rates they give (`*_per_s`).
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
from trellis.builders.experiments.inference_batching import gather
from trellis.builders.experiments.unroll_recorder import UnrollRecorder

# The flags of this script's smoke run in the default test suite (tests/test_benchmarks.py).
SMOKE_FLAGS = ["--workers=2", "--envs_per_worker=4", "--rounds=30", "--repeats=1"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=14)
    p.add_argument("--envs_per_worker", type=int, default=32)
    p.add_argument("--obs_shape", default="4,84,84")
    p.add_argument("--unroll_length", type=int, default=20)
    p.add_argument("--rounds", type=int, default=400)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    w, k = args.workers, args.envs_per_worker
    obs_shape = tuple(int(d) for d in args.obs_shape.split(","))
    specs = {"obs": ArraySpec(obs_shape, np.uint8), "first": ArraySpec((), np.bool_),
             "reward": ArraySpec((), np.float32), "action": ArraySpec((), np.int32),
             "logits": ArraySpec((6,), np.float32)}
    rng = np.random.default_rng(0)
    slots = {name: (rng.integers(0, 256, (w, k, *s.shape), np.uint8) if name == "obs"
                    else s.zeros((w, k))) for name, s in specs.items()}
    batch = {name: s.zeros((w * k,)) for name, s in specs.items()}
    workers = np.arange(w)[::-1].copy()
    batcher = UnrollBatcher(sizes=(4 * k,))
    joining = [0.0]

    def on_unroll(unroll, versions):
        batcher.add(unroll)
        start = time.perf_counter()
        batcher.pop()  # Joined once 4 unrolls are in, then dropped.
        joining[0] += time.perf_counter() - start

    recorder = UnrollRecorder(specs, w, k, args.unroll_length, on_unroll)
    gather_ms, record_us = [], []
    for repeat in range(args.repeats + 1):  # The first warms the allocator up.
        joining[0] = gathering = 0.0
        start = time.perf_counter()
        for _ in range(args.rounds):
            before = time.perf_counter()
            for name, rows in slots.items():
                gather(rows, workers, batch[name])
            gathering += time.perf_counter() - before
            recorder.record([(worker, 0) for worker in workers],
                            {name: v.reshape(w, k, *v.shape[1:]) for name, v in batch.items()})
        recording = time.perf_counter() - start - gathering - joining[0]
        if repeat:
            gather_ms.append(1e3 * gathering / args.rounds)
            record_us.append(1e6 * recording / (args.rounds * w))
            print(f"repeat {repeat}: gather {gather_ms[-1]:.2f} ms per batch of {w} workers, "
                  f"record {record_us[-1]:.1f} us per worker step ({joining[0]:.2f} s joining "
                  "batches besides)", flush=True)
    step_mb = k * np.prod(obs_shape) / 1e6
    median_gather, median_record = statistics.median(gather_ms), statistics.median(record_us)
    print(f"median: gather {median_gather:.2f} ms per batch, record {median_record:.1f} us per "
          f"worker step ({step_mb:.2f} MB of observations a step)")
    print(json.dumps(rounded({
        "workers": w, "envs_per_worker": k, "obs_shape": list(obs_shape),
        "unroll_length": args.unroll_length, "rounds": args.rounds,
        "gather_ms_per_batch": gather_ms, "record_us_per_step": record_us,
        "gathered_batches_per_s": 1e3 / median_gather,
        "recorded_worker_steps_per_s": 1e6 / median_record})))


if __name__ == "__main__":
    main()
