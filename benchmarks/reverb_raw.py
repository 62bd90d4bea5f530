"""dm-reverb's own client paths, the reference figures of benchmarks/replay.py.

Imported by replay.py only where dm-reverb (and so TensorFlow) is installed.
"""

from __future__ import annotations

import reverb
import tensorflow as tf
from replay_items import ITEMS, make_item, rate


def run_reverb_raw(item: str, args) -> dict:
    """Reverb's own client paths on the prioritized table (the reference figures)."""
    max_size = args.max_size[item]
    signature = {k: tf.TensorSpec(s.shape, tf.as_dtype(s.dtype)) for k, s in ITEMS[item].items()}
    table = reverb.Table("prioritized", reverb.selectors.Prioritized(0.6),
                         reverb.selectors.Fifo(), max_size, reverb.rate_limiters.MinSize(1),
                         signature=signature)
    server = reverb.Server([table])
    client = reverb.Client(f"localhost:{server.port}")
    data = make_item(item)
    # One long-lived writer, as Reverb recommends; every item is one squeezed step.
    writer = client.trajectory_writer(num_keep_alive_refs=1)
    try:
        def insert():
            writer.append(data)
            writer.create_item("prioritized", 1.0, {k: writer.history[k][-1] for k in data})
            writer.flush(block_until_num_items=16)  # Bounded in flight, as a real actor.
            return 1

        for _ in range(max_size):
            insert()
        writer.flush()

        def sample():
            return len(list(client.sample("prioritized", num_samples=args.batch_size,
                                          emit_timesteps=False)))

        dataset = reverb.TrajectoryDataset.from_table_signature(
            f"localhost:{server.port}", "prioritized", max_in_flight_samples_per_worker=
            2 * args.batch_size).batch(args.batch_size)
        batches = iter(dataset)
        next(batches)  # Builds the TensorFlow pipeline outside the timing.
        return {"prioritized": {
            "inserts_per_s": rate(insert, args.seconds),
            "samples_per_s": rate(sample, args.seconds),
            "dataset_samples_per_s": rate(lambda: len(next(batches).info.key), args.seconds),
        }}
    finally:
        writer.close()
        server.stop()
