"""`--learning_rate_schedule=linear`: the optimizer's step scaled by a factor that falls from 1 to 0
over the env-step budget, set by each platform's loop (the learner node, anakin's program,
self-play's)."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from trellis.agents.common import learning_rate_factor, make_optimizer, set_learning_rate_factor
from trellis.agents.impala import Config as ImpalaConfig
from trellis.agents.ppo import Builder, Config
from trellis.builders.contract.config import ExperimentConfig
from trellis.builders.experiments.anakin_run import PopulationSettings, make_population
from trellis.builders.experiments.checkpointing import Checkpointer, CheckpointError
from trellis.builders.experiments.session import run_experiment
from trellis.envs import make_env_factory

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN = [sys.executable, os.path.join(REPO, "launch", "run.py")]


def test_the_factor_falls_linearly_to_zero_over_the_budget():
    assert [float(learning_rate_factor(s, 1000)) for s in (0, 250, 999, 1000, 5000)] == [
        1.0, 0.75, pytest.approx(0.001, rel=1e-4), 0.0, 0.0]
    assert float(jax.jit(learning_rate_factor, static_argnums=1)(jnp.float32(600), 1000)) == (
        pytest.approx(0.4))
    # Counts past int32 (benchmarks/soak.py's budget is 10^12).
    assert float(learning_rate_factor(3 * 10**11, 10**12)) == pytest.approx(0.7)
    assert float(learning_rate_factor(5, 10**12)) == 1.0


def test_a_host_number_gets_numpys_factor_equal_to_jaxs():
    # On the host no jax op runs: each would compile for the device before the first update.
    steps = np.array([0, 1, 250, 599, 999, 1000, 5000, 3 * 10**11], np.int64)
    host = [learning_rate_factor(int(s), 10**12 if s > 10**6 else 1000) for s in steps]
    assert all(type(f) is np.float32 for f in host)
    # Eager jax, as the host computed it before (jit may multiply by the budget's reciprocal
    # instead, an ulp apart).
    eager = [learning_rate_factor(jnp.float32(s), 10**12 if s > 10**6 else 1000)
             for s in steps]
    assert all(isinstance(f, jax.Array) for f in eager)
    np.testing.assert_array_equal(np.array(host), np.array(eager))
    # Set as numpy too, broadcast to a population's [M] factors; a traced factor stays jax.
    population = jax.vmap(make_optimizer(ImpalaConfig()).init)({"w": jnp.zeros((3, 2))})
    factors = set_learning_rate_factor(population, 0.25)[2].factor
    assert type(factors) is np.ndarray and factors.dtype == np.float32
    np.testing.assert_array_equal(factors, [0.25] * 3)
    traced = jax.jit(set_learning_rate_factor)(population, jnp.float32(0.25))[2].factor
    np.testing.assert_array_equal(traced, factors)


def test_feed_forward_impala_decays_by_default_and_the_others_do_not():
    assert ImpalaConfig().learning_rate_schedule == "linear"
    assert ImpalaConfig(core="lstm").learning_rate_schedule == "constant"
    assert ImpalaConfig(core="lstm", learning_rate_schedule="linear").learning_rate_schedule == (
        "linear")
    assert Config().learning_rate_schedule == "constant"  # PPO's.


def test_the_factor_scales_adams_step_as_a_smaller_learning_rate():
    """Adam's step is linear in its rate: with factor f, three steps of the optimizer equal
    those of Adam at f x the rate (clipping off: its bound is far above these gradients)."""
    config = Config(learning_rate=0.01, max_grad_norm=1e6)
    params = {"w": jnp.zeros(3), "b": jnp.zeros(())}
    grads = [jax.tree.map(lambda p, i=i: jnp.full_like(p, 0.5 - i) + jnp.arange(p.size).reshape(
        p.shape), params) for i in range(3)]
    optimizer, reference = make_optimizer(config), optax.adam(0.01 * 0.3, eps=config.adam_eps)
    state = set_learning_rate_factor(optimizer.init(params), 0.3)
    ref_state = reference.init(params)
    for g in grads:
        updates, state = optimizer.update(g, state, params)
        expected, ref_state = reference.update(g, ref_state, params)
        for got, want in zip(jax.tree.leaves(updates), jax.tree.leaves(expected), strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-6)


PPO_CONFIG = {"batch_size": 8, "unroll_length": 8, "num_minibatches": 2, "hidden_sizes": (16,)}


def _population(schedule):
    config = Config(**PPO_CONFIG, learning_rate_schedule=schedule)
    return make_population(Builder(config), make_env_factory("gymnax:CartPole-v1"), 0, 10,
                           PopulationSettings(num_seeds=2, updates_per_call=2),
                           total_env_steps=1000)


def test_anakin_sets_each_members_factor_before_each_update():
    """2 updates of 8 x 8 env steps: the second learns at 1 - 128/1000 of the rate, the
    metrics show the mean of both (0.936 and 0.872); with no decay the factor stays 1."""
    decayed, constant = _population("linear"), _population("constant")
    metrics, _ = decayed.step()
    np.testing.assert_allclose(metrics["learning_rate_factor"], [0.904, 0.904], rtol=1e-6)
    # The members' float scalars in the optimizer state: Adam's rate and the factor.
    factors = [leaf for leaf in jax.tree.leaves(decayed.state.train.opt_state)
               if leaf.shape == (2,) and leaf.dtype == jnp.float32
               and not np.allclose(leaf, Config(**PPO_CONFIG).learning_rate)]
    np.testing.assert_allclose(factors, [[0.872, 0.872]], rtol=1e-6)
    metrics, _ = constant.step()
    assert "learning_rate_factor" not in metrics
    # The same seeds: the first update (factor 0.936) already moves the params differently.
    assert not all(np.allclose(a, b) for a, b in zip(
        jax.tree.leaves(decayed.state.train.params), jax.tree.leaves(constant.state.train.params),
        strict=True))


def test_a_checkpoint_from_before_the_schedule_is_read_with_the_targets_factor(tmp_path):
    """A state saved by the optimizer as it was (clipping, then Adam, no factor) is read into
    today's structure: its values, and the factor the target holds."""
    config = Config(max_grad_norm=100.0)  # No clipping of these gradients.
    adam = optax.inject_hyperparams(optax.adam, static_args=("b1", "b2", "eps", "eps_root"))
    before = optax.chain(optax.clip_by_global_norm(config.max_grad_norm),
                         adam(learning_rate=config.learning_rate, eps=config.adam_eps))
    params = {"w": jnp.arange(3.0)}
    grads = {"w": jnp.array([0.5, -1.0, 2.0])}
    _, old_state = before.update(grads, before.init(params), params)
    checkpointer = Checkpointer(str(tmp_path))
    checkpointer.save(100, {"params": params, "opt_state": old_state},
                      {"env_steps": 100, "learner_steps": 1})
    checkpointer.close()
    target = {"params": jax.tree.map(jnp.zeros_like, params),
              "opt_state": set_learning_rate_factor(make_optimizer(config).init(params), 0.25)}
    state, progress = Checkpointer(str(tmp_path)).restore(target)
    assert progress["learner_steps"] == 1
    np.testing.assert_array_equal(state["params"]["w"], [0.0, 1.0, 2.0])
    adam_state = state["opt_state"][1]
    assert int(adam_state.inner_state[0].count) == 1
    np.testing.assert_allclose(adam_state.inner_state[0].mu["w"], 0.1 * grads["w"], rtol=1e-6)
    assert float(state["opt_state"][2].factor) == 0.25
    # Not any structure, though.
    with pytest.raises(CheckpointError, match=r"does not fit .*: this run's state has params/v "):
        Checkpointer(str(tmp_path)).restore({**target, "params": {"v": jnp.zeros(3)}})


def _records(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _factors(run_dir):
    return [(r["env_steps"], r["learner/learning_rate_factor"]) for r in _records(run_dir)
            if "learner/learning_rate_factor" in r]


@pytest.mark.parametrize("flags", [
    ["--agent=impala", "--platform=local_mt", "--total_env_steps=30000"],
    ["--agent=ppo", "--platform=anakin", "--env=gymnax:CartPole-v1", "--total_env_steps=100000"],
    pytest.param(["--agent=alphazero", "--platform=anakin", "--env=pgx:tic_tac_toe",
                  "--unroll_length=9", "--batch_size=16", "--num_simulations=2",
                  "--min_replay_size=100", "--total_env_steps=2000"],
                 marks=pytest.mark.slow),  # About 60 s on 2 cores, mostly compiling.
], ids=["learner_node", "anakin", "self_play"])
def test_a_runs_records_show_the_factor_falling_with_its_env_steps(flags, tmp_path):
    """Each record's factor was set at or before the record's env steps (so it is at least
    1 - env_steps / budget), it never rises, and by the end it has fallen with the run."""
    out = subprocess.run(RUN + flags + ["--learning_rate_schedule=linear", "--stop_at_return=none",
                                        "--log_every_s=0.2", f"--logdir={tmp_path}", "--quiet"],
                         capture_output=True, text=True, timeout=600, cwd=REPO)
    assert out.returncode == 0, out.stderr
    budget = int(flags[-1].split("=")[1])
    factors = _factors(tmp_path)
    assert len(factors) >= 3, factors
    for steps, factor in factors:
        assert 1 - steps / budget - 1e-6 <= factor <= 1, (steps, factor)
    assert all(a[1] >= b[1] for a, b in zip(factors, factors[1:], strict=False)), factors
    assert factors[-1][1] < 0.5, factors
    # The learning rate logged is the one in effect: the configured one times the factor.
    configured = json.loads((tmp_path / "config.json").read_text())["agent_config"][
        "learning_rate"]
    scheduled = [r for r in _records(tmp_path) if "learner/learning_rate_factor" in r]
    assert [r["learning_rate"] for r in scheduled] == pytest.approx(
        [configured * r["learner/learning_rate_factor"] for r in scheduled])


def test_a_populations_records_show_each_members_learning_rate_in_effect(tmp_path):
    """Members with learning rates of their own, under the linear schedule: each record gives
    each member's rate times the factor."""
    config = Config(**PPO_CONFIG, learning_rate_schedule="linear")
    experiment = ExperimentConfig(total_env_steps=4096, stop_at_return=None, log_every_s=0.01)
    run_experiment(Builder(config), make_env_factory("gymnax:CartPole-v1"), experiment,
                   str(tmp_path / "linear"), quiet=True,
                   platform=PopulationSettings(num_seeds=2, updates_per_call=8,
                                               hparams={"learning_rate": [1e-3, 4e-3]}))
    records = _records(tmp_path / "linear")
    assert len(records) >= 3 and all("learning_rate" not in r for r in records)
    for r in records:
        factor = r["learner/learning_rate_factor"]
        assert r["member/0/learning_rate"] == pytest.approx(1e-3 * factor)
        assert r["member/1/learning_rate"] == pytest.approx(4e-3 * factor)
    assert records[-1]["learner/learning_rate_factor"] < 0.5
