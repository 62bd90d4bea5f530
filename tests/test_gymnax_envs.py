"""gymnax envs through the env factory: ids, specs, and the Gymnasium path's step conventions
(next-step autoreset, terminated kept apart from truncated) checked against gymnax's own API
stepped in Python."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("gymnax", reason="gymnax is an optional extra (pip install -e '.[gymnax]')")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from trellis.envs import GymnasiumFactory, GymnaxFactory, UnknownEnvError, make_env_factory  # noqa: E402


def test_factory_dispatches_on_the_prefix():
    assert isinstance(make_env_factory("gymnax:CartPole-v1"), GymnaxFactory)
    assert isinstance(make_env_factory("CartPole-v1"), GymnasiumFactory)
    assert make_env_factory("gymnax:CartPole-v1").jax_native
    assert not make_env_factory("CartPole-v1").jax_native


def test_spec_is_the_gymnasium_spec():
    assert make_env_factory("gymnax:CartPole-v1").spec() == GymnasiumFactory("CartPole-v1").spec()
    breakout = make_env_factory("gymnax:Breakout-MinAtar").spec()
    assert breakout.observation_shape == (10, 10, 4) and breakout.num_actions == 3


def test_unknown_id_names_close_matches():
    with pytest.raises(UnknownEnvError, match="gymnax:CartPole-v1"):
        make_env_factory("gymnax:CartPol-v1").validate()


def test_reward_threshold_is_gymnasiums():
    assert make_env_factory("gymnax:CartPole-v1").reward_threshold() == 475.0
    assert make_env_factory("gymnax:Breakout-MinAtar").reward_threshold() is None


def _reference_episode(env, params, state, policy):
    """(return, length, terminated, truncated) of one episode stepped in Python with gymnax's
    own `step` from `state`."""
    total, length = 0.0, 0
    key = jax.random.key(7)  # CartPole's steps draw nothing.
    while True:
        action = int(policy(np.asarray(env.get_obs(state))))
        _, state, reward, terminated, truncated, _ = env.step(key, state, action, params)
        total, length = total + float(reward), length + 1
        if terminated or truncated:
            return total, length, bool(terminated), bool(truncated)


@pytest.mark.parametrize("max_steps", [10, 500])
def test_next_step_autoreset_matches_gymnax_stepped_in_python(max_steps):
    """Every episode of a jitted, scanned JaxEnv rollout (from the first observation it
    recorded) has gymnax's return, length and end flags; the step after an end is `first`
    with reward 0 and its action ignored. max_steps=10 truncates every episode."""
    factory = GymnaxFactory("gymnax:CartPole-v1", (("max_steps_in_episode", max_steps),))
    jax_env = factory.make()

    def policy(obs):  # Balances for a while: some episodes end by falling, some by time.
        return (obs[..., 2] + 0.3 * obs[..., 3] > 0).astype(jnp.int32)

    @jax.jit
    def rollout(key):
        state, first = jax_env.reset(key)

        def step(carry, key):
            state, timestep = carry
            state, next_step = jax_env.step(key, state, policy(timestep.obs))
            return (state, next_step), next_step

        _, steps = jax.lax.scan(step, (state, first), jax.random.split(key, 3000))
        return first, steps

    first, steps = jax.device_get(rollout(jax.random.key(0)))
    obs = np.concatenate([first.obs[None], steps.obs])
    is_first = np.concatenate([[True], steps.first])
    reward, terminated, truncated = steps.reward, steps.terminated, steps.truncated
    episodes = 0
    for t in np.flatnonzero(is_first)[:-1]:
        end = t + np.flatnonzero(terminated[t:] | truncated[t:])[0]  # steps[end] ends it.
        if end + 1 >= len(steps.first):
            break
        inner = jax_env.env.reset_env(jax.random.key(0), jax_env.params)[1]
        x, x_dot, theta, theta_dot = obs[t]
        inner = inner.replace(x=x, x_dot=x_dot, theta=theta, theta_dot=theta_dot, time=0)
        expected = _reference_episode(jax_env.env, jax_env.params, inner, policy)
        got = (float(reward[t:end + 1].sum()), int(end + 1 - t), bool(terminated[end]),
               bool(truncated[end]))
        assert got == pytest.approx(expected)
        # The next step resets: first, reward 0, neither flag.
        assert steps.first[end + 1] and reward[end + 1] == 0
        assert not terminated[end + 1] and not truncated[end + 1]
        episodes += 1
    assert episodes >= 3
    if max_steps == 10:
        assert truncated.sum() >= 3 and not terminated[truncated].any()
