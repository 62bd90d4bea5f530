"""JaxMARL's envs through the env factory, in the multi-agent convention, against JaxMARL
stepped directly."""

from __future__ import annotations

import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("jaxmarl", reason="jaxmarl is an optional extra (pip install -e '.[marl]')")

from trellis.envs import make_env_factory  # noqa: E402
from trellis.envs.errors import UnknownEnvError  # noqa: E402

SPREAD = "jaxmarl:MPE_simple_spread_v3"


def test_simple_spread_spec():
    spec = make_env_factory(SPREAD).spec()
    assert spec.agents == ("agent_0", "agent_1", "agent_2")
    for agent in spec.agents:
        assert spec.specs[agent].observation_shape == (18,)
        assert spec.specs[agent].num_actions == 5
    assert spec.global_state_shape == (54,)  # The three observations.


def test_building_an_env_prints_nothing_and_keeps_the_streams():
    # JaxMARL's import prints two lines about its optional submodules (they went into run.py's
    # progress) and resets sys.stdout and sys.stderr to the interpreter's own.
    code = ("import io, sys; from trellis.envs import make_env_factory; "
            "mine = sys.stderr = io.StringIO(); "
            f"make_env_factory({SPREAD!r}).make(); "
            "kept = sys.stderr is mine; sys.stderr = sys.__stderr__; assert kept")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout == "", out.stdout + out.stderr[-2000:]


def test_unknown_ids_name_close_matches():
    with pytest.raises(UnknownEnvError, match="Did you mean: jaxmarl:MPE_simple_spread_v3"):
        make_env_factory("jaxmarl:MPE_simple_sprd_v3").validate()


def test_steps_equal_jaxmarls_and_the_time_limit_truncates():
    """For the same keys and actions, observations and rewards are JaxMARL's `step_env`'s; its
    `done` after max_steps is a truncation of every agent; the step after resets."""
    env = make_env_factory(SPREAD).make()
    inner = env.env
    agents = env.agents
    key = jax.random.key(7)
    state, step = env.reset(key)
    obs, inner_state = inner.reset(key)
    for agent in agents:
        np.testing.assert_array_equal(step.obs[agent], obs[agent])
    step_fn = jax.jit(env.step)
    inner_step = jax.jit(inner.step_env)
    for t in range(inner.max_steps + 1):
        actions = {a: jnp.asarray((t + i) % 5) for i, a in enumerate(agents)}
        step_key = jax.random.fold_in(key, t)
        # The adapter splits its key into (reset, step) keys, as JaxMARL's own `step` does.
        _, inner_key = jax.random.split(step_key)
        state, step = step_fn(step_key, state, actions)
        obs, inner_state, rewards, dones, _ = inner_step(inner_key, inner_state, actions)
        for agent in agents:
            np.testing.assert_allclose(step.obs[agent], obs[agent], rtol=1e-6)
            np.testing.assert_allclose(step.reward[agent], rewards[agent], rtol=1e-6)
            assert not step.terminated[agent]
            assert bool(step.truncated[agent]) == bool(dones["__all__"])
            assert bool(step.alive[agent]) != bool(dones["__all__"])
        assert bool(dones["__all__"]) == (t == inner.max_steps)
    state, step = step_fn(jax.random.key(1), state, actions)
    assert bool(step.first) and all(bool(step.alive[a]) for a in agents)
