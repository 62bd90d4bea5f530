"""Where central inference's serving thread spends its time, per batch and per worker request.

Usage: python benchmarks/inference_profile.py [--workers 32] [--envs_per_worker 32]
       [--sleep_ms 20] [--seconds 20]

Runs an `InferenceServer` in this process with shared-memory slots, as the learner node does,
and `--workers` env-worker processes (`EnvWorker` stepping `sleep:MS` envs, each its own
process as on local_mp) against it; times the serving thread's phases for `--seconds` once
every worker has stepped, and prints them, then one JSON line:
  wait: `Batching.next_batch` (polling for requests, and waiting for more until the batch
    timeout);
  policy: `BatchedPolicy.act` (the jitted policy on the padded batch and its device_get);
  record: the recorder's copies of each worker's step into its unroll;
  host: the rest of `_serve_batch`: the batch's inputs from the workers' slots, the actions
    back into them, each worker's wake-up.
The policy is a linear one (the IMPALA policy's cost is the learner's business, not the
serving path's); unrolls are dropped once recorded.
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing
import time

import jax
import jax.numpy as jnp
import numpy as np
from common import rounded

from trellis.builders.contract.agent import ArraySpec
from trellis.builders.experiments.env_worker import EnvWorker
from trellis.builders.experiments.inference import InferenceServer, InferenceSettings, ServedPolicy
from trellis.envs import make_env_factory
from trellis.launch.runtime import node_context

# The flags of this script's smoke run in the default test suite (tests/test_benchmarks.py).
SMOKE_FLAGS = ["--workers=2", "--envs_per_worker=4", "--seconds=2"]


def _policy(params, key, obs, state, first):
    del key, first
    logits = obs @ params
    return jnp.argmax(logits, axis=-1).astype(jnp.int32), {"logits": logits}, state


class _ShmOnly:
    """What a worker holds of the learner node: the hub's address; no socket path."""

    def __init__(self, address: str):
        self._address = address

    def shm_address(self) -> str:
        return self._address

    def step(self, worker_id, run_id, inputs, episodes):
        raise RuntimeError("the benchmark's workers step through shared memory only")


def _worker(env_id: str, address: str, worker_id: int, envs: int, stop) -> None:
    node_context.bind_thread(node_context.NodeContext(f"actor/{worker_id}", stop,
                                                      lambda status: None))
    EnvWorker(make_env_factory(env_id), _ShmOnly(address), worker_id, envs,
              seed=worker_id).run()


def _timed(totals: dict[str, float], counts: collections.Counter, name: str, fn):
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            totals[name] += time.perf_counter() - start
            counts[name] += 1
    return wrapper


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=32)
    p.add_argument("--envs_per_worker", type=int, default=32)
    p.add_argument("--sleep_ms", type=float, default=20.0)
    p.add_argument("--seconds", type=float, default=20.0)
    args = p.parse_args()
    env_id = f"sleep:{args.sleep_ms:g}"
    spec = make_env_factory(env_id).spec()
    params = np.random.default_rng(0).normal(
        size=(spec.observation_shape[-1], spec.num_actions)).astype(np.float32)
    stop = multiprocessing.get_context("spawn").Event()
    steps = [0]
    server = InferenceServer(
        ServedPolicy(jax.jit(_policy), params, jax.random.PRNGKey(0), spec,
                     {"logits": ArraySpec((spec.num_actions,), "float32")}),
        InferenceSettings(args.workers, args.envs_per_worker, unroll_length=20,
                          shared_memory=True),
        on_unroll=lambda unroll, versions: None, stop=stop,
        on_steps=lambda n, episodes: steps.__setitem__(0, steps[0] + n))
    server.start()
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_worker, args=(env_id, server.shm_address(), i,
                                                      args.envs_per_worker, stop))
               for i in range(args.workers)]
    for worker in workers:
        worker.start()
    try:
        # Every worker has stepped (its first request came in), and the policy is compiled
        # for every batch size: the smaller sizes compile while serving, at the lowest
        # priority, which 64 workers on 2 cores starve for seconds.
        while (steps[0] < 4 * args.workers * args.envs_per_worker
               or not server.compiled_all):
            time.sleep(0.1)
        totals: dict[str, float] = collections.defaultdict(float)
        counts: collections.Counter = collections.Counter()
        for part, name, label in ((server._batching, "next_batch", "wait"),
                                  (server, "_serve_batch", "batch"),
                                  (server._policy, "act", "policy"),
                                  (server._recorder, "record", "record")):
            setattr(part, name, _timed(totals, counts, label, getattr(part, name)))
        start_steps, start, served = steps[0], time.perf_counter(), server.steps
        time.sleep(args.seconds)
        elapsed, stepped = time.perf_counter() - start, steps[0] - start_steps
        requests = (server.steps - served) // args.envs_per_worker
    finally:
        stop.set()
        for worker in workers:
            worker.join(30)
        server.join(30)
    batches = counts["batch"]
    host = totals["batch"] - totals["policy"] - totals["record"]
    # Every env sleeping its step's time and nothing else; sleep:0 has no such bound.
    ideal = (args.workers * args.envs_per_worker / (args.sleep_ms / 1000) if args.sleep_ms
             else None)
    result = {
        "workers": args.workers, "envs_per_worker": args.envs_per_worker,
        "sleep_ms": args.sleep_ms, "seconds": elapsed,
        "env_steps_per_s": stepped / elapsed,
        "of_ideal": stepped / elapsed / ideal if ideal else None,
        "batches": batches, "requests_per_batch": requests / batches,
        "wait_ms_per_batch": 1e3 * totals["wait"] / batches,
        "policy_ms_per_batch": 1e3 * totals["policy"] / batches,
        "record_us_per_request": 1e6 * totals["record"] / requests,
        "host_us_per_request": 1e6 * host / requests,
        "host_ms_per_batch": 1e3 * host / batches,
    }
    of_ideal = f" ({result['of_ideal']:.2f} of ideal)" if ideal else ""
    print(f"{args.workers} workers x {args.envs_per_worker} envs, {env_id}, {elapsed:.1f} s: "
          f"{result['env_steps_per_s']:,.0f} env steps/s{of_ideal}, "
          f"{batches:,} batches of {result['requests_per_batch']:.1f} requests")
    print(f"  per batch: wait {result['wait_ms_per_batch']:.2f} ms, policy "
          f"{result['policy_ms_per_batch']:.2f} ms, host {result['host_ms_per_batch']:.2f} ms")
    print(f"  per request: host {result['host_us_per_request']:.1f} us (slots in and out, "
          f"wake-up), record {result['record_us_per_request']:.1f} us")
    print(json.dumps(rounded(result)))


if __name__ == "__main__":
    main()
