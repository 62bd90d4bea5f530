"""DQN: n-step double-Q targets, the weighted loss, unrolls -> transitions, priorities,
the learner, and Ape-X through launch/run.py on local_mp."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.test_run import RANDOM_CARTPOLE_RETURN, run, summary
from trellis.agents.common import importance_weights
from trellis.agents.common.replay import unrolls_to_transitions
from trellis.agents.dqn import DQNBuilder, DQNConfig
from trellis.agents.dqn.config import ApexConfig
from trellis.agents.dqn.losses import double_q_td_error, weighted_huber_loss
from trellis.builders.experiments import checkpointing
from trellis.envs import GymnasiumFactory
from trellis.envs.specs import EnvSpec


def reference_transitions(unrolls, n, gamma):
    """Float64 loops: per column and start, walk forward until n steps, the unroll's end,
    or the episode's end (0 bootstrap after termination)."""
    first, term, trunc = unrolls["first"], unrolls["terminated"], unrolls["truncated"]
    t_max, cols = first.shape[0] - 1, first.shape[1]
    out = []
    for t in range(t_max):
        for b in range(cols):
            if first[t + 1, b]:
                continue  # Next observation starts a new episode: no transition.
            g, scale, end = 0.0, 1.0, t
            for s in range(t + 1, min(t + n, t_max) + 1):
                g += scale * float(unrolls["reward"][s, b])
                scale *= gamma
                end = s
                if term[s, b]:
                    scale = 0.0
                    break
                if trunc[s, b]:
                    break
            out.append((t, b, g, scale, end))
    return out


def make_unrolls():
    """T = 7, B = 3; column 0: one termination mid-unroll, column 1: a truncation, column 2:
    no boundary."""
    t1, b = 8, 3
    rng = np.random.default_rng(0)
    first = np.zeros((t1, b), bool)
    term = np.zeros((t1, b), bool)
    trunc = np.zeros((t1, b), bool)
    term[3, 0], first[4, 0] = True, True
    trunc[5, 1], first[6, 1] = True, True
    first[0, :] = True
    reward = rng.normal(size=(t1, b)).astype(np.float32)
    reward[first] = 0.0
    obs = np.arange(t1 * b, dtype=np.float32).reshape(t1, b, 1) * np.ones(2, np.float32)
    action = rng.integers(0, 2, size=(t1, b))
    return {"obs": obs, "action": action, "reward": reward, "terminated": term,
            "truncated": trunc, "first": first}


@pytest.mark.parametrize("n", [1, 3, 5])
def test_n_step_transitions_match_float64_reference(n):
    unrolls, gamma = make_unrolls(), 0.9
    got = unrolls_to_transitions(unrolls, n, gamma)
    ref = reference_transitions(unrolls, n, gamma)
    assert len(got["reward"]) == len(ref)
    for i, (t, b, g, scale, end) in enumerate(ref):
        np.testing.assert_array_equal(got["obs"][i], unrolls["obs"][t, b])
        np.testing.assert_array_equal(got["next_obs"][i], unrolls["obs"][end, b])
        assert got["action"][i] == unrolls["action"][t, b]
        np.testing.assert_allclose(got["reward"][i], g, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(got["discount"][i], scale, rtol=1e-6)


def test_no_transition_crosses_an_episode_boundary():
    unrolls = make_unrolls()
    got = unrolls_to_transitions(unrolls, 5, 0.9)
    start = got["obs"][:, 0].astype(int)  # obs value = t * B + b
    end = got["next_obs"][:, 0].astype(int)
    t0, b0 = start // 3, start % 3
    t1, b1 = end // 3, end % 3
    assert np.all(b0 == b1)
    for t_start, t_end, b in zip(t0, t1, b0, strict=True):
        # No `first` in (t_start, t_end]: the bootstrap observation is in the same episode.
        assert not unrolls["first"][t_start + 1:t_end + 1, b].any()
    # The final observations (t=3 in column 0, t=5 in column 1) start no transition.
    assert (3, 0) not in set(zip(t0, b0, strict=True))
    assert (5, 1) not in set(zip(t0, b0, strict=True))
    # Termination: discount 0; truncation: bootstraps from the final observation.
    i = np.flatnonzero((t0 == 1) & (b0 == 0))[0]
    assert got["discount"][i] == 0.0 and t1[i] == 3
    i = np.flatnonzero((t0 == 3) & (b0 == 1))[0]
    np.testing.assert_allclose(got["discount"][i], 0.9**2)
    assert t1[i] == 5


def test_double_q_td_error_by_hand():
    q_tm1 = jnp.array([1.0, 2.0])
    q_t_online = jnp.array([0.0, 5.0])  # Selects action 1 ...
    q_t_target = jnp.array([10.0, 3.0])  # ... which the target values at 3, not max 10.
    td = double_q_td_error(q_tm1, jnp.array(0), jnp.array(1.5), jnp.array(0.81), q_t_target,
                           q_t_online)
    np.testing.assert_allclose(td, 1.5 + 0.81 * 3.0 - 1.0, rtol=1e-6)


def test_importance_weighted_loss_by_hand():
    probs = jnp.array([0.5, 0.25, 0.25])
    weights = importance_weights(probs, jnp.full(3, 4.0), 0.5)
    raw = (4 * np.array([0.5, 0.25, 0.25])) ** -0.5  # [1/sqrt2, 1, 1]
    np.testing.assert_allclose(weights, raw / raw.max(), rtol=1e-6)
    td = jnp.array([0.5, -2.0, 1.0])
    huber = np.array([0.5 * 0.25, 0.5 + 1.0 * (2.0 - 1.0), 0.5])  # delta = 1
    loss = weighted_huber_loss(td, weights, 1.0)
    np.testing.assert_allclose(loss, np.mean(raw / raw.max() * huber), rtol=1e-6)


def test_apex_epsilons_follow_horgan_et_al():
    c = ApexConfig()
    expected = [0.4 ** (1 + 7 * i / 7) for i in range(8)]
    np.testing.assert_allclose(c.epsilons, expected)
    assert DQNConfig().epsilons == (0.01,)
    with pytest.raises(ValueError, match="num_epsilons must be >= 1"):
        DQNConfig(num_epsilons=0)


def cartpole_unrolls(rng, t1=5, b=16):
    """Random CartPole-like unrolls with some episode ends."""
    first = rng.random((t1, b)) < 0.1
    term = np.zeros((t1, b), bool)
    term[:-1] = first[1:]
    return {"obs": rng.normal(size=(t1, b, 4)).astype(np.float32),
            "action": rng.integers(0, 2, (t1, b)), "reward": np.ones((t1, b), np.float32),
            "terminated": term, "truncated": np.zeros((t1, b), bool), "first": first}


def small_learner(**overrides):
    config = DQNConfig(min_replay_size=64, updates_per_step=4, sample_batch_size=32,
                       **overrides)
    builder = DQNBuilder(config)
    spec = GymnasiumFactory("CartPole-v1").spec()
    return builder.make_learner(builder.make_networks(spec), spec, jax.random.PRNGKey(0))


def test_priorities_are_updated_in_the_table():
    learner = small_learner()
    rng = np.random.default_rng(1)
    metrics = learner.step(cartpole_unrolls(rng, t1=9))
    assert "loss" in metrics and metrics["replay_size"] >= 64
    table = learner.replay.table
    sample = table.sample(256)
    # Inserted at priority 1.0; sampled items now carry |TD error| + epsilon instead.
    assert np.any(np.abs(sample.priorities - 1.0) > 1e-3)


def test_updates_reduce_td_error_on_a_fixed_batch():
    learner = small_learner(learning_rate=1e-3, target_update_period=1000)
    rng = np.random.default_rng(2)
    unrolls = cartpole_unrolls(rng, t1=17, b=8)
    first = learner.step(unrolls)
    for _ in range(30):
        last = learner.step({k: v[:1] for k, v in unrolls.items()})  # Nothing new inserted.
    assert float(last["td_abs"]) < 0.5 * float(first["td_abs"]), (first, last)


def test_a_saved_replay_is_restored_as_it_was_and_only_the_newest_is_kept(tmp_path):
    learner = small_learner()
    rng = np.random.default_rng(3)
    learner.step(cartpole_unrolls(rng, t1=9))  # Filled, sampled and its priorities updated.
    directory = str(tmp_path / "checkpoints")
    saved = checkpointing.save_replay(learner, directory, 100)
    assert saved == len(learner.replay.table) >= 64
    other = small_learner()
    assert checkpointing.restore_replay(other, directory, 99) is None  # None with that step.
    assert checkpointing.restore_replay(other, directory, 100) == saved
    # The same items, priorities and sampling state: both draw the same sample.
    a, b = learner.replay.table.sample(128), other.replay.table.sample(128)
    np.testing.assert_array_equal(a.keys, b.keys)
    np.testing.assert_array_equal(a.priorities, b.priorities)
    for k in a.data:
        np.testing.assert_array_equal(a.data[k], b.data[k])
    # New items enter at the largest priority so far, which the table alone does not hold.
    unrolls = cartpole_unrolls(rng, t1=3)
    learner.replay.add(unrolls, learner._max_priority)
    other.replay.add(unrolls, other._max_priority)
    assert learner._max_priority == other._max_priority > 1.0
    a, b = learner.replay.table.sample(256), other.replay.table.sample(256)
    np.testing.assert_array_equal(a.priorities, b.priorities)
    checkpointing.save_replay(learner, directory, 200)
    assert os.listdir(tmp_path / "replay") == ["200"]


# Four actions and four features: with identity kernels the Q-values rank like the features.
FOUR_ACTIONS = EnvSpec((4,), "float32", 4, (), "int32")


def identity_q_params(networks, updates=0):
    """Params under which Q(s, .) is increasing in s[:4] (tanh(tanh(s)) plus a constant), so
    the greedy action is argmax(s): every kernel is an identity, every bias zero."""
    q = jax.tree.map(lambda x: jnp.eye(*x.shape) if x.ndim == 2 else jnp.zeros_like(x),
                     networks.init(jax.random.PRNGKey(0)))
    return {"q": q, "updates": jnp.array(updates)}


def distinct_observations(n, seed=0):
    return jnp.asarray(np.random.default_rng(seed).normal(size=(n, 4)), jnp.float32)


def test_evaluation_policy_is_greedy_for_each_observation():
    builder = DQNBuilder(ApexConfig())  # Large epsilons: evaluation must ignore them all.
    networks = builder.make_networks(FOUR_ACTIONS)
    obs = distinct_observations(256)
    expected = np.argmax(np.asarray(obs), axis=-1)
    assert len(set(expected.tolist())) == 4  # Every action is the greedy one somewhere.
    actions, extras, state = builder.make_policy(networks, evaluation=True)(
        identity_q_params(networks), jax.random.PRNGKey(1), obs, {}, np.zeros(len(obs), bool))
    np.testing.assert_array_equal(np.asarray(actions), expected)
    assert extras == {} and state == {}


def assert_explores_at(actions, greedy, epsilon, num_actions=4):
    """A row explores with probability epsilon and a random action misses the greedy one
    with probability 1 - 1/A; the observed rate must lie within 5 binomial sigmas."""
    p = epsilon * (1.0 - 1.0 / num_actions)
    n = actions.size
    rate = float(np.mean(actions != greedy))
    tolerance = 5.0 * np.sqrt(p * (1.0 - p) / n)
    assert abs(rate - p) <= tolerance, (rate, p, tolerance)


@pytest.mark.parametrize("config, updates, expected", [
    # Ape-X: fixed ladder 0.4 ** (1 + 7 i / 7), row r uses entry r mod 8.
    (ApexConfig(), 0, ApexConfig().epsilons),
    # DQN: epsilon decays linearly from 1 over epsilon_decay_updates, floored at 0.01.
    (DQNConfig(epsilon_decay_updates=100), 0, (1.0,)),
    (DQNConfig(epsilon_decay_updates=100), 75, (0.25,)),
    (DQNConfig(epsilon_decay_updates=100), 1000, (0.01,)),
])
def test_epsilon_greedy_explores_at_the_configured_rate(config, updates, expected):
    builder = DQNBuilder(config)
    networks = builder.make_networks(FOUR_ACTIONS)
    num_slots = len(expected)
    obs = distinct_observations(num_slots * 2000, seed=1)
    greedy = np.argmax(np.asarray(obs), axis=-1)
    actions, _, _ = builder.make_policy(networks)(identity_q_params(networks, updates),
                                                  jax.random.PRNGKey(2), obs, {},
                                                  np.zeros(len(obs), bool))
    actions = np.asarray(actions)
    assert actions.min() >= 0 and actions.max() < 4
    for slot, epsilon in enumerate(expected):
        assert_explores_at(actions[slot::num_slots], greedy[slot::num_slots], epsilon)


# DQN on CartPole on both platforms is in tests/test_run.py (test_learns_cartpole).


def test_apex_learns_on_local_mp_with_two_workers(tmp_path):
    out = run(["--agent=apex", "--platform=local_mp", "--num_actors=2",
               "--total_env_steps=40000", "--stop_at_return=none", "--eval_every=0",
               f"--logdir={tmp_path}"], timeout=180)
    assert out.returncode == 0, out.stderr
    s = summary(tmp_path)
    assert s["learner_steps"] > 0 and s["episodes"] > 100
    assert s["mean_return"] > 2 * RANDOM_CARTPOLE_RETURN, s

