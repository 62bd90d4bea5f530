"""Off-policy agents on anakin: the device replay holds the host table's n-step transitions
(`unrolls_to_transitions`), samples only valid slots uniformly, wraps around, and SAC and TD3
learn Pendulum on the device (a short run here, -200 in the slow test)."""

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.test_run import run, summary
from tests.test_sac import LEARNED_PENDULUM_RETURN
from trellis.agents.common.replay import DeviceReplay, unrolls_to_transitions


def random_unrolls(rng, t1=7, b=5):
    """Unrolls with episode ends (terminations and truncations) and the autoreset step after."""
    done = rng.random((t1, b)) < 0.2
    terminated = done & (rng.random((t1, b)) < 0.5)
    truncated = done & ~terminated
    first = np.zeros((t1, b), bool)
    first[1:] = done[:-1]
    first[0] = rng.random(b) < 0.3
    terminated[first], truncated[first] = False, False
    return {"obs": rng.normal(size=(t1, b, 3)).astype(np.float32),
            "action": rng.normal(size=(t1, b, 2)).astype(np.float32),
            "reward": rng.normal(size=(t1, b)).astype(np.float32),
            "terminated": terminated, "truncated": truncated, "first": first}


def rows(transitions):
    """The transitions as a multiset of rounded tuples (order-free comparison)."""
    fields = ("obs", "action", "reward", "discount", "next_obs")
    n = len(transitions["reward"])
    return collections.Counter(
        tuple(np.round(np.concatenate([np.ravel(transitions[f][i]) for f in fields]), 4))
        for i in range(n))


def empty(capacity):
    return DeviceReplay.create(capacity, jax.ShapeDtypeStruct((3,), jnp.float32),
                               jax.ShapeDtypeStruct((2,), jnp.float32))


@pytest.mark.parametrize("n_step", [1, 3])
def test_device_replay_holds_the_host_tables_transitions(n_step):
    rng = np.random.default_rng(n_step)
    unrolls = random_unrolls(rng)
    replay = jax.jit(lambda r, u: r.add(u, n_step, 0.9))(empty(100), unrolls)
    valid = np.asarray(replay.valid)
    held = {k: np.asarray(v)[valid] for k, v in replay.data.items()}
    want = unrolls_to_transitions(unrolls, n_step, 0.9)
    assert int(replay.size) == len(want["reward"]) < 6 * 5  # Some starts were invalid.
    assert rows(held) == rows(want)


def test_sampling_draws_only_valid_slots_uniformly_and_the_ring_wraps():
    rng = np.random.default_rng(0)
    replay = empty(40)
    add = jax.jit(lambda r, u: r.add(u, 1, 0.9))
    for _ in range(3):  # 3 x 30 starts into 40 slots: the ring wraps twice.
        unrolls = random_unrolls(rng, t1=7, b=5)
        replay = add(replay, unrolls)
    assert int(replay.index) == 90 % 40
    # The newest unroll's transitions are all held; the oldest unroll's are gone.
    held = {k: np.asarray(v)[np.asarray(replay.valid)] for k, v in replay.data.items()}
    assert not rows(unrolls_to_transitions(unrolls, 1, 0.9)) - rows(held)
    batch = jax.jit(lambda r, k: r.sample(k, 50, 64))(replay, jax.random.key(1))
    assert batch["obs"].shape == (50, 64, 3) and batch["action"].shape == (50, 64, 2)
    size = int(replay.size)
    np.testing.assert_allclose(batch["probability"], 1.0 / size)
    np.testing.assert_array_equal(batch["table_size"], size)
    # Every sample is a held transition; every held one is drawn about equally often.
    held_obs = {tuple(np.round(o, 5)) for o in held["obs"]}
    drawn = collections.Counter(tuple(np.round(o, 5)) for o in
                                np.asarray(batch["obs"]).reshape(-1, 3))
    assert set(drawn) <= held_obs and len(drawn) == len(held_obs)
    counts = np.array(list(drawn.values()))
    expected = 50 * 64 / size
    assert counts.min() > 0.5 * expected and counts.max() < 1.5 * expected


def test_an_update_larger_than_the_replay_is_refused():
    with pytest.raises(ValueError, match="raise replay_size"):
        empty(10).add(random_unrolls(np.random.default_rng(0), t1=7, b=5), 1, 0.9)


@pytest.mark.slow  # 16 s on an idle 2-core machine, most of it compiling.
@pytest.mark.parametrize("agent", ["td3"])
def test_learns_pendulum_on_anakin(agent, tmp_path):
    out = run([f"--agent={agent}", "--platform=anakin", "--env=gymnax:Pendulum-v1",
               "--total_env_steps=40000", "--stop_at_return=none", f"--logdir={tmp_path}"],
              timeout=300)
    assert out.returncode == 0, out.stderr
    s = summary(tmp_path)
    assert s["env_steps"] >= 40000 and s["episodes"] >= 100
    assert s["mean_return"] > LEARNED_PENDULUM_RETURN, s


@pytest.mark.slow
@pytest.mark.parametrize("agent", ["sac", "td3"])
def test_reaches_minus_200_on_anakin(agent, tmp_path):
    out = run([f"--agent={agent}", "--platform=anakin", "--env=gymnax:Pendulum-v1",
               "--stop_at_return=-200", "--total_env_steps=500000", f"--logdir={tmp_path}"],
              timeout=600)
    assert out.returncode == 0, out.stderr
    s = summary(tmp_path)
    assert s["stopped_by"] == "return_target" and s["mean_return"] >= -200, s
