"""Replay-table throughput: both backends side by side, in-process and from a second process.

Usage (both backends need the dm-reverb environment, `make test-reverb` builds it):
    .venv-reverb/bin/python benchmarks/replay.py [--seconds 2] [--batch_size 32]
With only the native backend installed it measures that one.

Items: CartPole-size (length-20 trajectories of float32[4] observations plus int32 actions
and float32 rewards) and Atari-size (length-20 trajectories of uint8[84, 84, 4]). Tables: a
prioritized table (exponent 0.6, MinSize(1), uniform remover FIFO) and a queue (Queue,
FIFO, max_times_sampled=1). "in-process": the client holds the tables; "2nd process": the
tables live in a replay node on local_mp and the benchmark calls it over the program's RPC.
Prints a table, then one JSON object with every figure as the last line.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from common import rounded

import launch
from reverb_tables import spec as S
from reverb_tables.client import make_client, reverb_available
from reverb_tables.node import ReplayNode

ITEMS = {
    "cartpole": {"obs": S.ArraySpec((20, 4), np.float32), "action": S.ArraySpec((20,), np.int32),
                 "reward": S.ArraySpec((20,), np.float32)},
    "atari": {"obs": S.ArraySpec((20, 84, 84, 4), np.uint8), "action": S.ArraySpec((20,), np.int32),
              "reward": S.ArraySpec((20,), np.float32)},
}


def tables(item: str, max_size: int) -> list[S.TableSpec]:
    sig = ITEMS[item]
    return [
        S.TableSpec("prioritized", S.Prioritized(0.6), S.Fifo(), max_size, S.MinSize(1),
                    signature=sig),
        S.TableSpec("queue", S.Fifo(), S.Fifo(), max_size, S.Queue(max_size),
                    max_times_sampled=1, signature=sig),
    ]


def make_item(item: str, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {k: (rng.integers(0, 255, s.shape) if s.dtype == np.uint8 else
                rng.normal(size=s.shape)).astype(s.dtype) for k, s in ITEMS[item].items()}


def measure(client, table: str, item: str, seconds: float, batch_size: int,
            max_size: int) -> dict[str, float]:
    """Inserts/s (one item per call) for `seconds`, then sampled items/s (batches)."""
    rng = np.random.default_rng(0)
    data = make_item(item, rng)
    n, start = 0, time.perf_counter()
    limit = max_size  # The queue blocks when full: never insert more than it holds.
    while time.perf_counter() - start < seconds and n < limit:
        client.insert(data, {table: 1.0 + (n % 7)})
        n += 1
    inserts_per_s = n / (time.perf_counter() - start)
    sampled, start = 0, time.perf_counter()
    available = n if table == "queue" else float("inf")
    while time.perf_counter() - start < seconds and sampled + batch_size <= available:
        client.sample(table, batch_size)
        sampled += batch_size
    return {"inserts_per_s": inserts_per_s,
            "samples_per_s": sampled / (time.perf_counter() - start)}


def run_in_process(backend, item, args):
    client = make_client(tables(item, args.max_size), backend, seed=0)
    try:
        return {t: measure(client, t, item, args.seconds, args.batch_size, args.max_size)
                for t in ("prioritized", "queue")}
    finally:
        client.close()


def run_remote(backend, item, args):
    program = launch.Program("replay-benchmark")
    node = program.add_node(launch.CourierNode(ReplayNode, tables(item, args.max_size), backend,
                                               0), label="replay")
    with launch.launch(program, platform="local_mp", block=False):
        client = node.dereference()
        return {t: measure(client, t, item, args.seconds, args.batch_size, args.max_size)
                for t in ("prioritized", "queue")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=2.0, help="per operation and case")
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--max_size", type=int, default=5_000,
                   help="table capacity (the native backend preallocates it: Atari items are "
                        "564 KB each)")
    p.add_argument("--backends", default=None, help="comma list; default: all installed")
    args = p.parse_args()
    backends = (args.backends.split(",") if args.backends else
                ["native"] + (["reverb"] if reverb_available() else []))
    results: dict = {"batch_size": args.batch_size, "seconds": args.seconds}
    rows = []
    for item in ("cartpole", "atari"):
        for mode, fn in (("in-process", run_in_process), ("2nd process", run_remote)):
            for backend in backends:
                print(f"measuring {backend} {item} {mode} ...", flush=True)
                r = fn(backend, item, args)
                results[f"{backend}/{item}/{mode}"] = r
                for t, v in r.items():
                    rows.append((backend, item, mode, t, v["inserts_per_s"], v["samples_per_s"]))
    print()
    print(f"{'backend':<8}{'item':<10}{'where':<13}{'table':<13}{'inserts/s':>11}"
          f"{'sampled items/s':>17}")
    for b, i, m, t, ins, smp in rows:
        print(f"{b:<8}{i:<10}{m:<13}{t:<13}{ins:>11,.0f}{smp:>17,.0f}")
    print(json.dumps(rounded(results)))



if __name__ == "__main__":
    main()
