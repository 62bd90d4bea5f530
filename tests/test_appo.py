"""APPO and A2C, PPO's presets: V-trace on data from the learner's own policy is GAE with
lambda 1 (so the correction changes nothing on-policy), importance weights above the clip
change nothing, weights below it shrink the advantages, and both presets solve CartPole-v1
through launch/run.py (slow)."""

import dataclasses

import jax
import numpy as np
import pytest

from tests.test_ppo_learner import CARTPOLE, random_batch
from tests.test_run import run, summary
from trellis.agents.ppo import PPOBuilder, PPOConfig
from trellis.agents.ppo.config import A2CConfig, APPOConfig
from trellis.agents.ppo.learner import make_transitions


def on_policy_batch(networks, params, seed=0):
    """A random batch whose recorded log-probs and values are `params`' own."""
    batch = random_batch(seed)
    dist_params, values = networks.apply(params, batch["obs"])
    batch["log_prob"] = np.asarray(networks.distribution.log_prob(dist_params,
                                                                  batch["action"]))
    batch["value"] = np.asarray(values)
    return batch


def test_vtrace_on_policy_equals_gae_with_lambda_one():
    config = APPOConfig(discount=0.9)
    networks = PPOBuilder(config).make_networks(CARTPOLE)
    params = networks.init(jax.random.PRNGKey(0))
    batch = on_policy_batch(networks, params)
    vtrace = make_transitions(networks, config, batch, params)
    gae = make_transitions(networks, dataclasses.replace(config, advantages="gae"), batch)
    for field in ("advantage", "return", "behaviour_value"):
        np.testing.assert_allclose(vtrace[field], gae[field], rtol=1e-4, atol=1e-5)
    assert np.abs(gae["advantage"]).max() > 0.1


def test_importance_weights_above_the_clip_change_nothing_below_it_shrink_advantages():
    config = APPOConfig(discount=0.9)
    networks = PPOBuilder(config).make_networks(CARTPOLE)
    params = networks.init(jax.random.PRNGKey(0))
    batch = on_policy_batch(networks, params)
    on_policy = make_transitions(networks, config, batch, params)
    # rho = 2 everywhere: clipped to 1, as on-policy.
    likelier = dict(batch, log_prob=batch["log_prob"] - np.log(2.0))
    np.testing.assert_allclose(make_transitions(networks, config, likelier, params)["advantage"],
                               on_policy["advantage"], rtol=1e-4, atol=1e-5)
    # rho = 1/2 everywhere: each advantage is rho (r + gamma v_{s+1} - V), with v_{s+1} the
    # V-trace target of the next step, not V: at the last step of each unroll v_{s+1} = V, so
    # the advantage there is exactly half the on-policy one.
    rarer = make_transitions(networks, config, dict(batch, log_prob=batch["log_prob"]
                                                    + np.log(2.0)), params)
    last = np.arange(rarer["advantage"].shape[0]) >= (7 - 1) * 8  # [T * B], t-major.
    np.testing.assert_allclose(rarer["advantage"][last], 0.5 * on_policy["advantage"][last],
                               rtol=1e-4, atol=1e-6)
    assert not np.allclose(rarer["advantage"], on_policy["advantage"])


def test_presets():
    assert (APPOConfig().advantages, APPOConfig().gae_lambda) == ("vtrace", 1.0)
    a2c = A2CConfig()
    assert (a2c.num_epochs, a2c.num_minibatches) == (1, 1) and PPOConfig().advantages == "gae"


@pytest.mark.slow
@pytest.mark.parametrize("agent", ["appo", "a2c"])
def test_solves_cartpole(agent, tmp_path):
    out = run([f"--agent={agent}", "--platform=local_mp", "--env=CartPole-v1",
               "--total_env_steps=1000000", f"--logdir={tmp_path}"], timeout=300)
    assert out.returncode == 0, out.stderr
    assert summary(tmp_path)["stopped_by"] == "return_target"
