"""envpool as an env backend: Gymnasium's specs, next-step autoreset with no transition across
an episode boundary, and a clear error when envpool's resets and episode ends disagree."""

import numpy as np
import pytest

from trellis.envs import GymnasiumFactory, make_env_factory
from trellis.envs.envpool_envs import EnvpoolFactory, EnvpoolVector

envpool = pytest.importorskip("envpool")


def test_id_dispatch_and_specs_equal_gymnasium():
    factory = make_env_factory("envpool:CartPole-v1")
    assert isinstance(factory, EnvpoolFactory)
    assert factory.spec() == GymnasiumFactory("CartPole-v1").spec()
    assert factory.reward_threshold() == GymnasiumFactory("CartPole-v1").reward_threshold() == 475


def test_autoreset_never_joins_two_episodes():
    """Steps as the env worker does: `first` marks the observation after an episode's end.
    A first observation must be a new episode's (elapsed step 0, reward 0, CartPole's reset
    state within +-0.05); every other one the same episode's next step."""
    envs = make_env_factory("envpool:CartPole-v1").make_vector(16, seed=7)
    rng = np.random.default_rng(0)
    first = np.zeros(16, bool)  # Whether the observation a step returns starts an episode.
    steps = np.zeros(16, int)  # After reset(): every episode at its step 0.
    lengths = []
    for _ in range(400):
        obs, reward, terminated, truncated, info = envs.step(rng.integers(0, 2, 16))
        elapsed = np.asarray(info["elapsed_step"])
        new = np.where(first, 0, steps + 1)
        np.testing.assert_array_equal(elapsed, new)
        assert np.all(reward[first] == 0) and np.all(np.abs(obs[first]) <= 0.05)
        assert np.all(reward[~first] == 1)
        done = terminated | truncated
        lengths += elapsed[done].tolist()
        steps, first = elapsed, done
    envs.close()
    assert len(lengths) > 100 and min(lengths) >= 8  # CartPole's shortest episodes: ~8 steps.


class _Pool:
    """A stand-in envpool pool that resets env 0 at step 2 although it never ended."""

    config = {"num_envs": 2}
    observation_space = action_space = None

    def __init__(self):
        self.t = 0

    def reset(self):
        self.t = 0
        return np.zeros((2, 1)), {"elapsed_step": np.zeros(2, int)}

    def step(self, actions):
        self.t += 1
        elapsed = np.array([0 if self.t == 2 else self.t, self.t])
        no = np.zeros(2, bool)
        return np.zeros((2, 1)), np.ones(2), no, no, {"elapsed_step": elapsed}


def test_a_reset_without_an_episode_end_raises():
    pool = _Pool()
    pool.action_space = type("Space", (), {"dtype": np.int32})()
    envs = EnvpoolVector(pool)
    envs.reset()
    envs.step(np.zeros(2))
    with pytest.raises(RuntimeError, match=r"reset envs \[0\] after envs \[\] ended"):
        envs.step(np.zeros(2))


def test_atari_episodes_are_games_with_unclipped_rewards():
    envs = make_env_factory("envpool:Pong-v5").make_vector(1, seed=0)
    assert (envs._pool.config["episodic_life"], envs._pool.config["reward_clip"]) == (False,
                                                                                       False)
    envs.close()


def test_an_env_worker_process_steps_envpool_without_importing_jax():
    # envpool imports JAX for an XLA interface we do not use; an env worker, which never
    # imports JAX otherwise, would pay 0.4-0.6 s of CPU at start for it. JAX stays importable.
    import subprocess
    import sys

    code = """
import sys
from trellis.envs import make_env_factory
envs = make_env_factory("envpool:CartPole-v1").make_vector(2, seed=0)
envs.step([0, 1])
assert "jax" not in sys.modules, "making an envpool env imported JAX"
import jax
jax.numpy.zeros(1)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]


@pytest.mark.parametrize("env_id,settings", [
    ("envpool:CartPole-v1", {}), ("envpool:Pong-v5", {}),
    ("envpool:Pong-v5", {"frame_stack": 2, "episodic_life": True})])
def test_the_spec_is_the_pools_and_goes_with_the_pickled_factory(env_id, settings):
    """No env is made for the spec; a node process unpickling the launcher's factory gets
    the spec without importing envpool."""
    import pickle
    import subprocess
    import sys

    from trellis.envs.atari import with_settings
    from trellis.envs.specs import vector_spec

    factory = with_settings(make_env_factory(env_id), settings)
    assert factory.spec() == vector_spec(factory)  # vector_spec makes a pool of one env.
    code = f"""
import pickle, sys
sys.modules["envpool"] = None  # Importing it now fails.
spec = pickle.loads({pickle.dumps(factory)!r}).spec()
assert spec.observation_shape == {factory.spec().observation_shape!r}, spec
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
