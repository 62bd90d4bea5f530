"""Multi-agent envs on the host platforms: central inference serves each agent's observation
with its policy, what it records reaches the learner as the anakin program gives it, bad
mappings are one line on the command line, and a local_mp run on mpe2's simple_spread stops
cleanly (and learns: slow)."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from mpe2 import simple_spread_v3

from tests import processes
from tests.test_inference import run_workers
from trellis.agents.impala.multi_agent import IImpalaBuilder, IImpalaConfig
from trellis.agents.ppo.multi_agent import IPPOBuilder, IPPOConfig
from trellis.builders.experiments.evaluation import run_episodes
from trellis.builders.experiments.inference import InferenceServer, InferenceSettings, ServedPolicy
from trellis.builders.experiments.step_format import step_format
from trellis.envs.multi_agent import MultiAgentSpec, MultiAgentStep
from trellis.envs.pettingzoo_envs import PettingZooFactory
from trellis.envs.specs import EnvSpec

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN = [sys.executable, os.path.join(REPO, "launch", "run.py")]
SPREAD = "--env=pettingzoo:mpe2/simple_spread_v3"
# A uniform random policy's team return (the sum over the 3 agents) on mpe2's simple_spread_v3
# (N=3, 25 steps): -80.9 +- 24.0 (std) over 300 episodes, seeds 0-299.
RANDOM_SPREAD_RETURN = -80.9
AGENTS = ("agent_0", "agent_1", "agent_2")
OBS = EnvSpec((4,), "float32", 5, (), "int32")


# Each multi-agent agent on the host: its builder, and its policy's logits by hand.
BUILDERS = {
    "ippo": (lambda mapping: IPPOBuilder(IPPOConfig(policy_mapping=mapping)),
             lambda net, params, x: net.apply(params, x)[0]),
    "iimpala": (lambda mapping: IImpalaBuilder(IImpalaConfig(policy_mapping=mapping)),
                lambda net, params, x: net.apply(params, x[None], jnp.zeros((1, len(x)), bool),
                                                 {})[0][0]),
}
EXTRAS = {"ippo": {"log_prob", "value"}, "iimpala": {"logits"}}


def _builder_and_params(agent: str, mapping: str):
    spec = MultiAgentSpec(AGENTS, {a: OBS for a in AGENTS}, (12,))
    builder = BUILDERS[agent][0](mapping)
    networks = builder.make_networks(spec)
    params = builder.make_training(networks, spec).init(jax.random.PRNGKey(3)).params
    return spec, builder, networks, params


def _worker_inputs(rng: np.random.Generator, k: int) -> dict[str, np.ndarray]:
    inputs = {f"obs/{a}": rng.normal(size=(k, 4)).astype(np.float32) for a in AGENTS}
    for a in AGENTS:
        inputs[f"reward/{a}"] = rng.normal(size=k).astype(np.float32)
        inputs[f"terminated/{a}"] = np.zeros(k, bool)
        inputs[f"truncated/{a}"] = rng.random(k) < 0.1
        inputs[f"alive/{a}"] = rng.random(k) < 0.8
    inputs["first"] = rng.random(k) < 0.1
    inputs["global_state"] = np.concatenate([inputs[f"obs/{a}"] for a in AGENTS], axis=1)
    return inputs


@pytest.mark.parametrize("agent", sorted(BUILDERS))
def test_inference_serves_each_agent_with_its_policy_and_records_per_agent(agent):
    """Mapping agent_0 to policy p and agent_1, agent_2 to q: through the inference server
    (two workers batched), every agent's action is its own policy's greedy action on its own
    observation (q's with the agent's one-hot id), checked against each policy's network
    applied by hand; the two policies answer differently on the same observations; the unrolls
    hold every agent's step, and `nest` gives them as the anakin program does."""
    spec, builder, networks, params = _builder_and_params(agent, "agent_0=p,agent_[12]=q")
    fmt = step_format(spec)
    k, workers, steps = 3, 2, 6
    unrolls, stop = [], threading.Event()
    server = InferenceServer(
        ServedPolicy(jax.jit(builder.make_policy(networks, evaluation=True)), params,
                     jax.random.PRNGKey(0), spec, builder.extras_spec(spec)),
        InferenceSettings(workers, k, 4, timeout_s=0.05),
        lambda unroll, versions: unrolls.append(unroll), stop)
    server.start()
    sent = {w: [] for w in range(workers)}
    got = {w: [] for w in range(workers)}

    def worker(w):
        rng = np.random.default_rng(w)
        for _ in range(steps):
            sent[w].append(_worker_inputs(rng, k))
            got[w].append(server.step(w, 1, sent[w][-1]))

    run_workers(server, stop, worker, workers, timeout_s=60)

    logits = {policy: jax.jit(functools.partial(BUILDERS[agent][1], networks.policies[policy]))
              for policy in ("p", "q")}

    def greedy(policy, obs):
        return np.asarray(jnp.argmax(logits[policy](params[policy], jnp.asarray(obs)), axis=-1))

    one_hot = np.eye(2, dtype=np.float32)
    differ = 0
    for w in range(workers):
        for inputs, actions in zip(sent[w], got[w], strict=True):
            assert set(actions) == set(AGENTS)
            np.testing.assert_array_equal(actions["agent_0"], greedy("p", inputs["obs/agent_0"]))
            for i, a in enumerate(AGENTS[1:]):
                x = np.concatenate([inputs[f"obs/{a}"], np.repeat(one_hot[i:i + 1], k, 0)],
                                   axis=1)
                np.testing.assert_array_equal(actions[a], greedy("q", x))
            with_id = np.concatenate([inputs["obs/agent_0"], np.repeat(one_hot[:1], k, 0)], 1)
            differ += int((greedy("p", inputs["obs/agent_0"]) != greedy("q", with_id)).sum())
    assert differ > 0  # The two policies are not the same function.
    assert server.batches < workers * steps  # The workers' requests were batched.

    # Each worker's 6 steps make one unroll of T + 1 = 5 steps, with every agent's fields.
    assert len(unrolls) == workers
    for unroll in unrolls:
        w = next(w for w in range(workers)
                 if np.array_equal(unroll["obs/agent_0"][0], sent[w][0]["obs/agent_0"]))
        for name in sent[w][0]:
            np.testing.assert_array_equal(unroll[name], np.stack([s[name] for s in sent[w][:5]]))
        for a in AGENTS:
            np.testing.assert_array_equal(unroll[f"action/{a}"],
                                          np.stack([actions[a] for actions in got[w][:5]]))
            for extra in EXTRAS[agent]:
                assert unroll[f"{extra}/{a}"].shape[:2] == (5, k)
        nested = fmt.nest(unroll)
        assert isinstance(nested["obs"], MultiAgentStep)
        np.testing.assert_array_equal(nested["obs"].alive["agent_1"], unroll["alive/agent_1"])
        np.testing.assert_array_equal(nested["obs"].global_state, unroll["global_state"])
        assert set(nested) == {"obs", "first", "action"} | EXTRAS[agent]
        assert all(set(nested[extra]) == set(AGENTS) for extra in EXTRAS[agent])


def test_evaluation_plays_one_episode_per_env_and_counts_the_teams_return():
    """`run_episodes` (the evaluator node's and launch/evaluate.py's loop) on a multi-agent
    vector env: one episode per env, its return the sum over agents, as mpe2 stepped by hand
    gives it for the same seeds and actions."""
    envs = PettingZooFactory("pettingzoo:mpe2/simple_spread_v3", (("max_cycles", 6),)
                             ).make_vector(3, seed=0)

    def policy(params, key, step, state, first):  # Agent i always takes action i + 1.
        return {a: np.full(len(first), i + 1) for i, a in enumerate(AGENTS)}, {}, state

    returns = run_episodes(policy, None, envs, 3, jax.random.PRNGKey(0), 4, {})
    expected = []
    for i in range(3):
        env = simple_spread_v3.parallel_env(max_cycles=6)
        env.reset(seed=4 + i)
        total = 0.0
        while env.agents:
            _, reward, *_ = env.step({a: j + 1 for j, a in enumerate(AGENTS)})
            total += sum(np.float32(r) for r in reward.values())
        expected.append(total)
    np.testing.assert_allclose(returns, expected, rtol=1e-5)


def _run(args, timeout=300):
    return subprocess.run(RUN + args, capture_output=True, text=True, timeout=timeout, cwd=REPO)


def test_agents_of_different_spaces_on_one_policy_are_one_line_and_exit_2(tmp_path):
    """mpe2's speaker (3 actions, 3-dim observations) and listener (5, 11) cannot share
    IPPO's default policy: refused before any node starts."""
    out = _run(["--agent=ippo", "--env=pettingzoo:mpe2/simple_speaker_listener_v4",
                "--platform=local_mp", f"--logdir={tmp_path}"], timeout=120)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "serves agents with different spaces: speaker_0" in lines[0], \
        out.stderr
    assert "policy_mapping=per_agent" in lines[0]


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:  # A zombie has exited.
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_ippo_on_simple_spread_local_mp_stops_cleanly(tmp_path):
    """A short IPPO run on mpe2's simple_spread, env workers in their own processes: it stops
    at its budget with learner updates done, per-policy and per-agent metrics recorded, and
    leaves no process behind."""
    proc = subprocess.Popen(
        RUN + ["--agent=ippo", SPREAD, "--platform=local_mp", "--num_actors=1",
               "--envs_per_actor=4", "--unroll_length=16", "--batch_size=4",
               "--total_env_steps=800", f"--logdir={tmp_path}", "--quiet"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = set()
    try:
        while proc.poll() is None:
            seen |= set(processes.descendants(proc.pid))
            time.sleep(0.2)
        out, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    # The learner and the env worker ran as processes (beside multiprocessing's resource
    # tracker and fork server).
    assert len(seen) >= 4
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in seen) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in seen if _alive(p)]
    with open(tmp_path / "summary.json") as f:
        summary = json.load(f)
    assert summary["stopped_by"] == "budget" and summary["env_steps"] >= 800
    assert summary["learner_steps"] > 0 and summary["episodes"] > 0
    with open(tmp_path / "metrics.jsonl") as f:
        last = json.loads(f.readlines()[-1])
    assert "learner/policy/shared/loss" in last
    assert {f"learner/agent/{a}/reward_mean" for a in AGENTS} <= set(last)
    # Episodes are 25 steps; their team return is that of 3 agents.
    assert last["episode_length_mean"] == 25
    assert last["return_mean"] < 0


# The env-worker layout of each agent's learning run: IPPO's and MAPPO's benchmark (16 envs,
# JaxMARL's batch); independent IMPALA's own defaults.
LEARNING_LAYOUT = {"ippo": ["--num_actors=2", "--envs_per_actor=8"],
                   "mappo": ["--num_actors=2", "--envs_per_actor=8"], "iimpala": []}


@pytest.mark.slow
@pytest.mark.parametrize("agent", ["ippo", "mappo", "iimpala"])
def test_learns_simple_spread_on_local_mp(agent, tmp_path):
    """IPPO and MAPPO with JaxMARL's MPE settings, and independent IMPALA with its defaults,
    on mpe2's simple_spread, on local_mp: the mean team return over 100 episodes climbs from
    the random floor (-80.9) to -62, well above it (the window's mean has a standard error of
    about 2.4 at random), within 2M env steps."""
    out = _run([f"--agent={agent}", SPREAD, "--platform=local_mp", *LEARNING_LAYOUT[agent],
                "--total_env_steps=2000000", "--stop_at_return=-62",
                f"--logdir={tmp_path}", "--quiet"], timeout=3000)
    assert out.returncode == 0, out.stderr
    with open(tmp_path / "summary.json") as f:
        summary = json.load(f)
    assert summary["stopped_by"] == "return_target", summary
    assert summary["mean_return"] >= -62 > RANDOM_SPREAD_RETURN + 15
