"""Env factory, specs, and the env worker's handling of Gymnasium next-step autoreset."""

import importlib.util

import numpy as np
import pytest

from trellis.builders.experiments.env_worker import EnvWorker
from trellis.envs import GymnasiumFactory, UnknownEnvError, make_env_factory


def test_spec_of_cartpole():
    spec = GymnasiumFactory("CartPole-v1").spec()
    assert spec.observation_shape == (4,) and spec.observation_dtype == "float32"
    assert spec.num_actions == 2 and spec.discrete and not spec.pixels


def test_spec_of_continuous_env():
    spec = GymnasiumFactory("Pendulum-v1").spec()
    assert spec.num_actions is None and spec.action_shape == (1,)
    assert spec.action_low == (-2.0,) and spec.action_high == (2.0,)


def test_unknown_env_names_close_matches():
    with pytest.raises(UnknownEnvError, match="Did you mean: CartPole-v1"):
        GymnasiumFactory("CartPole-v2").validate()


class RecordingInference:
    """Stands in for the inference server: random actions, records every request."""

    def __init__(self, steps):
        self.calls = []
        self._steps = steps
        self._rng = np.random.default_rng(0)

    def shm_address(self):
        return None  # No shared memory offered: the worker steps through `step`.

    def step(self, worker_id, run_id, inputs, episodes):
        self.calls.append(dict({name: np.copy(v) for name, v in inputs.items()},
                               episodes=list(episodes)))
        if len(self.calls) > self._steps:
            return None  # What the server answers when stopping: the worker returns.
        return self._rng.integers(0, 2, size=len(inputs["obs"]))


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Acrobot-v1"])
def test_worker_marks_first_steps_after_autoreset(env_id):
    inference = RecordingInference(steps=600)
    EnvWorker(GymnasiumFactory(env_id), inference, worker_id=0, num_envs=4, seed=3).run()
    calls = inference.calls
    assert all(c["first"].all() for c in calls[:1])
    returns, ended = [], 0
    for prev, cur in zip(calls, calls[1:], strict=False):
        done = prev["terminated"] | prev["truncated"]
        # The step after an episode end is the reset: first, zero reward, not terminal.
        np.testing.assert_array_equal(cur["first"], done)
        assert (cur["reward"][done] == 0).all() and not cur["terminated"][done].any()
        ended += int(done.sum())
        returns += [r for r, _ in cur["episodes"]]
    assert ended > 0 and len(returns) == ended - int(sum(
        (c["terminated"] | c["truncated"]).sum() for c in calls[-1:]))
    if env_id == "CartPole-v1":  # Reward 1 per step: return == length.
        for c in calls:
            for r, n in c["episodes"]:
                assert r == n


def test_atari_pixels_through_the_conv_torso():
    """ALE ids work on envpool (make setup installs it) or ale-py (the atari extra)."""
    if not any(importlib.util.find_spec(m) for m in ("envpool", "ale_py")):
        pytest.skip("ALE ids need envpool or ale-py: pip install -e '.[envpool]'")
    import jax

    from trellis.agents.impala import ImpalaBuilder, ImpalaConfig

    spec = make_env_factory("ALE/Pong-v5").spec()
    assert spec.observation_shape == (4, 84, 84) and spec.observation_dtype == "uint8"
    networks = ImpalaBuilder(ImpalaConfig()).make_networks(spec)
    params = networks.init(jax.random.PRNGKey(0))
    logits, values, _ = networks.apply(params, spec.zeros_observation((2, 3)),
                                       np.ones((2, 3), bool), {})
    assert logits.shape == (2, 3, spec.num_actions) and values.shape == (2, 3)


def test_cartpole_novel_is_cartpole_without_the_velocities():
    """Same dynamics and episode ends as CartPole-v1; only (x, theta) are observed."""
    novel = GymnasiumFactory("CartPoleNoVel-v1")
    assert novel.spec().observation_shape == (2,)
    envs = novel.make_vector(5, seed=3)
    full = GymnasiumFactory("CartPole-v1").make_vector(5, seed=3)
    obs, _ = envs.reset(seed=3)
    full_obs, _ = full.reset(seed=3)
    rng = np.random.default_rng(0)
    ends = 0
    for _ in range(200):
        np.testing.assert_array_equal(obs, full_obs[:, [0, 2]])
        actions = rng.integers(0, 2, size=5)
        obs, reward, terminated, truncated, _ = envs.step(actions)
        full_obs, full_reward, full_terminated, _, _ = full.step(actions)
        np.testing.assert_array_equal(terminated, full_terminated)
        np.testing.assert_array_equal(reward, full_reward)
        ends += int(terminated.sum())
    assert ends > 0  # Episodes ended (and reset) along the way.
    single = novel.make(seed=1)
    assert single.observation_space.shape == (2,) and single.spec.max_episode_steps == 500
