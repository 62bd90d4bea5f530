"""IMPALA learner: the update runs data-parallel and matches the single-device result."""

import textwrap

import numpy as np
import pytest

from tests.multidevice import assert_devices_match, run_with_cpu_devices

SCRIPT = textwrap.dedent("""
    import json, sys
    import jax, numpy as np
    from trellis.agents.impala import ImpalaBuilder, ImpalaConfig
    from trellis.builders.experiments.step_format import step_specs
    from trellis.envs import GymnasiumFactory

    builder = ImpalaBuilder(ImpalaConfig(batch_size=8, unroll_length=6, core=CORE, lstm_size=16))
    spec = GymnasiumFactory("CartPole-v1").spec()
    networks = builder.make_networks(spec)
    rng = np.random.default_rng(0)
    T, B = 7, 8
    batch = {
        "obs": rng.normal(size=(T, B, 4)).astype(np.float32),
        "action": rng.integers(0, 2, size=(T, B)).astype(np.int32),
        "logits": rng.normal(size=(T, B, 2)).astype(np.float32),
        "reward": np.ones((T, B), np.float32),
        "terminated": rng.random((T, B)) < 0.1,
        "truncated": np.zeros((T, B), bool),
        "first": rng.random((T, B)) < 0.1,
    }
    # The recurrent core's state at each unroll's first step, as inference records it.
    for name, v in builder.initial_state(spec, B).items():
        batch["state/" + name] = rng.normal(size=(1,) + v.shape).astype(np.float32)
    out = {}
    for n in (1, 2, 4):
        learner = builder.make_learner(networks, spec, jax.random.PRNGKey(0),
                                       devices=jax.devices()[:n])
        for _ in range(3):
            metrics = learner.step(batch)
        leaves = jax.tree.leaves(jax.device_get(learner.params))
        out[n] = {"params": [np.asarray(x).ravel().tolist() for x in leaves],
                  "loss": float(metrics["loss"]),
                  "shards": len(learner.params["params"]["Dense_0"]["kernel"].sharding.device_set)}
    print(json.dumps(out))
""")


# The LSTM variant is slow (three more compilations of the scanned core): in the slow suite.
@pytest.mark.parametrize("core", ["none", pytest.param("lstm", marks=pytest.mark.slow)])
def test_two_and_four_devices_match_one_device(core):
    result = run_with_cpu_devices(SCRIPT.replace("CORE", repr(core)), num_devices=4)
    assert set(result) == {"1", "2", "4"}
    assert_devices_match(result)


def _loss_inputs(seed, T=8, A=3):
    rng = np.random.default_rng(seed)
    return dict(
        logits=rng.normal(size=(T + 1, A)).astype(np.float32),
        values=rng.normal(size=T + 1).astype(np.float32),
        actions=rng.integers(0, A, size=T).astype(np.int32),
        behaviour_logits=rng.normal(size=(T, A)).astype(np.float32),
        rewards=rng.normal(size=T).astype(np.float32),
        discounts=np.full(T, 0.99, np.float32),
        mask=np.ones(T, np.float32),
    )


def test_masked_autoreset_transition_contributes_nothing():
    """What happens on the ignored-action reset step must not change the loss."""
    from trellis.agents.impala.losses import impala_loss

    kw = dict(baseline_cost=0.5, entropy_cost=0.01)
    x = _loss_inputs(0)
    x["mask"][4] = 0.0
    base, _ = impala_loss(**x, **kw)
    for field, value in (("rewards", 100.0), ("actions", (x["actions"][4] + 1) % 3)):
        changed = {k: v.copy() for k, v in x.items()}
        changed[field][4] = value
        np.testing.assert_allclose(impala_loss(**changed, **kw)[0], base, rtol=1e-6)


def test_on_policy_loss_matches_hand_computed_actor_critic():
    """rho = 1 everywhere: V-trace reduces to n-step returns; check each loss term by hand."""
    import jax

    from trellis.agents.impala.losses import impala_loss

    x = _loss_inputs(1, T=3)
    x["behaviour_logits"] = x["logits"][:-1]  # On-policy.
    loss, m = impala_loss(**x, baseline_cost=0.5, entropy_cost=0.01)
    v, r, d = x["values"].astype(np.float64), x["rewards"], x["discounts"]
    returns = np.zeros(3)
    acc = v[3]
    for t in reversed(range(3)):
        acc = r[t] + d[t] * acc
        returns[t] = acc
    log_pi = np.asarray(jax.nn.log_softmax(x["logits"][:-1].astype(np.float64)))
    log_pi_a = log_pi[np.arange(3), x["actions"]]
    # The pg advantage bootstraps from v_{s+1}, which on-policy is the n-step return.
    next_v = np.append(returns[1:], v[3])
    pg = -np.mean(log_pi_a * (r + d * next_v - v[:3]))
    baseline = 0.5 * np.mean((returns - v[:3]) ** 2)
    entropy = np.mean(-(np.exp(log_pi) * log_pi).sum(-1))
    np.testing.assert_allclose(m["pg_loss"], pg, rtol=1e-5)
    np.testing.assert_allclose(m["baseline_loss"], baseline, rtol=1e-5)
    np.testing.assert_allclose(m["entropy"], entropy, rtol=1e-5)
    np.testing.assert_allclose(loss, pg + 0.5 * baseline - 0.01 * entropy, rtol=1e-5)


def test_running_moments_match_float64_numpy_over_all_batches():
    """Merging batches of different sizes gives the mean and variance of all samples at once."""
    from trellis.agents.common import initial_moments, update_moments

    rng = np.random.default_rng(2)
    # CartPole-like scales: a large offset and a small spread in the second coordinate.
    batches = [rng.normal([1.0, 0.3], [2.0, 0.01], size=(n, 2)) for n in (1, 7, 160, 33)]
    moments = initial_moments((2,))
    for i, x in enumerate(batches):
        moments = update_moments(moments, x.astype(np.float32))
        seen = np.concatenate(batches[:i + 1])  # float64
        assert float(moments["count"]) == len(seen)
        np.testing.assert_allclose(moments["mean"], seen.mean(0), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(moments["var"], seen.var(0), rtol=1e-4)


def _cartpole_batch(T=6, B=4, seed=3):
    rng = np.random.default_rng(seed)
    return {
        "obs": rng.normal([0.5, -0.1], [1.0, 0.05], size=(T, B, 2)).astype(np.float32),
        "action": rng.integers(0, 2, size=(T, B)).astype(np.int32),
        "logits": rng.normal(size=(T, B, 2)).astype(np.float32),
        "reward": np.ones((T, B), np.float32),
        "terminated": np.zeros((T, B), bool),
        "truncated": np.zeros((T, B), bool),
        "first": np.zeros((T, B), bool),
        "state/c": np.zeros((1, B, 8), np.float32),
        "state/h": np.zeros((1, B, 8), np.float32),
    }


def test_learner_keeps_the_moments_of_its_batches_in_the_published_params():
    """Each update merges the batch's new observations (not the repeated step 0) into the
    moments the params carry, so the actor normalizes with what the learner used."""
    import jax

    from trellis.agents.common import DataParallelLearner
    from trellis.agents.impala import ImpalaBuilder, ImpalaConfig
    from trellis.agents.impala.learner import make_training
    from trellis.envs import EnvSpec

    spec = EnvSpec((2,), "float32", 2, (), "int32")
    config = ImpalaConfig(core="lstm", lstm_size=8, hidden_sizes=(16,), batch_size=4,
                          unroll_length=5)
    assert config.normalize_observations
    networks = ImpalaBuilder(config).make_networks(spec)
    learner = DataParallelLearner(make_training(networks, config), jax.random.PRNGKey(0),
                                  config.batch_size)
    before = jax.device_get(learner.params["params"])
    batches = [_cartpole_batch(seed=s) for s in (3, 4)]
    for batch in batches:
        learner.step(batch)
    moments = jax.device_get(learner.params["obs_norm"]["normalizer"])
    seen = np.concatenate([b["obs"][1:].reshape(-1, 2) for b in batches]).astype(np.float64)
    assert float(moments["count"]) == len(seen) == 2 * 5 * 4
    np.testing.assert_allclose(moments["mean"], seen.mean(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(moments["var"], seen.var(0), rtol=1e-4)
    # The network itself still trains.
    after = jax.device_get(learner.params["params"])
    assert any(np.abs(a - b).max() > 0 for a, b in zip(jax.tree.leaves(after),
                                                       jax.tree.leaves(before), strict=True))


def test_core_defaults_fill_only_the_fields_left_unset():
    """The feed-forward defaults are the values CartPole-v1 was tuned with (no moments in its
    network); the LSTM ones differ; a value given explicitly always wins."""
    import jax

    from trellis.agents.impala import ImpalaBuilder, ImpalaConfig
    from trellis.envs import EnvSpec

    ff, lstm = ImpalaConfig(), ImpalaConfig(core="lstm")
    assert (ff.learning_rate, ff.hidden_sizes, ff.normalize_observations) == (4e-3, (64, 64), False)
    assert (lstm.learning_rate, lstm.hidden_sizes, lstm.normalize_observations) == (
        3e-3, (64,), True)
    mine = ImpalaConfig(core="lstm", learning_rate=1e-3, normalize_observations=False)
    assert (mine.learning_rate, mine.normalize_observations) == (1e-3, False)
    spec = EnvSpec((2,), "float32", 2, (), "int32")
    for config, expected in ((ff, False), (lstm, True), (mine, False),
                             (ImpalaConfig(normalize_observations=True), True)):
        variables = ImpalaBuilder(config).make_networks(spec).init(jax.random.PRNGKey(0))
        assert ("obs_norm" in variables) == expected, config


@pytest.mark.parametrize("env, settings", [("CartPole-v1", {}),
                                           ("minatar:Breakout", {"pixel_torso": "minatar"})])
def test_the_init_compiled_for_start_up_gives_the_default_compiles_state(env, settings):
    """The learner compiles its one-off init on the host's CPU at a lower backend
    optimisation level (agents/common/learners.py): the state must be the default compile's
    there, bit for bit, and placed on the learner's devices as its update takes it."""
    import jax
    from jax.sharding import PartitionSpec

    from trellis.agents.common import DataParallelLearner
    from trellis.agents.impala import ImpalaBuilder, ImpalaConfig
    from trellis.agents.impala.learner import make_training
    from trellis.envs import make_env_factory

    config = ImpalaConfig(**settings)
    networks = ImpalaBuilder(config).make_networks(make_env_factory(env).spec())
    key = jax.random.PRNGKey(7)
    cpu = jax.devices("cpu")[0]
    expected = jax.jit(make_training(networks, config).init)(jax.device_put(key, cpu))
    devices = jax.devices()[:1]
    state = DataParallelLearner(make_training(networks, config), key, config.batch_size,
                                devices).state
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(state), jax.device_get(expected))
    for leaf in jax.tree.leaves(state):
        assert leaf.sharding.spec == PartitionSpec()
        assert leaf.sharding.mesh.devices.tolist() == devices


def test_the_init_runs_on_the_learner_devices_where_jax_has_no_cpu_backend(monkeypatch):
    # JAX_PLATFORMS naming only an accelerator leaves JAX without its CPU backend:
    # jax.devices("cpu") raises there, and the learner must still make its state.
    import jax

    from trellis.agents.common import DataParallelLearner
    from trellis.agents.impala import ImpalaBuilder, ImpalaConfig
    from trellis.agents.impala.learner import make_training
    from trellis.envs import make_env_factory

    config = ImpalaConfig()
    networks = ImpalaBuilder(config).make_networks(make_env_factory("CartPole-v1").spec())
    key = jax.random.PRNGKey(7)
    expected = jax.jit(make_training(networks, config).init)(key)
    devices = jax.devices()

    def without_cpu(backend=None):
        if backend == "cpu":
            raise RuntimeError("Unknown backend cpu. Available backends are ['cuda']")
        return devices

    monkeypatch.setattr(jax, "devices", without_cpu)
    state = DataParallelLearner(make_training(networks, config), key, config.batch_size,
                                devices[:1]).state
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(state), jax.device_get(expected))
