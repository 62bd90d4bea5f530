"""D4PG: the categorical critic loss against a float64 numpy projection, the actor loss by
hand, priorities and importance weights when prioritized, the learner, and reaching -200 on
Pendulum-v1 through launch/run.py (slow)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.test_run import run, summary
from tests.test_sac import pendulum_unrolls
from trellis.agents import common
from trellis.agents.d4pg import D4PGBuilder, D4PGConfig
from trellis.agents.d4pg.learner import init_state, make_update
from trellis.agents.d4pg.losses import actor_loss, critic_loss
from trellis.envs import GymnasiumFactory


def projected_target(atoms, r, discount, probs):
    """Float64: each shifted atom r + discount z_j splits its mass between the two nearest
    atoms in proportion to closeness (Bellemare et al., 2017, Algorithm 1)."""
    atoms = np.asarray(atoms, np.float64)
    delta = atoms[1] - atoms[0]
    target = np.zeros_like(atoms)
    for z, p in zip(np.clip(r + discount * atoms, atoms[0], atoms[-1]), probs, strict=True):
        b = (z - atoms[0]) / delta
        lower, upper = int(np.floor(b)), int(np.ceil(b))
        if lower == upper:
            target[lower] += p
        else:
            target[lower] += p * (upper - b)
            target[upper] += p * (b - lower)
    return target


def test_critic_loss_is_cross_entropy_against_the_projected_target():
    rng = np.random.default_rng(0)
    atoms = np.linspace(-10.0, 10.0, 11)
    logits_tm1, logits_t = rng.normal(size=(2, 11))
    for r, discount in [(1.3, 0.9), (-4.0, 0.95 ** 5), (50.0, 0.9), (2.0, 0.0)]:
        probs_t = np.exp(logits_t) / np.exp(logits_t).sum()
        target = projected_target(atoms, r, discount, probs_t)
        log_p = logits_tm1 - np.log(np.exp(logits_tm1).sum())
        want = -np.sum(target * log_p)
        got = critic_loss(jnp.asarray(atoms, jnp.float32), jnp.asarray(logits_tm1, jnp.float32),
                          jnp.float32(r), jnp.float32(discount),
                          jnp.asarray(logits_t, jnp.float32))
        np.testing.assert_allclose(got, want, rtol=1e-5)
    # No gradient into the target critic's logits.
    grad = jax.grad(critic_loss, argnums=4)(jnp.asarray(atoms, jnp.float32),
                                            jnp.zeros(11), 1.0, 0.9, jnp.zeros(11))
    np.testing.assert_array_equal(grad, 0.0)


def test_actor_loss_is_minus_the_mean_return():
    atoms = jnp.array([-1.0, 0.0, 2.0])
    logits = jnp.log(jnp.array([0.2, 0.3, 0.5]))
    np.testing.assert_allclose(actor_loss(atoms, logits), -(-0.2 + 1.0), rtol=1e-6)


def pendulum(**overrides):
    config = D4PGConfig(min_replay_size=64, updates_per_step=8, sample_batch_size=32,
                        **overrides)
    builder = D4PGBuilder(config)
    spec = GymnasiumFactory("Pendulum-v1").spec()
    return builder, spec, builder.make_networks(spec), config


def test_prioritized_update_returns_priorities_and_weights_the_loss():
    _, _, networks, config = pendulum(priority_exponent=0.6, importance_exponent=1.0)
    optimizer = common.make_optimizer(config)
    state = init_state(networks, optimizer, jax.random.PRNGKey(0))
    rng = np.random.default_rng(0)
    batch = {"obs": rng.normal(size=(1, 4, 3)).astype(np.float32),
             "action": rng.uniform(-2, 2, size=(1, 4, 1)).astype(np.float32),
             "reward": rng.normal(size=(1, 4)).astype(np.float32),
             "discount": np.full((1, 4), 0.95, np.float32),
             "next_obs": rng.normal(size=(1, 4, 3)).astype(np.float32),
             "table_size": np.full((1, 4), 100.0, np.float32)}
    uniform = dict(batch, probability=np.full((1, 4), 0.01, np.float32))
    skewed = dict(batch, probability=np.array([[0.01, 0.02, 0.04, 0.08]], np.float32))
    update = jax.jit(make_update(networks, optimizer, config))
    _, m_uniform = update(state, uniform)
    _, m_skewed = update(state, skewed)
    # Priorities are the per-sample losses plus epsilon, whatever the weights.
    np.testing.assert_allclose(m_uniform["priorities"], m_skewed["priorities"], rtol=1e-6)
    per_sample = np.asarray(m_uniform["priorities"][0], np.float64) - config.priority_epsilon
    np.testing.assert_allclose(m_uniform["critic_loss"], per_sample.mean(), rtol=1e-5)
    weights = (100 * np.array([0.01, 0.02, 0.04, 0.08])) ** -1.0
    weights /= weights.max()
    np.testing.assert_allclose(m_skewed["critic_loss"], np.mean(weights * per_sample),
                               rtol=1e-5)
    _, _, networks, config = pendulum()
    _, metrics = jax.jit(make_update(networks, optimizer, config))(state, uniform)
    assert "priorities" not in metrics  # Uniform replay: nothing to write back.


def test_learner_reduces_critic_loss_and_config_checks_the_atoms():
    builder, spec, networks, _ = pendulum(discount=0.5, n_step=1, learning_rate=3e-3,
                                          v_min=-50.0, v_max=10.0)
    learner = builder.make_learner(networks, spec, jax.random.PRNGKey(0))
    unrolls = pendulum_unrolls(np.random.default_rng(1))
    first = learner.step(unrolls)
    losses = [float(learner.step({k: v[:1] for k, v in unrolls.items()})["critic_loss"])
              for _ in range(100)]
    assert np.mean(losses[-10:]) < 0.7 * float(first["critic_loss"]), (first, losses[-10:])
    with pytest.raises(ValueError, match="v_min"):
        D4PGConfig(v_min=1.0, v_max=0.0)


@pytest.mark.slow
def test_d4pg_reaches_minus_200_on_pendulum(tmp_path):
    out = run(["--agent=d4pg", "--platform=local_mp", "--env=Pendulum-v1",
               "--stop_at_return=-200", "--total_env_steps=500000", f"--logdir={tmp_path}"],
              timeout=600)
    assert out.returncode == 0, out.stderr
    s = summary(tmp_path)
    assert s["stopped_by"] == "return_target" and s["mean_return"] >= -200, s
