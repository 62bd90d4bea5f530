"""ONNX export (launch/onnx_policy.py): `export(DIR, onnx=True)` writes DIR/policy.onnx, which
onnxruntime runs to the same greedy actions as Trellis; a trained PPO's plays CartPole.

jax2onnx pins orbax-checkpoint below .venv's, so the conversions run in their own environment
(`make test-onnx`, .venv-onnx); in .venv they skip, and the refusals (a recurrent policy, the
extra missing) are checked there."""

from __future__ import annotations

import importlib.util
import os

import gymnasium as gym
import jax
import numpy as np
import pytest

import trellis
from trellis.agents.registry import agent_module
from trellis.envs import GymnasiumFactory
from trellis.launch.loaded_policy import LoadedPolicy, LoadError, acting
from trellis.launch.onnx_policy import INPUT, ONNX_FILE

HAS_JAX2ONNX = importlib.util.find_spec("jax2onnx") is not None
needs_onnx = pytest.mark.skipif(
    not HAS_JAX2ONNX, reason="the onnx extra lives in its own environment: make test-onnx")

# The feed-forward single-agent agents of the gradient kind, each on an env of its action space.
CONVERTED = {"impala": "CartPole-v1", "ppo": "CartPole-v1", "appo": "CartPole-v1",
             "a2c": "CartPole-v1", "dqn": "CartPole-v1", "rainbow": "CartPole-v1",
             "pqn": "CartPole-v1", "sac": "Pendulum-v1", "td3": "Pendulum-v1",
             "ddpg": "Pendulum-v1", "d4pg": "Pendulum-v1", "mpo": "Pendulum-v1"}


def _initial_policy(agent: str, env_id: str) -> LoadedPolicy:
    """`agent`'s greedy policy on `env_id` at its initial params, as `trellis.load` makes it."""
    module = agent_module(agent)
    builder = module.Builder(module.Config())
    spec = GymnasiumFactory(env_id).spec()
    networks = builder.make_networks(spec)
    training = builder.make_training(networks, spec)
    params = training.acting_params(training.init(jax.random.PRNGKey(1)))
    return LoadedPolicy(
        agent=agent, env_id=env_id, spec=spec, step=0, params=params,
        greedy=acting(builder.make_policy(networks, evaluation=True), spec),
        sampled=acting(builder.make_policy(networks, evaluation=False), spec),
        initial_state=lambda n: builder.initial_state(spec, n), key=jax.random.PRNGKey(0))


def _onnx_actions(directory: str, obs: np.ndarray) -> np.ndarray:
    import onnxruntime

    session = onnxruntime.InferenceSession(os.path.join(directory, ONNX_FILE))
    return session.run(None, {INPUT: obs})[0]


@needs_onnx
@pytest.mark.parametrize("agent", sorted(CONVERTED))
def test_onnx_gives_trellis_greedy_actions(agent, tmp_path):
    policy = _initial_policy(agent, CONVERTED[agent])
    policy.export(str(tmp_path), onnx=True)
    obs = np.random.default_rng(0).normal(size=(33, *policy.spec.observation_shape))
    obs = obs.astype(policy.spec.observation_dtype)
    np.testing.assert_allclose(_onnx_actions(str(tmp_path), obs), policy(obs),
                               rtol=1e-5, atol=1e-5)


@needs_onnx
def test_a_trained_policy_plays_cartpole_from_onnx(tmp_path):
    run = trellis.train(agent="ppo", env="CartPole-v1", platform="local_mt",
                        stop_at_return=450, logdir=str(tmp_path / "ppo"), quiet=True)
    run.load().export(str(tmp_path / "exported"), onnx=True)
    env = gym.make("CartPole-v1")
    returns = []
    for episode in range(10):
        obs, _ = env.reset(seed=episode)
        done, total = False, 0.0
        while not done:
            action = int(_onnx_actions(str(tmp_path / "exported"), obs[None])[0])
            obs, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    assert np.mean(returns) >= 450, returns


def test_a_recurrent_policy_is_refused_before_anything_is_converted(tmp_path):
    policy = _initial_policy("r2d2", "CartPole-v1")
    with pytest.raises(LoadError, match="ONNX export takes a feed-forward policy of a "
                       "single-agent env; r2d2's on CartPole-v1 is recurrent"):
        policy.export(str(tmp_path), onnx=True)


@pytest.mark.skipif(HAS_JAX2ONNX, reason="jax2onnx is installed here")
def test_without_the_extra_the_export_names_it(tmp_path):
    policy = _initial_policy("ppo", "CartPole-v1")
    with pytest.raises(LoadError, match=r"ppo's policy: ONNX export needs jax2onnx: pip "
                       r"install -e '\.\[onnx\]'"):
        policy.export(str(tmp_path), onnx=True)
    assert not os.path.exists(tmp_path / ONNX_FILE)
