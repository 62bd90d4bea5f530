"""Double-buffered env workers (`--env_buffers`): a worker's groups of envs step independently."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from trellis.builders.contract.config import ConfigError, ExperimentConfig
from trellis.builders.experiments.env_worker import EnvWorker
from trellis.envs import GymnasiumFactory
from trellis.launch import run as run_py


def test_groups_divide_the_workers_envs():
    config = ExperimentConfig(num_actors=3, envs_per_actor=32, env_buffers=2)
    assert (config.env_groups, config.envs_per_group) == (6, 16)
    with pytest.raises(ConfigError, match="env_buffers must be a divisor of envs_per_actor"):
        ExperimentConfig(envs_per_actor=32, env_buffers=3)


class HoldingInference:
    """Stands in for the inference server (the RPC path): holds every step of group 0 until
    group 1 has stepped `hold_until` times, then stops both after `steps` steps each."""

    def __init__(self, hold_until: int, steps: int, fail_group: int | None = None):
        self.calls: dict[int, list] = {0: [], 1: []}
        self.run_ids: dict[int, set] = {0: set(), 1: set()}
        self.held_s = None
        self._hold_until, self._steps, self._fail = hold_until, steps, fail_group
        self._released = threading.Event()
        self._rng = np.random.default_rng(0)

    def shm_address(self):
        return None

    def step(self, worker_id, run_id, inputs, episodes):
        group = worker_id - 2 * 5  # Worker 5's groups are inference's workers 10 and 11.
        self.calls[group].append(np.copy(inputs["obs"]))
        self.run_ids[group].add(run_id)
        if group == self._fail and len(self.calls[group]) == 3:
            raise RuntimeError("env group failed")
        if group == 1 and len(self.calls[1]) >= self._hold_until:
            self._released.set()
        if group == 0 and len(self.calls[0]) == 1:
            start = time.monotonic()
            assert self._released.wait(10), "group 1 did not step while group 0 waited"
            self.held_s = time.monotonic() - start
        if len(self.calls[group]) > self._steps:
            return None  # The server's answer when stopping.
        return self._rng.integers(0, 2, size=len(inputs["obs"]))


def test_one_groups_step_at_inference_does_not_hold_the_others():
    inference = HoldingInference(hold_until=20, steps=40)
    worker = EnvWorker(GymnasiumFactory("CartPole-v1"), inference, worker_id=5, num_envs=8, seed=3,
                       buffers=2)
    worker.run()
    # Group 1 made 20 steps while group 0's first step waited at inference.
    assert inference.held_s is not None and len(inference.calls[1]) >= 20
    for group in (0, 1):
        assert len(inference.calls[group]) == 41  # 40 answered, then the stop.
        assert all(obs.shape == (4, 4) for obs in inference.calls[group])
        assert len(inference.run_ids[group]) == 1
    assert inference.run_ids[0] != inference.run_ids[1]
    # The groups' envs are seeded apart (CartPole's vector env: one stream per seed).
    assert not np.array_equal(inference.calls[0][0], inference.calls[1][0])
    assert worker.env_steps() == 2 * 40 * 4


def test_a_failing_group_stops_the_others_and_fails_the_worker():
    inference = HoldingInference(hold_until=1, steps=10**9, fail_group=1)
    worker = EnvWorker(GymnasiumFactory("CartPole-v1"), inference, worker_id=5, num_envs=8, seed=3,
                       buffers=2)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="env group failed"):
        worker.run()
    assert time.monotonic() - start < 10
    steps = len(inference.calls[0])
    time.sleep(0.3)
    assert len(inference.calls[0]) == steps  # Group 0 stopped with the worker.


@pytest.mark.parametrize("flags,says", [
    (["--agent=impala", "--platform=anakin", "--env=gymnax:CartPole-v1"],
     "--platform=anakin steps its envs inside the compiled program"),
    (["--agent=es", "--platform=local_mt", "--env=CartPole-v1"],
     "ESBuilder's workers play whole episodes"),
])
def test_env_buffers_where_nothing_steps_at_inference_is_one_line(flags, says, tmp_path, capsys):
    code = run_py.main([*flags, "--env_buffers=2", f"--logdir={tmp_path}"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.strip().count("\n") == 0 and says in err, err
