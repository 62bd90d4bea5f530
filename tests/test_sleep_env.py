"""The sleep env (envs/sleep_env.py): its bandit against hand-computed rewards, next-step
autoreset, the sleep itself, bad ids (run.py's one line: tests/test_flags.py); and the policy
lag a run reports."""

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from trellis.envs import make_env_factory
from trellis.envs.errors import UnknownEnvError
from trellis.envs.sleep_env import EPISODE_LENGTH

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_rewards_are_the_sign_of_the_first_observation_and_episodes_last_100_steps():
    envs = make_env_factory("sleep:0").make_vector(3, seed=0)
    obs, _ = envs.reset(seed=1)
    right = (obs[:, 0] > 0).astype(np.int64)
    actions = np.array([right[0], 1 - right[1], right[2]])
    obs, reward, terminated, truncated, _ = envs.step(actions)
    assert reward.tolist() == [1.0, 0.0, 1.0]
    assert not terminated.any() and not truncated.any()
    for _ in range(EPISODE_LENGTH - 1):
        obs, reward, terminated, truncated, _ = envs.step(np.zeros(3, np.int64))
    assert terminated.all() and not truncated.any()  # The 100th step ends every episode.
    obs, reward, terminated, _, _ = envs.step((obs[:, 0] > 0).astype(np.int64))
    assert reward.tolist() == [0.0, 0.0, 0.0] and not terminated.any()  # The reset step.
    assert obs.shape == (3, 4) and obs.dtype == np.float32 and np.all(np.abs(obs) <= 1)


def test_a_step_sleeps_its_milliseconds_once_for_the_whole_batch():
    envs = make_env_factory("sleep:30").make_vector(64, seed=0)
    envs.reset(seed=0)
    start = time.perf_counter()
    for _ in range(3):
        envs.step(np.zeros(64, np.int64))
    assert 0.09 <= time.perf_counter() - start < 0.5


@pytest.mark.parametrize("env_id", ["sleep:abc", "sleep:-1", "sleep:nan", "sleep:"])
def test_a_bad_sleep_id_is_refused(env_id):
    with pytest.raises(UnknownEnvError, match="sleep:MS"):
        make_env_factory(env_id).validate()


@pytest.mark.slow  # 35 s with 8 worker processes on 2 cores (metrics and TensorBoard get the
# lag fields in tests/test_rundir.py's run, in the default suite).
def test_eight_workers_outrunning_the_learner_keep_the_policy_lag_to_a_few_updates(tmp_path):
    out = subprocess.run(
        [sys.executable, os.path.join(REPO, "launch", "run.py"), "--agent=impala",
         "--env=sleep:5", "--num_actors=8", "--envs_per_actor=8", "--total_env_steps=30000",
         "--stop_at_return=none", "--log_every_s=0.5", "--quiet", f"--logdir={tmp_path}"],
        capture_output=True, text=True, timeout=300, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    with open(tmp_path / "metrics.jsonl") as f:
        records = [json.loads(line) for line in f]
    lags = [r for r in records if r["policy_lag_mean"] is not None]
    assert lags, "no record reports the policy lag"
    assert all(0 <= r["policy_lag_mean"] <= r["policy_lag_max"] for r in lags)
    assert max(r["policy_lag_max"] for r in lags) <= 10
