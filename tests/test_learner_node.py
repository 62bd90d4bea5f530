"""The learner node end to end on threads: stop by budget, its stats, checkpoint and resume."""

import dataclasses

from trellis import launch
from trellis.agents.impala import ImpalaBuilder, ImpalaConfig
from trellis.builders.checkpointing import Checkpoints, checkpoint_dir, latest_checkpoint
from trellis.builders.config import ExperimentConfig
from trellis.builders.program import make_program
from trellis.envs import EnvFactory

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
    running = launch.launch(program, platform="local_mt", block=False)
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
