"""Replay-table throughput: both backends side by side, in-process and from a second process.

Usage (both backends need the dm-reverb environment, `make test-reverb` builds it):
    .venv-reverb/bin/python benchmarks/replay.py [--seconds 2] [--batch_size 32] \
        [--backends native,reverb] [--modes in-process,remote,socket,streamed,reverb-raw]
With only the native backend installed it measures that one.

Items: CartPole-size (length-20 trajectories of float32[4] observations plus int32 actions
and float32 rewards) and Atari-size (length-20 trajectories of uint8[84, 84, 4]). Tables: a
prioritized table (exponent 0.6, MinSize(1), FIFO remover) and a queue (Queue, FIFO,
max_times_sampled=1). "in-process": the client holds the tables; "2nd process": the tables
live in a replay node on local_mp and the benchmark calls it over the program's RPC, one
insert per call, and samples as a `ReplayClient` does by default: batches of 256 KB or more
(Atari-size: 18 MB) through shared memory (the batch's arrays are views of a segment the node
wrote, not read by the timed loop), smaller ones (CartPole-size: 15 KB) over the socket; "2nd,
socket": every batch over the socket; "2nd, streamed":
inserts through a `StreamingWriter` (many inserts per call, confirmed in the background; the
timed span ends once all are confirmed), samples through shared memory.

Steady state: each table is filled to capacity before timing (untimed), so timed inserts
into the prioritized table evict, and the queue is timed over full fill / drain cycles.
Samples are batches of `--batch_size` items. With dm-reverb installed, Reverb's own client
paths are measured too, in-process ("reverb-raw": a `TrajectoryWriter`, `Client.sample`, and the
TensorFlow `TrajectoryDataset`, its fastest sampling path; `reverb_raw.py`), as the
reference to beat.
Prints a table, then one JSON object with every figure as the last line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from common import rounded
from replay_items import ITEMS, make_item, rate

from trellis.launch import runtime
from trellis.reverb_tables import spec as S
from trellis.reverb_tables.client import make_client, reverb_available
from trellis.reverb_tables.node import ReplayClient, ReplayNode, StreamingWriter

# The flags of this script's smoke run in the default test suite (tests/test_benchmarks.py):
# its main path on a budget of seconds.
SMOKE_FLAGS = ["--seconds=0.05", "--batch_size=4", "--backends=native",
               "--modes=in-process,remote,socket,streamed", "--cartpole_max_size=64",
               "--atari_max_size=8"]


def tables(item: str, max_size: int) -> list[S.TableSpec]:
    sig = ITEMS[item]
    return [
        S.TableSpec("prioritized", S.Prioritized(0.6), S.Fifo(), max_size, S.MinSize(1),
                    signature=sig),
        S.TableSpec.queue("queue", max_size, signature=sig),
    ]


def measure(client, item: str, seconds: float, batch_size: int, max_size: int,
            writer: StreamingWriter | None = None) -> dict:
    """Inserts/s and sampled items/s, per table, in steady state.

    Inserts go one per call through `client`, or through `writer` when given (then every
    timed span of inserts ends with `writer.flush()`, so only confirmed inserts count).
    """
    data = make_item(item)
    counter = iter(range(10**9))
    put = client.insert if writer is None else writer.insert
    confirm = (lambda: None) if writer is None else writer.flush

    def insert(table):
        # Fresh arrays per insert, as in a real run: a streamed batch of references to one
        # array would be pickled once (pickle's memo) and overstate the rate.
        put({k: v.copy() for k, v in data.items()}, {table: 1.0 + next(counter) % 7})
        return 1

    def confirmed_rate(table):
        start = time.perf_counter()
        n = 0
        while time.perf_counter() - start < seconds:
            n += insert(table)
        confirm()
        return n / (time.perf_counter() - start)

    for _ in range(max_size):  # Untimed fill: from here on every insert evicts.
        insert("prioritized")
    confirm()
    out = {"prioritized": {
        "inserts_per_s": confirmed_rate("prioritized"),
        "samples_per_s": rate(lambda: len(client.sample("prioritized", batch_size)), seconds),
    }}
    # The queue holds at most max_size items: time whole fill / drain cycles, after an
    # untimed one (so storage is touched once, as in a long run).
    batches = max_size // batch_size
    for _ in range(batches * batch_size):
        insert("queue")
    confirm()
    for _ in range(batches):
        client.sample("queue", batch_size)
    insert_s = sample_s = 0.0
    inserted = sampled = 0
    while insert_s + sample_s < 2 * seconds or not sampled:
        start = time.perf_counter()
        for _ in range(batches * batch_size):
            insert("queue")
        confirm()
        insert_s += time.perf_counter() - start
        start = time.perf_counter()
        for _ in range(batches):
            client.sample("queue", batch_size)
        sample_s += time.perf_counter() - start
        inserted += batches * batch_size
        sampled += batches * batch_size
    out["queue"] = {"inserts_per_s": inserted / insert_s, "samples_per_s": sampled / sample_s}
    return out


def run_in_process(backend, item, args):
    client = make_client(tables(item, args.max_size[item]), backend, seed=0)
    try:
        return measure(client, item, args.seconds, args.batch_size, args.max_size[item])
    finally:
        client.close()


def run_remote(backend, item, args, streamed: bool = False, shared_memory: bool = True):
    program = runtime.Program("replay-benchmark")
    node = program.add_node(runtime.CourierNode(ReplayNode, tables(item, args.max_size[item]),
                                               backend, 0), label="replay")
    with runtime.launch(program, platform="local_mp", block=False):
        client = (ReplayClient(node.dereference()) if shared_memory else
                  ReplayClient(node.dereference(), shared_memory_min_bytes=None))
        writer = StreamingWriter(client) if streamed else None
        try:
            return measure(client, item, args.seconds, args.batch_size, args.max_size[item],
                           writer)
        finally:
            if writer is not None:
                writer.close()
            client.close()


# --modes name -> (the name in the table, how it runs)
MODES = {
    "in-process": ("in-process", run_in_process),
    "remote": ("2nd process", run_remote),
    "socket": ("2nd, socket", lambda b, i, a: run_remote(b, i, a, shared_memory=False)),
    "streamed": ("2nd, streamed", lambda b, i, a: run_remote(b, i, a, streamed=True)),
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=2.0, help="per operation and case")
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--cartpole_max_size", type=int, default=4096)
    p.add_argument("--atari_max_size", type=int, default=512,
                   help="table capacity (the native backend preallocates it: Atari items are "
                        "564 KB each)")
    p.add_argument("--backends", default=None, help="comma list; default: all installed")
    p.add_argument("--modes", default=None,
                   help=f"comma list of {[*MODES, 'reverb-raw']} (reverb-raw: dm-reverb's own "
                        "client, whatever --backends says); default: all, reverb-raw where "
                        "dm-reverb is installed")
    args = p.parse_args()
    modes = (args.modes.split(",") if args.modes else
             [*MODES] + (["reverb-raw"] if reverb_available() else []))
    if unknown := [m for m in modes if m not in (*MODES, "reverb-raw")]:
        print(f"replay.py: unknown --modes {unknown}; choose from {[*MODES, 'reverb-raw']}",
              file=sys.stderr)
        sys.exit(2)
    args.max_size = {"cartpole": args.cartpole_max_size, "atari": args.atari_max_size}
    backends = (args.backends.split(",") if args.backends else
                ["native"] + (["reverb"] if reverb_available() else []))
    results: dict = {"batch_size": args.batch_size, "seconds": args.seconds,
                     "max_size": args.max_size}
    rows = []
    cases = [(backend, *MODES[mode]) for mode in modes if mode in MODES
             for backend in backends]
    if "reverb-raw" in modes:
        from reverb_raw import run_reverb_raw  # dm-reverb and TensorFlow: only where installed.

        cases.append(("reverb-raw", "in-process", lambda b, i, a: run_reverb_raw(i, a)))
    for item in ("cartpole", "atari"):
        for backend, mode, fn in cases:
            print(f"measuring {backend} {item} {mode} ...", flush=True)
            r = fn(backend, item, args)
            results[f"{backend}/{item}/{mode}"] = r
            for t, v in r.items():
                rows.append((backend, item, mode, t, v["inserts_per_s"], v["samples_per_s"],
                             v.get("dataset_samples_per_s")))
    print()
    print(f"{'backend':<11}{'item':<10}{'where':<15}{'table':<13}{'inserts/s':>11}"
          f"{'sampled items/s':>17}{'  (TrajectoryDataset)':>22}")
    for b, i, m, t, ins, smp, ds in rows:
        extra = f"{ds:>22,.0f}" if ds is not None else ""
        print(f"{b:<11}{i:<10}{m:<15}{t:<13}{ins:>11,.0f}{smp:>17,.0f}{extra}")
    print(json.dumps(rounded(results)))


if __name__ == "__main__":
    main()
