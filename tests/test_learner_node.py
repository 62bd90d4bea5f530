"""The learner node: its unroll feed, and end to end on threads: budget stop, stats, resume."""

import dataclasses
import threading

import numpy as np

from trellis.agents.impala import ImpalaBuilder, ImpalaConfig
from trellis.builders.contract.config import ExperimentConfig
from trellis.builders.experiments.checkpointing import (
    Checkpoints,
    checkpoint_dir,
    latest_checkpoint,
)
from trellis.builders.experiments.feeds import UnrollFeed
from trellis.builders.experiments.program import make_program
from trellis.builders.experiments.unroll_queue import LocalUnrollQueue
from trellis.envs import EnvFactory
from trellis.launch import runtime

# Every key of `stats()` besides the learner's metrics: run directories depend on them.
STATS_KEYS = {
    "env_steps", "learner_steps", "episodes", "mean_return", "min_return", "max_return",
    "returns_in_window", "mean_episode_length", "evaluation", "elapsed_s", "resumes",
    "env_steps_per_s", "inference_batches", "slot_resets", "queue_size",
}
PROGRESS_KEYS = {"env_steps", "learner_steps", "episodes", "returns", "lengths", "elapsed_s",
                 "resumes"}


def _run(config, checkpoints):
    """Runs IMPALA on CartPole on threads until it stops by itself; its LaunchResult."""
    builder = ImpalaBuilder(ImpalaConfig(batch_size=8, unroll_length=10))
    program = make_program(builder, EnvFactory("CartPole-v1"), config, name="learner_node",
                           checkpoints=checkpoints)
    running = runtime.launch(program, platform="local_mt", block=False)
    try:
        result = running.wait(timeout=120)
    finally:
        running.stop()
    assert result is not None, "the run did not stop by itself"
    return result


def test_budget_stop_reports_every_stat_and_checkpoints_the_same_counts(tmp_path):
    config = ExperimentConfig(num_actors=1, envs_per_actor=8, total_env_steps=3_000,
                              return_window=5, log_every_s=0.1, eval_every=0)
    result = _run(config, Checkpoints(checkpoint_dir(str(tmp_path))))

    assert (result.stopped_by, result.reason) == ("requested", "budget"), result
    stats = result.info
    assert STATS_KEYS <= set(stats), STATS_KEYS - set(stats)
    assert {"loss", "entropy"} <= set(stats), "the learner's metrics are reported too"
    assert stats["env_steps"] >= config.total_env_steps and stats["learner_steps"] > 0
    assert 0 < stats["returns_in_window"] <= config.return_window
    assert stats["resumes"] == 0 and stats["evaluation"] is None
    # The last checkpoint is written before the stop request, so it holds the same counts.
    step, progress = latest_checkpoint(str(tmp_path))
    assert set(progress) == PROGRESS_KEYS
    assert step == progress["env_steps"] == stats["env_steps"]
    assert progress["learner_steps"] == stats["learner_steps"]
    assert progress["episodes"] == stats["episodes"]
    assert len(progress["returns"]) == stats["returns_in_window"]

    # Resumed with a larger budget, the counters go on from the checkpoint.
    more = dataclasses.replace(config, total_env_steps=step + 2_000)
    resumed = _run(more, Checkpoints(checkpoint_dir(str(tmp_path)), resume_step=step)).info
    assert resumed["resumes"] == 1
    assert resumed["env_steps"] >= step + 2_000
    assert resumed["learner_steps"] > progress["learner_steps"]
    assert resumed["episodes"] > progress["episodes"]
    assert resumed["elapsed_s"] > progress["elapsed_s"]


def chunk(first_column, columns, t=3):
    """An unroll chunk [T + 1, K] whose column j holds the number first_column + j."""
    return {"x": np.tile(np.arange(first_column, first_column + columns), (t + 1, 1))}


def test_feed_batches_unrolls_in_order_across_chunk_boundaries():
    feed = UnrollFeed(LocalUnrollQueue(max_unrolls=4), batch_size=3, stop=threading.Event())
    for first in (0, 2, 4):  # Three chunks of two columns: 0..5.
        feed.put(chunk(first, 2))
    assert feed.size() == 3
    batches = [feed.next_batch(), feed.next_batch()]
    assert [b["x"][0].tolist() for b in batches] == [[0, 1, 2], [3, 4, 5]]
    assert all(b["x"].shape == (4, 3) for b in batches)
    assert feed.next_batch() is None  # Dry: no partial batch.


def test_feed_put_on_a_full_queue_gives_up_at_the_stop():
    stop = threading.Event()
    feed = UnrollFeed(LocalUnrollQueue(max_unrolls=1), batch_size=2, stop=stop)
    feed.put(chunk(0, 2))
    blocked = threading.Thread(target=feed.put, args=(chunk(2, 2),))
    blocked.start()
    blocked.join(timeout=0.5)
    assert blocked.is_alive(), "put must wait while the queue is full"
    stop.set()
    blocked.join(timeout=10)
    assert not blocked.is_alive(), "put must return once the program stops"
    assert feed.size() == 1
