"""TD3 and its DDPG preset: the losses against hand-computed numbers, target smoothing's clips,
the delayed policy and target updates, the policies, and runs through launch/run.py on
Pendulum-v1 (a short one in the default suite, the -200 target in the slow one)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.test_run import run, summary
from tests.test_sac import LEARNED_PENDULUM_RETURN, pendulum_unrolls
from trellis.agents import common
from trellis.agents.common.continuous import Bounds, deterministic_policy
from trellis.agents.d4pg import D4PGBuilder, D4PGConfig
from trellis.agents.td3 import TD3Builder, TD3Config
from trellis.agents.td3.config import DDPGConfig
from trellis.agents.td3.learner import init_state, make_update
from trellis.agents.td3.losses import (
    actor_loss,
    critic_loss,
    smoothed_target_action,
    td3_target,
)
from trellis.envs import GymnasiumFactory


def test_target_and_losses_by_hand():
    np.testing.assert_allclose(td3_target(jnp.array(1.0), jnp.array(0.9), jnp.array([3.0, 2.0])),
                               1.0 + 0.9 * 2.0, rtol=1e-6)
    np.testing.assert_allclose(td3_target(jnp.array(1.0), jnp.array(0.0), jnp.array([3.0])), 1.0)
    grad = jax.grad(lambda q: td3_target(jnp.array(1.0), jnp.array(0.9), q))
    np.testing.assert_array_equal(grad(jnp.array([3.0, 2.0])), 0.0)
    np.testing.assert_allclose(critic_loss(jnp.array([1.0, 3.5]), jnp.array(2.0)),
                               0.5 * (1.0 + 2.25), rtol=1e-6)
    np.testing.assert_allclose(jax.grad(actor_loss)(jnp.array(4.0)), -1.0)


def test_target_smoothing_clips_the_noise_then_the_action():
    key = jax.random.PRNGKey(0)
    scale, low, high = jnp.array([2.0, 0.5]), jnp.array([-2.0, -1.0]), jnp.array([2.0, 0.0])
    u = jnp.array([0.3, -0.9])
    # The same draw as the function's, in float64: noise * scale * N(0, 1), clipped, added.
    eps = 0.2 * np.asarray(scale, np.float64) * np.asarray(
        jax.random.normal(key, (2,)), np.float64)
    want = np.clip(np.asarray(u) + np.clip(eps, -0.5 * np.asarray(scale),
                                           0.5 * np.asarray(scale)), low, high)
    got = smoothed_target_action(key, u, scale, 0.2, 0.5, low, high)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    # Huge noise: clipped to +-noise_clip * scale around u, then to the bounds.
    many = jax.vmap(smoothed_target_action, in_axes=(0, None, None, None, None, None, None))(
        jax.random.split(key, 1000), u, scale, 100.0, 0.5, low, high)
    first, second = np.asarray(many[:, 0]), np.asarray(many[:, 1])
    assert np.all((first >= 0.3 - 1.0 - 1e-6) & (first <= 0.3 + 1.0 + 1e-6))
    assert np.mean(np.isclose(first, -0.7) | np.isclose(first, 1.3)) > 0.98
    # The second: +-0.25 around -0.9, then the lower bound -1.0 cuts the noise's lower clip.
    assert np.all((second >= -1.0) & (second <= -0.65 + 1e-6))
    assert np.mean(np.isclose(second, -1.0) | np.isclose(second, -0.65)) > 0.98
    # No noise: the target policy's action itself (DDPG).
    np.testing.assert_array_equal(smoothed_target_action(key, u, scale, 0.0, 0.5, low, high), u)


def pendulum(config):
    builder = TD3Builder(config)
    spec = GymnasiumFactory("Pendulum-v1").spec()
    return builder, spec, builder.make_networks(spec)


def minibatches(u=3, s=8):
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(u, s, 3)).astype(np.float32)
    return {"obs": obs, "action": rng.uniform(-2, 2, size=(u, s, 1)).astype(np.float32),
            "reward": rng.normal(size=(u, s)).astype(np.float32),
            "discount": np.full((u, s), 0.99, np.float32),
            "next_obs": rng.normal(size=(u, s, 3)).astype(np.float32)}


@pytest.mark.parametrize("delay", [1, 2, 3])
def test_policy_and_targets_move_on_every_delay_th_critic_step_only(delay):
    config = TD3Config(policy_delay=delay, tau=0.1)
    _, _, networks = pendulum(config)
    optimizer = common.make_optimizer(config)
    update = jax.jit(make_update(networks, optimizer, config))
    state = init_state(networks, optimizer, jax.random.PRNGKey(0))
    batch = minibatches(u=1)
    for step in range(1, 7):
        new, metrics = update(state, batch)
        moved = not np.allclose(jax.tree.leaves(new.policy_params)[0],
                                jax.tree.leaves(state.policy_params)[0])
        assert moved == (step % delay == 0), (step, delay)
        # Critics move every step; the targets follow them by Polyak only with the policy.
        assert not np.allclose(jax.tree.leaves(new.critic_params)[0],
                               jax.tree.leaves(state.critic_params)[0])
        if moved:
            expected = jax.tree.map(lambda online, old: 0.1 * online + 0.9 * old,
                                    new.critic_params, state.target_critic_params)
            jax.tree.map(lambda got, want: np.testing.assert_allclose(got, want, rtol=1e-5,
                                                                      atol=1e-6),
                         new.target_critic_params, expected)
        else:
            jax.tree.map(np.testing.assert_array_equal, new.target_critic_params,
                         state.target_critic_params)
            assert float(metrics["actor_loss"]) == 0.0
        state = new


def test_ddpg_is_td3_with_its_three_tricks_off():
    ddpg = DDPGConfig()
    assert (ddpg.twin_critics, ddpg.policy_delay, ddpg.target_noise) == (False, 1, 0.0)
    _, spec, networks = pendulum(ddpg)
    params = networks.init_critic(jax.random.PRNGKey(0))
    q = networks.critic(params, jnp.zeros((5, 3)), jnp.zeros((5, 1)))
    assert q.shape == (5, 1)
    _, _, twin = pendulum(TD3Config())
    assert twin.critic(twin.init_critic(jax.random.PRNGKey(0)), jnp.zeros((5, 3)),
                       jnp.zeros((5, 1))).shape == (5, 2)
    with pytest.raises(ValueError, match="DDPG needs flat Box actions"):
        TD3Builder(ddpg).make_networks(GymnasiumFactory("CartPole-v1").spec())


def test_learner_reduces_critic_loss_on_a_fixed_batch():
    builder, spec, networks = pendulum(TD3Config(min_replay_size=64, updates_per_step=8,
                                                 sample_batch_size=32, discount=0.5,
                                                 learning_rate=3e-3))
    learner = builder.make_learner(networks, spec, jax.random.PRNGKey(0))
    unrolls = pendulum_unrolls(np.random.default_rng(1))
    first = learner.step(unrolls)
    losses = [float(learner.step({k: v[:1] for k, v in unrolls.items()})["critic_loss"])
              for _ in range(100)]
    assert np.mean(losses[-10:]) < 0.5 * float(first["critic_loss"]), (first, losses[-10:])


def test_policy_explores_in_bounds_when_training_and_is_deterministic_when_evaluating():
    builder, spec, networks = pendulum(TD3Config(exploration_noise=0.5))
    params = {"policy": networks.init_policy(jax.random.PRNGKey(0)), "learned": jnp.array(True)}
    obs = jnp.asarray(np.random.default_rng(3).normal(size=(64, 3)), jnp.float32)
    first = jnp.zeros(64, bool)
    evaluate = jax.jit(builder.make_policy(networks, evaluation=True))
    train = jax.jit(builder.make_policy(networks))
    a1, a2 = (np.asarray(evaluate(params, jax.random.PRNGKey(k), obs, {}, first)[0])
              for k in (1, 2))
    np.testing.assert_array_equal(a1, a2)
    np.testing.assert_allclose(a1, networks.policy(params["policy"], obs), rtol=1e-6)
    s = np.asarray(train(params, jax.random.PRNGKey(1), obs, {}, first)[0])
    assert np.all(np.abs(s) <= 2.0) and not np.allclose(s, a1)
    # Noise std 0.5 half-ranges = 1.0 here, until the clip at the bounds.
    assert 0.6 < np.std(s - a1) < 1.1


def test_policy_acts_uniformly_in_each_dimensions_bounds_until_learned():
    bounds = Bounds(low=(-1.0, 0.0), high=(1.0, 3.0))
    mu = jnp.asarray([0.9, 2.9])  # Near the high bounds: noise around it is far from uniform.
    policy = jax.jit(deterministic_policy(lambda p, obs: jnp.broadcast_to(mu, (len(obs), 2)),
                                          bounds, 0.1, evaluation=False))
    obs, first = jnp.zeros((20_000, 3)), jnp.zeros(20_000, bool)

    def act(learned: bool) -> np.ndarray:
        params = {"policy": {}, "learned": jnp.array(learned)}
        return np.asarray(policy(params, jax.random.PRNGKey(0), obs, {}, first)[0])

    before, after = act(False), act(True)
    for d, (low, high) in enumerate(zip(bounds.low, bounds.high, strict=True)):
        quarters = np.histogram(before[:, d], bins=4, range=(low, high))[0] / len(before)
        np.testing.assert_allclose(quarters, 0.25, atol=0.015)
        assert low <= before[:, d].min() and before[:, d].max() <= high
    # Learned: mu(s) plus noise of std 0.1 half-ranges (0.1 and 0.15), clipped at the bounds.
    np.testing.assert_allclose(np.median(after, axis=0), mu, atol=0.01)
    assert np.all(after <= np.asarray(bounds.high))


def test_td3_and_d4pg_act_at_random_until_the_learner_steps():
    for builder in (TD3Builder(TD3Config(min_replay_size=64, updates_per_step=2,
                                         sample_batch_size=32)),
                    D4PGBuilder(D4PGConfig(min_replay_size=64, updates_per_step=2,
                                           sample_batch_size=32))):
        spec = GymnasiumFactory("Pendulum-v1").spec()
        networks = builder.make_networks(spec)
        learner = builder.make_learner(networks, spec, jax.random.PRNGKey(0))
        assert not learner.params["learned"]
        learner.step(pendulum_unrolls(np.random.default_rng(1)))
        assert learner.params["learned"], type(builder).__name__


@pytest.mark.slow  # The default suite's quick off-policy run is SAC's (tests/test_sac.py).
def test_td3_learns_pendulum_quickly(tmp_path):
    # TD3 starts slower than SAC: -1,322 at 24k env steps, -227 at 60k (one busy run).
    out = run(["--agent=td3", "--platform=local_mp", "--env=Pendulum-v1",
               "--total_env_steps=60000", "--stop_at_return=none", "--eval_every=0",
               f"--logdir={tmp_path}"], timeout=120)
    assert out.returncode == 0, out.stderr
    s = summary(tmp_path)
    assert s["learner_steps"] > 0 and s["episodes"] >= 100
    assert s["mean_return"] > LEARNED_PENDULUM_RETURN, s


@pytest.mark.slow
@pytest.mark.parametrize("agent", ["td3", "ddpg"])
def test_reaches_minus_200_on_pendulum(agent, tmp_path):
    out = run([f"--agent={agent}", "--platform=local_mp", "--env=Pendulum-v1",
               "--stop_at_return=-200", "--total_env_steps=500000", f"--logdir={tmp_path}"],
              timeout=600)
    assert out.returncode == 0, out.stderr
    s = summary(tmp_path)
    assert s["stopped_by"] == "return_target" and s["mean_return"] >= -200, s


def test_td3_steps_a_gymnasium_mujoco_env(tmp_path):
    """Gymnasium's MuJoCo ids (the `mujoco` extra) run on the host platforms."""
    pytest.importorskip("mujoco", reason="the mujoco extra is not installed")
    spec = GymnasiumFactory("InvertedPendulum-v5").spec()
    assert spec.observation_shape == (4,) and spec.action_low == (-3.0,)
    out = run(["--agent=td3", "--platform=local_mt", "--env=InvertedPendulum-v5",
               "--total_env_steps=1024", "--stop_at_return=none", "--eval_every=0",
               f"--logdir={tmp_path}"], timeout=120)
    assert out.returncode == 0, out.stderr
    assert summary(tmp_path)["env_steps"] >= 1024
