"""R2D2: value rescaling, n-step double-Q TD errors with episode boundaries, priorities and
the weighted loss against float64 numpy references; burn-in; the epsilon ladder and policy."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from trellis.agents.common import importance_weights, init_target_network_state, make_optimizer
from trellis.agents.r2d2 import R2D2Builder, R2D2Config
from trellis.agents.r2d2.builder import epsilon_ladder
from trellis.agents.r2d2.learner import make_update
from trellis.agents.r2d2.losses import (
    sequence_priority,
    sequence_td_errors,
    value_rescaling,
    weighted_sequence_loss,
)
from trellis.builders.contract.agent import REPLAY_PROBABILITY, REPLAY_TABLE_SIZE, STATE_PREFIX
from trellis.envs.specs import EnvSpec

EPS = 1e-3


def h_ref(x, eps=EPS):
    """h(x) = sign(x) (sqrt(|x| + 1) - 1) + eps x (Pohlen et al., 2018), float64."""
    return np.sign(x) * (np.sqrt(np.abs(x) + 1.0) - 1.0) + eps * x


def h_inv_ref(x, eps=EPS):
    """The closed-form inverse (Pohlen et al., 2018, Proposition A.2), float64."""
    root = (np.sqrt(1.0 + 4.0 * eps * (np.abs(x) + 1.0 + eps)) - 1.0) / (2.0 * eps)
    return np.sign(x) * (root ** 2 - 1.0)


def test_value_rescaling_matches_the_paper_and_inverts():
    x = np.concatenate([np.linspace(-1000, 1000, 41), [0.0, 1e-3, -0.5, 3.0]])
    tx = value_rescaling(EPS)
    h = np.asarray(tx.apply(jnp.asarray(x, jnp.float32)), np.float64)
    np.testing.assert_allclose(h, h_ref(x), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(h_inv_ref(h_ref(x)), x, rtol=1e-9, atol=1e-9)  # The reference.
    back = np.asarray(tx.apply_inv(tx.apply(jnp.asarray(x, jnp.float32))), np.float64)
    np.testing.assert_allclose(back, x, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(float(tx.apply(jnp.float32(3.0))), 1.0 + 3e-3, rtol=1e-6)


def random_trace(rng, t1=12, num_actions=3, ends=3):
    """A trace of t1 steps in the unrolls' layout with `ends` episode ends (terminations and
    truncations, each followed by a `first` step); rewards are random everywhere, so a
    return that crossed an episode boundary would differ."""
    terminated = np.zeros(t1, bool)
    truncated = np.zeros(t1, bool)
    first = np.zeros(t1, bool)
    first[0] = rng.random() < 0.5
    for s in rng.choice(np.arange(1, t1 - 1), size=ends, replace=False):
        if first[s]:
            continue  # A final observation is not also a first one.
        (terminated if rng.random() < 0.5 else truncated)[s] = True
        first[s + 1] = True
        terminated[s + 1] = truncated[s + 1] = False
    def floats(*shape):  # float32 values, so the float64 reference sees the same inputs.
        return (rng.normal(size=shape) * 2.0).astype(np.float32).astype(np.float64)

    return dict(
        q_online=floats(t1, num_actions), q_target=floats(t1, num_actions),
        action=rng.integers(0, num_actions, t1).astype(np.int32), reward=floats(t1),
        terminated=terminated, truncated=truncated, first=first)


def reference_td(trace, discount, n):
    """Float64 loops: from each t walk forward up to n steps, stopping at an episode's final
    observation (no bootstrap after a termination) or at the trace's last step; bootstrap
    from h^-1 of the target network's value of the online network's greedy action."""
    q, qt = trace["q_online"], trace["q_target"]
    t_max = len(trace["reward"]) - 1
    td, mask = np.zeros(t_max), np.zeros(t_max)
    for t in range(t_max):
        mask[t] = not trace["first"][t + 1]
        g, scale, end = 0.0, 1.0, t
        for s in range(t + 1, min(t + n, t_max) + 1):
            g += scale * trace["reward"][s]
            scale *= discount
            end = s
            if trace["terminated"][s]:
                scale = 0.0
                break
            if trace["truncated"][s]:
                break
        v = h_inv_ref(qt[end, np.argmax(q[end])])
        td[t] = h_ref(g + scale * v) - q[t, trace["action"][t]]
    return td, mask


def jnp_trace(trace):
    return {k: jnp.asarray(v, jnp.float32 if v.dtype == np.float64 else v.dtype)
            for k, v in trace.items()}


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("n", [1, 3, 5])
def test_n_step_double_q_td_errors_match_float64_reference(n, jit):
    discount = 0.97

    def f(x):
        return sequence_td_errors(x["q_online"], x["q_target"], x["action"], x["reward"],
                                  x["terminated"], x["truncated"], x["first"],
                                  discount=discount, n_step=n, eps=EPS)

    f = jax.jit(f) if jit else f
    for seed in range(3):
        trace = random_trace(np.random.default_rng(seed))
        assert trace["terminated"].any() or trace["truncated"].any()
        td, mask = f(jnp_trace(trace))
        ref_td, ref_mask = reference_td(trace, discount, n)
        np.testing.assert_array_equal(np.asarray(mask), ref_mask)
        valid = ref_mask.astype(bool)
        # h^-1 in float32 loses ~1e-4 to cancellation (sqrt(1 + 4 eps (|x| + 1 + eps)) - 1);
        # a wrong step, bootstrap or boundary is off by O(1).
        np.testing.assert_allclose(np.asarray(td)[valid], ref_td[valid], rtol=1e-4, atol=2e-4)


def test_td_error_by_hand():
    """One 2-step return that ends in a truncation: bootstrap from the final observation."""
    trace = {
        "q_online": np.array([[1.0, 0.0], [0.0, 0.0], [0.0, 5.0], [9.0, 0.0]]),
        "q_target": np.array([[0.0, 0.0], [0.0, 0.0], [10.0, 2.0], [0.0, 0.0]]),
        "action": np.array([0, 1, 0, 0], np.int32),
        "reward": np.array([0.0, 1.0, 2.0, 100.0]),
        "terminated": np.zeros(4, bool), "truncated": np.array([False, False, True, False]),
        "first": np.array([False, False, False, True]),
    }
    td, mask = sequence_td_errors(**{k: v for k, v in jnp_trace(trace).items()},
                                  discount=0.5, n_step=3, eps=EPS)
    # From t=0: 1 + 0.5 * 2, then stop at the truncation (the reward 100 of the next episode
    # never enters); bootstrap 0.25 * h^-1(q_target[2, argmax q_online[2] = 1] = 2).
    expected = h_ref(1.0 + 0.5 * 2.0 + 0.25 * h_inv_ref(2.0)) - 1.0
    np.testing.assert_allclose(float(td[0]), expected, atol=1e-4)  # float32 h^-1, as above.
    np.testing.assert_array_equal(np.asarray(mask), [1.0, 1.0, 0.0])


def test_priority_mixes_max_and_mean_over_unmasked_steps():
    rng = np.random.default_rng(3)
    td = rng.normal(size=(5, 9))
    mask = (rng.random((5, 9)) < 0.7).astype(np.float64)
    mask[0] = 0.0  # A sequence with no transition at all.
    td[1, ~mask[1].astype(bool)] = 100.0  # Masked-out steps must not count.
    got = jax.vmap(sequence_priority, in_axes=(0, 0, None))(
        jnp.asarray(td, jnp.float32), jnp.asarray(mask, jnp.float32), 0.9)
    for b in range(5):
        a = np.abs(td[b][mask[b] > 0])
        ref = 0.9 * a.max() + 0.1 * a.mean() if a.size else 0.0
        np.testing.assert_allclose(float(got[b]), ref, rtol=1e-5, atol=1e-7)


def test_importance_weighted_loss_matches_float64_reference():
    rng = np.random.default_rng(4)
    td, mask = rng.normal(size=(4, 6)), (rng.random((4, 6)) < 0.8).astype(np.float64)
    probs, size = np.array([0.1, 0.02, 0.3, 0.05]), np.full(4, 50.0)
    raw = (size * probs) ** -0.6
    ref_w = raw / raw.max()
    w = importance_weights(jnp.asarray(probs, jnp.float32), jnp.asarray(size, jnp.float32), 0.6)
    np.testing.assert_allclose(np.asarray(w), ref_w, rtol=1e-5)
    loss = weighted_sequence_loss(jnp.asarray(td, jnp.float32), jnp.asarray(mask, jnp.float32),
                                  w)
    ref = np.mean(ref_w * 0.5 * np.sum(mask * td ** 2, axis=1) / 6)
    np.testing.assert_allclose(float(loss), ref, rtol=1e-5)


def test_epsilon_ladder_follows_horgan_et_al():
    eps = epsilon_ladder(8, 0.4, 7.0)
    np.testing.assert_allclose(eps, [0.4 ** (1 + 7 * i / 7) for i in range(8)], rtol=1e-6)
    np.testing.assert_allclose(epsilon_ladder(1, 0.4, 7.0), [0.4])


def test_config_rejects_a_period_that_skips_steps():
    with pytest.raises(ValueError, match="unroll_length must be <= trace_length = 20"):
        R2D2Config(unroll_length=21, trace_length=20)
    c = R2D2Config(burn_in=5, trace_length=8, unroll_length=4)
    assert c.sequence_length == 14 and c.overlap == 10
    spec = R2D2Builder(c).queue_spec()
    assert (spec.unroll_length, spec.overlap) == (13, 10)


# --- Learner ------------------------------------------------------------------------------

SMALL = dict(burn_in=3, trace_length=5, unroll_length=4, batch_size=4, hidden_sizes=(8,),
             lstm_size=8, n_step=2, min_replay_size=4, replay_size=64,
             target_update_period=1000, learning_rate=3e-3)


def random_sequences(rng, config, spec, batch_size):
    """B sequences of the recorded fields, time-major, with episode ends, a random stored
    LSTM state and uniform sampling statistics."""
    t1, b = config.sequence_length, batch_size
    first = rng.random((t1, b)) < 0.15
    terminated = np.zeros((t1, b), bool)
    terminated[:-1] = first[1:]
    h = config.lstm_size
    return {
        "obs": rng.normal(size=(t1, b) + spec.observation_shape).astype(np.float32),
        "action": rng.integers(0, spec.num_actions, (t1, b)).astype(np.int32),
        "reward": rng.normal(size=(t1, b)).astype(np.float32),
        "terminated": terminated, "truncated": np.zeros((t1, b), bool), "first": first,
        STATE_PREFIX + "c": rng.normal(size=(1, b, h)).astype(np.float32),
        STATE_PREFIX + "h": rng.normal(size=(1, b, h)).astype(np.float32),
        STATE_PREFIX + "epsilon": np.full((1, b), 0.1, np.float32),
        REPLAY_PROBABILITY: np.full((1, b), 1.0 / 16, np.float32),
        REPLAY_TABLE_SIZE: np.full((1, b), 16.0, np.float32),
    }


CARTPOLE = EnvSpec((4,), "float32", 2, (), "int32")


@functools.cache  # One compiled update per burn-in for the whole module.
def small_update(burn_in=SMALL["burn_in"]):
    config = R2D2Config(**dict(SMALL, burn_in=burn_in))
    builder = R2D2Builder(config)
    networks = builder.make_networks(CARTPOLE)
    optimizer = make_optimizer(config)
    state = init_target_network_state(networks.init, optimizer, jax.random.PRNGKey(0))
    return config, networks, state, jax.jit(make_update(networks, optimizer, config))


def test_burn_in_rebuilds_the_state_without_gradient():
    """An update with burn-in equals one without, on the trace alone, whose stored state is
    the state the burn-in reaches: the burn-in only carries the state forward, and no
    gradient flows through it (it would change the update otherwise)."""
    config, networks, state, update = small_update()
    batch = random_sequences(np.random.default_rng(0), config, CARTPOLE, 4)
    bi = config.burn_in
    stored = {"c": batch["state/c"][0], "h": batch["state/h"][0]}
    reached, _ = networks.apply(state.params, stored, batch["obs"][:bi], batch["first"][:bi])
    trace = {k: (v[bi:] if v.shape[0] == config.sequence_length else v)
             for k, v in batch.items()}
    trace["state/c"], trace["state/h"] = (np.asarray(reached[k])[None] for k in ("c", "h"))
    _, _, _, no_burn_in = small_update(burn_in=0)
    with_bi, m1 = update(state, batch)
    without, m2 = no_burn_in(state, trace)
    chex.assert_trees_all_close(with_bi.params, without.params, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(m1["priorities"], m2["priorities"], rtol=1e-5)
    # The burn-in matters: starting the trace from the stored state instead differs.
    trace["state/c"], trace["state/h"] = batch["state/c"], batch["state/h"]
    _, m3 = no_burn_in(state, trace)
    assert not np.allclose(m1["priorities"], m3["priorities"], rtol=1e-3)


def test_updates_reduce_td_error_on_a_fixed_batch():
    config, _, state, update = small_update()
    batch = random_sequences(np.random.default_rng(1), config, CARTPOLE, 4)
    state, first = update(state, batch)
    for _ in range(100):
        state, last = update(state, batch)
    assert float(last["td_abs"]) < 0.5 * float(first["td_abs"]), (first, last)
    assert int(state.step) == 101
