"""Brax envs through the env factory: names, specs, the Gymnasium path's step conventions
checked against Brax's own API stepped in Python, and PPO learning one on anakin."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("brax", reason="brax is an optional extra (pip install -e '.[brax]')")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from trellis.envs import UnknownEnvError, make_env_factory  # noqa: E402
from trellis.envs.brax_envs import BraxFactory  # noqa: E402
from trellis.launch import run  # noqa: E402

PENDULUM = "brax:inverted_pendulum"


def test_factory_spec_and_names():
    factory = make_env_factory(PENDULUM)
    assert isinstance(factory, BraxFactory) and factory.jax_native
    spec = factory.spec()
    assert spec.observation_shape == (4,) and spec.num_actions is None
    assert spec.action_low == (-1.0,) and spec.action_high == (1.0,)
    assert factory.reward_threshold() is None
    with pytest.raises(UnknownEnvError, match="brax:inverted_pendulum"):
        make_env_factory("brax:inverted_pendulm").validate()


def _policy(obs):
    return jnp.clip(0.3 * obs[..., 1:2], -1.0, 1.0)  # Too weak to balance: episodes end.


@pytest.mark.parametrize("episode_length", [5, 1000])
def test_first_episode_matches_brax_stepped_in_python(episode_length):
    """The first episode of a jitted, scanned JaxEnv rollout has the return and length of
    Brax's own reset and step from the same key; every episode ends by termination (the pole
    falls) or at `episode_length` (truncated, not terminated), and the step after an end is
    `first` with reward 0."""
    jax_env = BraxFactory(PENDULUM, episode_length).make()

    @jax.jit
    def rollout(key):
        state, first = jax_env.reset(key)

        def step(carry, key):
            state, timestep = carry
            state, next_step = jax_env.step(key, state, _policy(timestep.obs))
            return (state, next_step), next_step

        return jax.lax.scan(step, (state, first), jax.random.split(key, 200))[1]

    key = jax.random.key(3)
    steps = jax.device_get(rollout(key))
    ends = np.flatnonzero(steps.terminated | steps.truncated)
    assert len(ends) >= 3
    brax_env = jax_env.env.env
    state, step = brax_env.reset(key), jax.jit(brax_env.step)
    total, length = 0.0, 0
    while True:
        state = step(state, _policy(state.obs))
        total, length = total + float(state.reward), length + 1
        if state.done or length == episode_length:
            break
    assert ends[0] + 1 == length
    assert float(steps.reward[:length].sum()) == pytest.approx(total)
    assert bool(steps.terminated[ends[0]]) == bool(state.done)
    for end in ends[:-1]:
        assert steps.first[end + 1] and steps.reward[end + 1] == 0
        assert not steps.terminated[end + 1] and not steps.truncated[end + 1]
    # After the first episode, each starts with a `first` step that is not one of its own.
    episode_lengths = np.diff(ends, prepend=-1) - (np.arange(len(ends)) > 0)
    if episode_length == 5:
        assert (episode_lengths == 5).all() and not steps.terminated.any()
    else:
        assert steps.terminated[ends].all() and not steps.truncated.any()


@pytest.mark.slow
def test_ppo_learns_inverted_pendulum_on_anakin(tmp_path):
    """PPO with its anakin defaults balances Brax's pendulum (mean return 1000 at most)."""
    code = run.main(["--agent=ppo", "--platform=anakin", f"--env={PENDULUM}", "--quiet",
                     "--total_env_steps=3000000", "--stop_at_return=900",
                     f"--logdir={tmp_path / 'run'}"])
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert code == 0 and summary["stopped_by"] == "return_target", summary
    assert summary["mean_return"] >= 900
