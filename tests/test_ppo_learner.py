"""PPO learner: one update learns, 2- and 4-device data parallel match 1 device, the Gaussian
head learns end to end through the builder's policy and learner, config errors speak."""

import textwrap

import jax
import numpy as np
import pytest

from tests.multidevice import assert_devices_match, run_with_cpu_devices
from trellis.agents.ppo import PPOBuilder, PPOConfig
from trellis.envs.specs import EnvSpec

CARTPOLE = EnvSpec((4,), "float32", 2, (), "int32")
BOX = EnvSpec((3,), "float32", None, (1,), "float32", (-2.0,), (2.0,))


def random_batch(seed, T=7, B=8):
    """Random unrolls [T + 1, B] with autoreset episode boundaries, as inference records."""
    rng = np.random.default_rng(seed)
    done = rng.random((T + 1, B)) < 0.15
    terminated = done & (rng.random((T + 1, B)) < 0.5)
    first = np.zeros((T + 1, B), bool)
    first[0] = True
    first[1:] = done[:-1]
    terminated &= ~first
    return {
        "obs": rng.normal(size=(T + 1, B, 4)).astype(np.float32),
        "action": rng.integers(0, 2, size=(T + 1, B)).astype(np.int32),
        "log_prob": np.log(rng.uniform(0.3, 0.7, size=(T + 1, B))).astype(np.float32),
        "value": rng.normal(size=(T + 1, B)).astype(np.float32),
        "reward": np.where(first, 0.0, 1.0).astype(np.float32),
        "terminated": terminated,
        "truncated": done & ~terminated & ~first,
        "first": first,
    }


def test_one_update_changes_params_with_finite_metrics():
    config = PPOConfig(unroll_length=7, batch_size=8, num_minibatches=4, num_epochs=2)
    builder = PPOBuilder(config)
    networks = builder.make_networks(CARTPOLE)
    learner = builder.make_learner(networks, CARTPOLE, jax.random.PRNGKey(0))
    before = jax.device_get(learner.params)
    metrics = jax.device_get(learner.step(random_batch(0, T=7, B=8)))
    after = jax.device_get(learner.params)
    changed = [not np.allclose(a, b) for a, b in
               zip(jax.tree.leaves(before), jax.tree.leaves(after), strict=True)]
    assert all(changed)
    assert int(learner.state.step) == 1
    for name in ("loss", "pg_loss", "value_loss", "entropy", "approx_kl", "clip_fraction",
                 "grad_norm"):
        assert np.isfinite(metrics[name]), (name, metrics)
    assert metrics["entropy"] > 0.6  # Near log(2): the small policy init starts near uniform.


def test_a_shared_torso_is_one_torso_that_the_value_loss_trains_too():
    obs = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    nets = {shared: PPOBuilder(PPOConfig(shared_torso=shared)).make_networks(CARTPOLE)
            for shared in (False, True)}
    params = {shared: net.init(jax.random.PRNGKey(0)) for shared, net in nets.items()}
    # Two torsos and two heads apart; one torso and the two heads shared.
    assert len(params[False]["params"]) == 4 and len(params[True]["params"]) == 3
    head_sizes = {k: v["kernel"].shape for k, v in params[True]["params"].items()
                  if k.startswith("Dense")}
    assert sorted(head_sizes.values()) == [(64, 1), (64, 2)], head_sizes

    def value_loss(p, shared):
        return jax.numpy.sum(nets[shared].apply(p, obs)[1] ** 2)

    for shared in (True, False):
        grads = jax.grad(value_loss)(params[shared], shared)["params"]["policy_torso"]
        reached = any(np.abs(g).max() > 0 for g in jax.tree.leaves(grads))
        assert reached == shared  # Apart, the value loss leaves the policy's torso alone.



def test_one_minibatch_takes_one_step_on_the_whole_batch_in_any_order():
    """With one minibatch the update skips the shuffle: one Adam step on all T * B transitions,
    so the env order in the batch does not matter; two minibatches take two steps."""
    def params_after(batch, num_minibatches):
        config = PPOConfig(unroll_length=7, batch_size=8, num_minibatches=num_minibatches,
                           num_epochs=1)
        builder = PPOBuilder(config)
        learner = builder.make_learner(builder.make_networks(CARTPOLE), CARTPOLE,
                                       jax.random.PRNGKey(0))
        learner.step(batch)
        return jax.tree.leaves(jax.device_get(learner.params))

    batch = random_batch(0, T=7, B=8)
    reversed_envs = {k: v[:, ::-1] for k, v in batch.items()}
    one = params_after(batch, 1)
    for a, b in zip(one, params_after(reversed_envs, 1), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert any(not np.allclose(a, b) for a, b in zip(one, params_after(batch, 2), strict=True))

SCRIPT = textwrap.dedent("""
    import json
    import jax, numpy as np
    from trellis.agents.ppo import PPOBuilder, PPOConfig
    from trellis.envs.specs import EnvSpec
    from tests.test_ppo_learner import random_batch

    config = PPOConfig(unroll_length=6, batch_size=8, num_minibatches=4, num_epochs=2)
    builder, spec = PPOBuilder(config), EnvSpec((4,), "float32", 2, (), "int32")
    networks = builder.make_networks(spec)
    out = {}
    for n in (1, 2, 4):
        learner = builder.make_learner(networks, spec, jax.random.PRNGKey(0),
                                       devices=jax.devices()[:n])
        for i in range(3):
            metrics = learner.step(random_batch(i, T=6, B=8))
        leaves = jax.tree.leaves(jax.device_get(learner.params))
        kernel = learner.params["params"]["policy_torso"]["Dense_0"]["kernel"]
        out[n] = {"params": [np.asarray(x).ravel().tolist() for x in leaves],
                  "loss": float(metrics["loss"]),
                  "shards": len(kernel.sharding.device_set)}
    print(json.dumps(out))
""")


def test_two_and_four_devices_match_one_device():
    """Minibatches of 12 transitions, shuffled over the whole batch, split over 2 or 4."""
    result = run_with_cpu_devices(SCRIPT, num_devices=4)
    assert set(result) == {"1", "2", "4"}
    assert_devices_match(result)


def test_gaussian_policy_learns_a_continuous_bandit():
    """One-step episodes with reward -(a - 1)^2: through the builder's sampling policy (env
    actions clipped, raw samples recorded) and the learner, the mean action moves to 1."""
    config = PPOConfig(unroll_length=1, batch_size=64, num_minibatches=2, num_epochs=4,
                       learning_rate=1e-2)
    builder = PPOBuilder(config)
    networks = builder.make_networks(BOX)
    extras = builder.extras_spec(BOX)
    assert set(extras) == {"log_prob", "value", "raw_action"}
    policy = jax.jit(builder.make_policy(networks))
    greedy = jax.jit(builder.make_policy(networks, evaluation=True))
    learner = builder.make_learner(networks, BOX, jax.random.PRNGKey(0))
    obs = np.ones((64, 3), np.float32)
    key = jax.random.PRNGKey(1)

    first = np.zeros(64, bool)

    def mean_action():
        return float(np.mean(greedy(learner.params, key, obs, {}, first)[0]))

    start = mean_action()
    for _ in range(40):
        key, k0, k1 = jax.random.split(key, 3)
        steps = [jax.device_get(policy(learner.params, k, obs, {}, first)[:2]) for k in (k0, k1)]
        (a0, x0), (a1, x1) = steps
        assert np.all(np.abs(a0) <= 2.0) and x0["raw_action"].shape == (64, 1)
        batch = {
            "obs": np.stack([obs, obs]),
            "action": np.stack([a0, a1]),
            **{k: np.stack([x0[k], x1[k]]) for k in extras},
            "reward": np.stack([np.zeros(64), -np.square(a0[:, 0] - 1.0)]).astype(np.float32),
            "terminated": np.array([[False] * 64, [True] * 64]),
            "truncated": np.zeros((2, 64), bool),
            "first": np.array([[True] * 64, [False] * 64]),
        }
        metrics = jax.device_get(learner.step(batch))
        assert all(np.isfinite(v) for v in metrics.values()), metrics
    assert abs(start) < 0.1 and mean_action() > 0.7, (start, mean_action())


@pytest.mark.parametrize("kwargs,message", [
    (dict(unroll_length=5, batch_size=3, num_minibatches=4),
     "num_minibatches must be a divisor of unroll_length * batch_size = 15"),
    (dict(value_clip_epsilon=0.0), "value_clip_epsilon must be > 0 or None"),
    (dict(gae_lambda=1.5), "gae_lambda must be in [0, 1], got 1.5"),
])
def test_config_errors_say_what_is_wrong(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("*", r"\*")):
        PPOConfig(**kwargs)


def test_random_order_is_a_uniform_permutation():
    from trellis.agents.ppo.learner import random_order

    for n in (1, 2, 7, 256, 1000):
        order = np.asarray(random_order(jax.random.key(n), n))
        assert sorted(order.tolist()) == list(range(n))
    a, b = (np.asarray(random_order(jax.random.key(k), 256)) for k in (0, 1))
    assert (a != b).mean() > 0.9
    # Where each of 8 items lands over 8,000 draws: 1,000 per (item, position) if uniform,
    # sd sqrt(8000 * 1/8 * 7/8) = 29.6; 5 sd allowed.
    orders = np.asarray(jax.vmap(lambda k: random_order(k, 8))(
        jax.random.split(jax.random.key(9), 8000)))
    counts = np.stack([(orders == item).sum(axis=0) for item in range(8)])
    assert np.abs(counts - 1000).max() < 5 * 29.6
    big = 1 << 17  # Too many indices for the packed keys: jax.random.permutation's.
    np.testing.assert_array_equal(random_order(jax.random.key(3), big),
                                  jax.random.permutation(jax.random.key(3), big))
