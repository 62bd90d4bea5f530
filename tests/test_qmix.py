"""QMIX and VDN: the team's Q(lambda) targets against a float64 numpy recursion, VDN's sum and
the team's step by hand, QMIX's mixer monotonic (jax.grad) so that each agent's argmax is the
team's, the command line's checks, learning MPE simple_spread on anakin above the random
floor, a resumed run equal to an uninterrupted one, and a run on the host through PettingZoo."""

from __future__ import annotations

import itertools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("jaxmarl", reason="jaxmarl is an optional extra (pip install -e '.[marl]')")

from trellis.agents.common.q_learning import q_lambda_targets  # noqa: E402
from trellis.agents.qmix import QMIXConfig, VDNConfig  # noqa: E402
from trellis.agents.qmix.learner import make_transitions, team_q  # noqa: E402
from trellis.agents.qmix.losses import team_q_loss, team_step  # noqa: E402
from trellis.agents.qmix.networks import QMixer, make_networks, vdn_mix  # noqa: E402
from trellis.builders.experiments.anakin_run import restore_member  # noqa: E402
from trellis.envs.multi_agent import MultiAgentSpec, MultiAgentStep  # noqa: E402
from trellis.envs.specs import EnvSpec  # noqa: E402
from trellis.launch import run  # noqa: E402
from trellis.launch.flags import parse  # noqa: E402

SPREAD = "jaxmarl:MPE_simple_spread_v3"
AGENTS = ("agent_0", "agent_1", "agent_2")
OBS = EnvSpec((4,), "float32", 5, (), "int32")
# A uniformly random policy's team return on JaxMARL's simple_spread (N=3): -82.2 over 1,000
# episodes (docs/benchmarks.md, "Multi-agent: IPPO and MAPPO"); a 100-episode mean has a
# standard error of about 2.4.
RANDOM_SPREAD_RETURN = -82.2


def reference_targets(reward, first, terminated, truncated, q_max, gamma, lam):
    """Q(lambda) targets by the case analysis of next-step autoreset, in float64: a
    terminated step's target is its reward; a truncated step, the unroll's last, and a step
    whose successor transition is fake (into a first observation) bootstrap one step; the
    others mix the one-step bootstrap and the next target by lambda."""
    reward, q_max = np.asarray(reward, np.float64), np.asarray(q_max, np.float64)
    steps = len(reward)
    targets = np.zeros(steps)
    for s in reversed(range(steps)):
        if terminated[s]:
            targets[s] = reward[s]
        elif truncated[s] or s == steps - 1 or first[s + 1]:
            targets[s] = reward[s] + gamma * q_max[s]
        else:
            targets[s] = reward[s] + gamma * ((1 - lam) * q_max[s] + lam * targets[s + 1])
    return targets, 1.0 - np.asarray(first, np.float64)


@pytest.mark.parametrize("jit", [False, True])
def test_team_targets_match_a_float64_recursion(jit):
    """Random unrolls with every kind of end (terminated, truncated, a fake transition into
    the next episode's first step): equal to float64 on the real transitions."""
    rng = np.random.default_rng(0)
    fn = jax.jit(q_lambda_targets, static_argnums=(5, 6)) if jit else q_lambda_targets
    for _ in range(20):
        t = 12
        first = rng.random(t) < 0.15
        terminated = ~first & (rng.random(t) < 0.1)
        truncated = ~first & ~terminated & (rng.random(t) < 0.1)
        reward = np.where(first, 0.0, rng.normal(size=t)).astype(np.float32)
        q_max = rng.normal(size=t).astype(np.float32)
        gamma, lam = float(rng.uniform(0.5, 1.0)), float(rng.uniform(0.0, 1.0))
        targets, mask = fn(jnp.asarray(reward), jnp.asarray(first), jnp.asarray(terminated),
                           jnp.asarray(truncated), jnp.asarray(q_max), gamma, lam)
        want, want_mask = reference_targets(reward, first, terminated, truncated, q_max,
                                            gamma, lam)
        np.testing.assert_array_equal(mask, want_mask)
        np.testing.assert_allclose(np.asarray(targets) * want_mask, want * want_mask,
                                   rtol=1e-5, atol=1e-5)


def test_three_step_target_by_hand():
    """r = (1, 2, 3), no end, max Q of the states reached (10, 20, 30), gamma 0.5, lambda
    0.5: G_2 = 3 + 0.5 * 30 = 18; G_1 = 2 + 0.5 (0.5 * 20 + 0.5 * 18) = 11.5;
    G_0 = 1 + 0.5 (0.5 * 10 + 0.5 * 11.5) = 6.375."""
    zeros = jnp.zeros(3, bool)
    targets, mask = q_lambda_targets(jnp.array([1.0, 2.0, 3.0]), zeros, zeros, zeros,
                                     jnp.array([10.0, 20.0, 30.0]), 0.5, 0.5)
    np.testing.assert_allclose(targets, [6.375, 11.5, 18.0])
    np.testing.assert_array_equal(mask, [1, 1, 1])


def _step(n: int, rng: np.random.Generator, alive=None) -> MultiAgentStep:
    obs = {a: jnp.asarray(rng.normal(size=(n, 4)), jnp.float32) for a in AGENTS}
    false = {a: jnp.zeros(n, bool) for a in AGENTS}
    return MultiAgentStep(
        obs=obs, reward={a: jnp.asarray(rng.normal(size=n), jnp.float32) for a in AGENTS},
        terminated=false, truncated=false,
        alive=alive or {a: jnp.ones(n, bool) for a in AGENTS}, first=jnp.zeros(n, bool),
        global_state=jnp.concatenate([obs[a] for a in AGENTS], axis=-1))


def _networks(config: QMIXConfig):
    spec = MultiAgentSpec(AGENTS, {a: OBS for a in AGENTS}, (12,))
    networks = make_networks(spec, config)
    return networks, networks.init(jax.random.key(1))


def test_vdns_team_q_is_the_sum_of_the_acting_agents_qs():
    """VDN's Q_tot of the actions taken is the sum over the agents that act of their own
    Q(o, a), by hand from each policy's network (one per agent here)."""
    networks, params = _networks(VDNConfig(policy_mapping="per_agent", hidden_sizes=(8,)))
    rng = np.random.default_rng(2)
    alive = {"agent_0": jnp.array([True, True]), "agent_1": jnp.array([True, False]),
             "agent_2": jnp.array([False, True])}
    step = _step(2, rng, alive)
    actions = {a: jnp.array([1, 4]) for a in AGENTS}
    got = team_q(networks, params, step, lambda a, q: q[jnp.arange(2), actions[a]], alive)
    for env in range(2):
        want = sum(float(networks.q[a].apply(params["agents"][a], step.obs[a][env])[1 if env
                                                                                   == 0 else 4])
                   for a in AGENTS if bool(alive[a][env]))
        np.testing.assert_allclose(got[env], want, rtol=1e-5)
    np.testing.assert_allclose(vdn_mix({}, jnp.array([[1.0, 2.0, 4.0]]), None), [7.0])


def test_qmix_mixer_is_monotonic_in_every_agents_q():
    """dQ_tot/dq_a >= 0 for every agent, at random states, Q-values and mixer params (the
    hypernetworks' weights are non-negative), and not all zero."""
    mixer = QMixer(3, 8, 16)
    rng = np.random.default_rng(3)
    grads = []
    for seed in range(10):
        q = jnp.asarray(rng.normal(scale=5.0, size=(64, 3)), jnp.float32)
        state = jnp.asarray(rng.normal(size=(64, 12)), jnp.float32)
        params = mixer.init(jax.random.key(seed), q, state)
        grad = jax.vmap(jax.grad(lambda q1, s1, p=params: mixer.apply(p, q1, s1)))(q, state)
        grads.append(np.asarray(grad))
    grads = np.concatenate(grads)
    assert grads.min() >= 0.0, grads.min()
    assert (grads > 0).mean() > 0.9


def test_each_agents_argmax_is_the_teams_under_qmix():
    """Over every joint action of 3 agents with 5 actions each, the maximum of Q_tot is the
    mix of the agents' own maxima (what the targets bootstrap from)."""
    networks, params = _networks(QMIXConfig(hidden_sizes=(8,), mixing_embed_size=8,
                                            hypernet_hidden_size=16))
    step = _step(1, np.random.default_rng(4))
    best = team_q(networks, params, step, lambda a, q: jnp.max(q, axis=-1), step.alive)
    joint = [team_q(networks, params, step, lambda a, q, j=j: q[:, j[AGENTS.index(a)]],
                    step.alive)
             for j in itertools.product(range(5), repeat=3)]
    np.testing.assert_allclose(max(float(x[0]) for x in joint), best[0], rtol=1e-5)


def test_the_teams_step_sums_rewards_and_ends_when_no_agent_acts():
    """Env 0: agent_2 finished earlier, the others end by a time limit now: truncated.
    Env 1: every agent still acts. Env 2: a first step (no end)."""
    t, f = True, False
    step = MultiAgentStep(
        obs={}, reward={"a": jnp.array([1.0, 2.0, 0.0]), "b": jnp.array([0.5, -1.0, 0.0])},
        terminated={"a": jnp.array([f, f, f]), "b": jnp.array([f, f, f])},
        truncated={"a": jnp.array([t, f, f]), "b": jnp.array([t, f, f])},
        alive={"a": jnp.array([f, t, t]), "b": jnp.array([f, t, t])},
        first=jnp.array([f, f, t]))
    reward, terminated, truncated = team_step(step, ("a", "b"))
    np.testing.assert_allclose(reward, [1.5, 1.0, 0.0])
    np.testing.assert_array_equal(terminated, [f, f, f])
    np.testing.assert_array_equal(truncated, [t, f, f])
    ended = step._replace(truncated={"a": jnp.array([f] * 3), "b": jnp.array([f] * 3)})
    np.testing.assert_array_equal(team_step(ended, ("a", "b"))[1], [t, f, f])


def test_team_loss_by_hand():
    """Half the mean squared error over the real transitions: errors (1, -2, 9 masked)."""
    loss = team_q_loss(jnp.array([1.0, 0.0, 9.0]), jnp.array([0.0, 2.0, 0.0]),
                       jnp.array([1.0, 1.0, 0.0]))
    np.testing.assert_allclose(loss, 0.5 * (1.0 + 4.0) / 2)


@pytest.mark.parametrize("end", ["none", "truncated", "terminated"])
def test_transitions_bootstrap_from_the_mixed_maxima_of_the_next_step(end):
    """A two-step unroll of one env: the target of its one transition is the team's reward
    plus gamma times Q_tot of the agents' max Qs at the next step (lambda's trace ends with
    the unroll). Where the episode ends there by a time limit (no agent acts any more), the
    agents still count in the bootstrap; where it terminates, the target is the reward."""
    config = QMIXConfig(hidden_sizes=(8,), mixing_embed_size=8, hypernet_hidden_size=16,
                        discount=0.7)
    networks, params = _networks(config)
    rng = np.random.default_rng(5)
    ended = {a: jnp.array([end != "none"]) for a in AGENTS}
    last = _step(1, rng)._replace(
        alive={a: ~ended[a] for a in AGENTS},
        truncated=ended if end == "truncated" else last_false(),
        terminated=ended if end == "terminated" else last_false())
    steps = [_step(1, rng), last]
    batch = {"obs": jax.tree.map(lambda *x: jnp.stack(x), *steps),
             "action": {a: jnp.zeros((2, 1), jnp.int32) for a in AGENTS}}
    out = make_transitions(networks, config, params, batch)
    reward = sum(float(last.reward[a][0]) for a in AGENTS)
    every = {a: jnp.array([True]) for a in AGENTS}
    q_next = team_q(networks, params, last, lambda a, q: jnp.max(q, axis=-1), every)
    want = reward if end == "terminated" else reward + 0.7 * float(q_next[0])
    np.testing.assert_allclose(out["target"], [want], rtol=1e-5)
    np.testing.assert_array_equal(out["mask"], [1.0])


def last_false():
    return {a: jnp.array([False]) for a in AGENTS}


@pytest.mark.parametrize("argv, message", [
    (["--env=gymnax:CartPole-v1"], "QMIXBuilder is a multi-agent agent and gymnax:CartPole-v1"),
    (["--mixer=sum"], "--mixer must be one of"),
    (["--num_minibatches=7"], "--num_minibatches must be a divisor of"),
])
def test_bad_runs_are_one_line_and_exit_2(argv, message, capsys, tmp_path):
    assert run.main(["--agent=qmix", "--platform=anakin", f"--env={SPREAD}",
                     f"--logdir={tmp_path}", "--no_compile_cache", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err


def test_help_lists_the_mixers_settings(capsys):
    with pytest.raises(SystemExit):
        run.main(["--agent=vdn", "--help"])
    out = capsys.readouterr().out
    assert "--mixer" in out and "--q_lambda" in out and "--policy_mapping" in out


def test_qmix_needs_a_global_state_and_discrete_actions():
    no_state = MultiAgentSpec(AGENTS, {a: OBS for a in AGENTS})
    with pytest.raises(ValueError, match="needs the env's global state"):
        make_networks(no_state, QMIXConfig())
    make_networks(no_state, VDNConfig())  # VDN mixes without one.
    box = EnvSpec((4,), "float32", None, (2,), "float32", (-1.0,) * 2, (1.0,) * 2)
    with pytest.raises(ValueError, match="needs discrete actions"):
        make_networks(MultiAgentSpec(AGENTS, {a: box for a in AGENTS}, (12,)), VDNConfig())


# Small and fast for the default suite: JaxMARL's PQN-VDN settings but 64 envs, a smaller
# network, twice the learning rate and epsilon's decay over the run's first third.
SHORT = ("--platform=anakin", f"--env={SPREAD}", "--quiet", "--batch_size=64",
         "--num_minibatches=4", "--hidden_sizes=64,64", "--learning_rate=1e-3",
         "--epsilon_decay_env_steps=40000")


@pytest.mark.parametrize("agent", ["vdn", pytest.param("qmix", marks=pytest.mark.slow)])
def test_learns_simple_spread_above_random(agent, tmp_path):
    """A short run on MPE simple_spread (131,072 env steps: the budget rounds up to whole
    compiled calls): the mean team return over the last 100 episodes ends well above a random
    policy's (VDN: -64.0 on 2026-11-29 before 36af7a9's bootstrap fix; the bar, the floor
    plus 12, is 5 standard errors of a 100-episode mean)."""
    assert run.main([f"--agent={agent}", *SHORT, "--total_env_steps=100000",
                     f"--logdir={tmp_path}"]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["mean_return"] > RANDOM_SPREAD_RETURN + 12, summary["mean_return"]
    last = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    assert {f"learner/agent/{a}/reward_mean" for a in AGENTS} <= set(last)


# Slow: 43 s of the default suite (MuZero's resume test is slow likewise).
@pytest.mark.slow
def test_a_resumed_run_equals_an_uninterrupted_one(tmp_path):
    """One Q-network per agent and QMIX's mixer: a run stopped at its budget and resumed ends
    with the same params as a run that went straight through."""
    flags = ("--agent=qmix", *SHORT, "--policy_mapping=per_agent", "--seed=3",
             "--unroll_length=8", "--hidden_sizes=16", "--updates_per_call=2")  # 1,024 a call.
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert run.main([*flags, "--total_env_steps=2048", f"--logdir={straight}"]) == 0
    assert run.main([*flags, "--total_env_steps=1024", f"--logdir={resumed}"]) == 0
    assert run.main([f"--resume={resumed}", "--total_env_steps=2048"]) == 0

    def params(run_dir):
        settings = parse([f"--resume={run_dir}"])
        builder, factory = settings.build()
        return restore_member(builder, factory, settings.experiment, 1, str(run_dir), None, 0)

    (_, a, step_a, _), (_, b, step_b, _) = params(straight), params(resumed)
    assert step_a == step_b == 2048
    jax.tree.map(np.testing.assert_array_equal, a, b)


def test_runs_on_the_host_through_pettingzoo(tmp_path):
    """VDN on mpe2's simple_spread on local_mt: env workers step PettingZoo's env, inference
    acts for each agent with its policy, the learner updates, and the run stops at its
    budget."""
    pytest.importorskip("mpe2")
    assert run.main(["--agent=vdn", "--platform=local_mt",
                     "--env=pettingzoo:mpe2/simple_spread_v3", "--quiet", "--batch_size=4",
                     "--num_minibatches=4", "--hidden_sizes=16", "--total_env_steps=3000",
                     f"--logdir={tmp_path}"]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["env_steps"] >= 3000 and summary["learner_steps"] >= 1, summary
