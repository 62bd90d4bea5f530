"""The replay ratio (`--replay_ratio`: SGD steps per env step, e.g. SAC's and TD3's one): a
learner step runs as many calls of `updates_per_step` as its unrolls' env steps owe, whatever
their number (hand-counted below); and in whole runs the SGD steps per env step stay within 10%
of the setting both when the env workers outrun the learner (fast envs, a slow learner) and
when they lag behind it (envs that sleep, a quick learner); on anakin each iteration's updates
follow the ratio."""

from __future__ import annotations

import json
import time

import gymnasium as gym
import jax
import numpy as np
import pytest

from trellis.agents.sac import SACBuilder, SACConfig
from trellis.builders.experiments.anakin import ReplaySettings
from trellis.envs.specs import EnvSpec
from trellis.launch import run

SPEC = EnvSpec((3,), "float32", None, (1,), "float32", action_low=(-2.0,), action_high=(2.0,))


def _unrolls(t: int, b: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """b unrolls of t env steps ([t + 1, b]: the next unroll's first step closes each)."""
    return {
        "obs": rng.normal(size=(t + 1, b, 3)).astype(np.float32),
        "action": rng.uniform(-2, 2, size=(t + 1, b, 1)).astype(np.float32),
        "reward": rng.normal(size=(t + 1, b)).astype(np.float32),
        "terminated": np.zeros((t + 1, b), bool),
        "truncated": np.zeros((t + 1, b), bool),
        "first": np.zeros((t + 1, b), bool),
    }


def _learner(**config):
    builder = SACBuilder(SACConfig(hidden_sizes=(8,), sample_batch_size=4, n_step=1, **config))
    return builder.make_learner(builder.make_networks(SPEC), SPEC, jax.random.PRNGKey(0))


def test_each_step_runs_the_calls_its_env_steps_owe_with_the_rest_carried():
    """ratio 0.5, 4 SGD steps a call, learning from 8 transitions: batches of 4 x 1, 4 x 8,
    4 x 3 env steps. The first fills the table to 4 (< 8: nothing owed); the second fills it to
    36 and owes 0.5 x 32 = 16 (4 calls); the third owes 0.5 x 12 = 6: one call, 2 carried; a
    fourth of 4 x 1 owes 2 more: 4, one call."""
    learner = _learner(replay_ratio=0.5, updates_per_step=4, min_replay_size=8)
    rng = np.random.default_rng(0)
    sgd = [learner.step(_unrolls(4, b, rng))["sgd_steps"] for b in (1, 8, 3, 1)]
    assert sgd == [0, 16, 20, 24]


def test_without_a_ratio_each_step_runs_one_call():
    learner = _learner(updates_per_step=4, min_replay_size=8)
    rng = np.random.default_rng(0)
    sgd = [learner.step(_unrolls(4, b, rng))["sgd_steps"] for b in (1, 8, 3, 1)]
    assert sgd == [0, 4, 8, 12]


def test_anakin_turns_the_ratio_into_updates_per_iteration():
    """16 envs x 8 steps an iteration: 128 env steps, so ratio 0.25 is 32 updates, and one
    ratio too small for a whole update still gives one."""
    config = SACConfig(batch_size=16, unroll_length=8, updates_per_step=5)
    assert ReplaySettings.of(config).updates_per_step == 5
    assert ReplaySettings.of(SACConfig(batch_size=16, unroll_length=8,
                                       replay_ratio=0.25)).updates_per_step == 32
    assert ReplaySettings.of(SACConfig(batch_size=16, unroll_length=8,
                                       replay_ratio=1e-4)).updates_per_step == 1


class SlowEnv(gym.Wrapper):
    """Sleeps 2 ms a step: env workers that lag behind a quick learner (--env_wrappers)."""

    def step(self, action):
        time.sleep(0.002)
        return self.env.step(action)


def _sgd_per_env_step(tmp_path, *flags: str) -> tuple[float, list[dict]]:
    """A SAC run on Pendulum-v1 (local_mt): the slope of the learner's SGD steps over the env
    steps between the first record after learning started and the last, and the records."""
    logdir = tmp_path / "run"
    assert run.main(["--agent=sac", "--env=Pendulum-v1", "--platform=local_mt", "--quiet",
                     f"--logdir={logdir}", "--log_every_s=0.25", "--min_replay_size=1000",
                     "--hidden_sizes=16", "--stop_at_return=none", *flags]) == 0
    records = [json.loads(line) for line in (logdir / "metrics.jsonl").read_text().splitlines()]
    learning = [r for r in records if r.get("learner/sgd_steps", 0) > 0]
    first, last = learning[0], learning[-1]
    slope = ((last["learner/sgd_steps"] - first["learner/sgd_steps"])
             / (last["env_steps"] - first["env_steps"]))
    return slope, records


@pytest.mark.slow  # A learner-bound run of 16,000 env steps: 30-60 s on a busy 2-core machine.
def test_the_ratio_holds_when_env_workers_outrun_the_learner(tmp_path):
    """64 Pendulum envs act far faster than 4 SGD steps of 256 samples per env step learn:
    the workers wait on the full unroll queue, and the ratio holds."""
    slope, records = _sgd_per_env_step(
        tmp_path, "--replay_ratio=4", "--updates_per_step=64", "--sample_batch_size=256",
        "--total_env_steps=16000")
    assert slope == pytest.approx(4.0, rel=0.1)
    # The learner was behind: unrolls waited for it in most records.
    assert np.mean([r["queue_size"] > 0 for r in records]) > 0.5, records


@pytest.mark.slow  # 12,000 env steps of envs that sleep: 20-40 s.
def test_the_ratio_holds_when_env_workers_lag_behind_the_learner(tmp_path):
    """8 envs that sleep 2 ms a step feed a learner that takes 0.25 SGD steps per env step in
    calls of 8: it waits for unrolls, and the ratio holds."""
    slope, records = _sgd_per_env_step(
        tmp_path, "--replay_ratio=0.25", "--updates_per_step=8", "--sample_batch_size=32",
        "--num_actors=2", "--envs_per_actor=4", "--total_env_steps=12000",
        f"--env_wrappers={__name__}:SlowEnv")
    assert slope == pytest.approx(0.25, rel=0.1)
    # The learner was ahead: no unroll waited for it in most records.
    assert np.mean([r["queue_size"] == 0 for r in records]) > 0.5, records
