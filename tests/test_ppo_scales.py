"""PPO's scales for physics tasks: observation normalisation (running moments equal to the
float64 moments of every observation learned from, untouched by the optimizer, applied by the
policy) and reward scaling (advantages and returns scale with it)."""

import jax
import jax.numpy as jnp
import numpy as np

from tests.test_ppo_learner import CARTPOLE, random_batch
from trellis.agents.common import OBS_NORM, DataParallelLearner
from trellis.agents.ppo import PPOBuilder, PPOConfig
from trellis.agents.ppo.learner import make_training, make_transitions


def test_moments_are_the_observations_moments_and_the_policy_uses_them():
    config = PPOConfig(unroll_length=7, batch_size=8, num_minibatches=4, num_epochs=2,
                       normalize_observations=True)
    networks = PPOBuilder(config).make_networks(CARTPOLE)
    learner = DataParallelLearner(make_training(networks, config), jax.random.PRNGKey(0),
                                  config.batch_size)
    batches = [random_batch(seed) for seed in range(3)]
    for batch in batches:
        batch["obs"] = batch["obs"] * 3.0 + 5.0  # Far from mean 0, variance 1.
        learner.step(batch)
    # Step 0 of an unroll repeats the last step of the one before: counted once.
    seen = np.concatenate([b["obs"][1:].reshape(-1, 4) for b in batches]).astype(np.float64)
    moments = jax.device_get(learner.params[OBS_NORM])["normalizer"]
    assert float(moments["count"]) == len(seen)
    np.testing.assert_allclose(moments["mean"], seen.mean(axis=0), rtol=1e-5)
    np.testing.assert_allclose(moments["var"], seen.var(axis=0), rtol=1e-4)
    # The policy sees (obs - mean) / std: shifting and scaling obs by the moments cancels.
    obs = jnp.asarray(seen[:5], jnp.float32)
    (logits, value) = networks.apply(learner.params, obs)
    zero_moments = {**learner.params, OBS_NORM: {"normalizer": {
        "count": moments["count"], "mean": jnp.zeros(4), "var": jnp.ones(4)}}}
    standard = (obs - moments["mean"]) / np.sqrt(moments["var"] + 1e-8)
    (want_logits, want_value) = networks.apply(zero_moments, standard)
    np.testing.assert_allclose(logits, want_logits, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(value, want_value, rtol=1e-5, atol=1e-6)


def test_reward_scale_scales_advantages_and_returns():
    networks = PPOBuilder(PPOConfig()).make_networks(CARTPOLE)
    batch = random_batch(0)
    batch["value"] = np.zeros_like(batch["value"])  # Values in any unit: zero is in all.
    one = make_transitions(networks, PPOConfig(), batch)
    ten = make_transitions(networks, PPOConfig(reward_scale=10.0), batch)
    np.testing.assert_allclose(ten["advantage"], 10.0 * one["advantage"], rtol=1e-5)
    np.testing.assert_allclose(ten["return"], 10.0 * one["return"], rtol=1e-5)
    assert np.abs(one["advantage"]).max() > 0
