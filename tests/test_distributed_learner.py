"""The learner across processes (builders/experiments/distributed.py): a `jax.distributed`
group of learner processes, here on one machine with JAX's CPU (gloo) collectives."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading

import numpy as np
import pytest

from tests.test_run import REPO, run, summary

# One learner process of a group of `processes`: IMPALA's learner, a tiny network, UPDATES
# updates on fixed global batches of B unrolls, of which this process feeds its share
# (B / processes columns, in process order); then one agreement of the group. Prints its
# params and the agreement as JSON.
SCRIPT = """
import json, sys
process, processes, port = (int(a) for a in sys.argv[1:4])
from trellis.builders.experiments import distributed
group = (distributed.initialize(f"127.0.0.1:{port}", processes, process) if processes > 1
         else distributed.LearnerGroup())
import jax
import numpy as np
from trellis.agents.impala import ImpalaBuilder, ImpalaConfig
from trellis.envs import EnvSpec

B, T, UPDATES = 4, 3, 3
spec = EnvSpec((3,), "float32", 2, (), "int32")
builder = ImpalaBuilder(ImpalaConfig(hidden_sizes=(8,), batch_size=B, unroll_length=T))
learner = builder.make_learner(builder.make_networks(spec), spec, jax.random.PRNGKey(0))
group.share_state(learner)
share = slice(process * B // processes, (process + 1) * B // processes)
for seed in range(UPDATES):
    rng = np.random.default_rng(seed)
    batch = {
        "obs": rng.normal(size=(T + 1, B, 3)).astype(np.float32),
        "action": rng.integers(0, 2, (T + 1, B)).astype(np.int32),
        "logits": rng.normal(size=(T + 1, B, 2)).astype(np.float32),
        "reward": rng.normal(size=(T + 1, B)).astype(np.float32),
        "terminated": rng.random((T + 1, B)) < 0.2,
        "truncated": np.zeros((T + 1, B), bool),
        "first": rng.random((T + 1, B)) < 0.2,
    }
    learner.step(learner.place({k: v[:, share] for k, v in batch.items()}))
# Process 0 is ready at env step 2**31 + 5 (past int32); the last of several is stopping.
turn = group.agree(ready=process == 0, stopping=processes > 1 and process == processes - 1,
                   env_steps=(2**31 + 5) if process == 0 else 7)
params = [np.asarray(x).tolist() for x in jax.tree.leaves(jax.device_get(learner.params))]
print(json.dumps({"params": params, "devices": len(learner.mesh.devices.flat),
                  "stop": turn.stop, "go": turn.go, "env_steps": turn.env_steps}))
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _learner_group(processes: int, timeout_s: float = 240) -> list[dict]:
    """Runs SCRIPT as `processes` processes of one group (one CPU device each)."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="")
    port = _free_port()
    children = [subprocess.Popen([sys.executable, "-c", SCRIPT, str(i), str(processes),
                                  str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, env=env) for i in range(processes)]
    results = []
    try:
        for i, child in enumerate(children):
            out, err = child.communicate(timeout=timeout_s)
            assert child.returncode == 0, f"process {i} failed:\n{err[-4000:]}"
            results.append({**json.loads(out.strip().splitlines()[-1]), "stderr": err})
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
    return results


def test_two_learner_processes_give_one_process_params_on_the_same_global_batch():
    """Gradients all-reduced over two processes' devices, each fed half of every batch: the
    params after the updates are one process's on the whole batches, within 1e-5; the
    group agrees as one (any stopping stops all, the coordinator's env steps)."""
    one, = _learner_group(1)
    two = _learner_group(2)
    assert one["devices"] == 1 and [r["devices"] for r in two] == [2, 2]
    for result in two:
        assert len(result["params"]) == len(one["params"])
        for a, b in zip(one["params"], result["params"], strict=True):
            np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-5)
        assert (result["stop"], result["go"], result["env_steps"]) == (True, False, 2**31 + 5)
    for i, result in enumerate(two):  # Each process's own line once the group formed.
        assert f"[learner] process {i} of 2 joined the learner group" in result["stderr"]
        assert "(2 devices in all)" in result["stderr"]
    # A group of one: ready and not stopping itself, so it goes.
    assert (one["stop"], one["go"]) == (False, True)
    # The updates changed the params (the comparison is not of two inits).
    init = _init_params()
    assert any(np.abs(np.asarray(a) - np.asarray(b)).max() > 1e-4
               for a, b in zip(one["params"], init, strict=True))


def _init_params() -> list:
    import jax

    from trellis.agents.impala import ImpalaBuilder, ImpalaConfig
    from trellis.envs import EnvSpec

    spec = EnvSpec((3,), "float32", 2, (), "int32")
    builder = ImpalaBuilder(ImpalaConfig(hidden_sizes=(8,), batch_size=4, unroll_length=3))
    learner = builder.make_learner(builder.make_networks(spec), spec, jax.random.PRNGKey(0),
                                   devices=jax.local_devices()[:1])
    return [np.asarray(x).tolist() for x in jax.tree.leaves(jax.device_get(learner.params))]


def test_learner_feeds_take_their_shares_of_one_table_with_their_versions():
    """The unrolls one feed puts into a replay node's Queue table carry their policy
    versions, so two learner processes' feeds, each taking its share, get each unroll's own."""
    from trellis import reverb_tables as rt
    from trellis.builders.contract.agent import ArraySpec
    from trellis.builders.experiments.feeds import POLICY_VERSION, UnrollFeed
    from trellis.builders.experiments.unroll_queue import TableUnrollQueue, unroll_table_spec

    t, k = 2, 3
    client = rt.make_client([unroll_table_spec({"obs": ArraySpec((), "float32")}, t, k, 8)])
    stop = threading.Event()
    try:
        writer, *readers = (UnrollFeed(TableUnrollQueue(client), (k,), stop, None)
                            for _ in range(3))
        for i in range(4):
            writer.put({"obs": np.full((t + 1, k), i, np.float32)}, np.full(t + 1, 10 * i))
        batches = [feed.next_batch() for feed in (*readers, *readers)]
    finally:
        stop.set()
        client.close()
    assert all(b is not None for b in batches)
    assert sorted(int(b["obs"][0, 0]) for b in batches) == [0, 1, 2, 3]
    for b in batches:
        np.testing.assert_array_equal(b[POLICY_VERSION], 10 * b["obs"].astype(np.int64))


@pytest.mark.parametrize("platform, settings, refusal", [
    ("local_mt", {}, "use --platform=local_mp or ray, not local_mt"),
    ("anakin", {}, "use --platform=local_mp or ray, not anakin"),
    ("local_mp", {"learner_processes": 3}, "must divide the batch size (32)"),
    ("local_mp", {"learn": False}, "--learn=false acts alone"),
    ("local_mp", {}, None),
])
def test_learner_processes_are_refused_in_one_line_where_they_cannot_run(platform, settings,
                                                                         refusal):
    from trellis.agents.impala import ImpalaBuilder, ImpalaConfig
    from trellis.builders.contract.config import ExperimentConfig
    from trellis.builders.experiments.distributed import group_refusal

    config = ExperimentConfig(**{"learner_processes": 2, "unroll_queue": "replay",
                                 "learner_batch": "fixed", **settings})
    message = group_refusal(ImpalaBuilder(ImpalaConfig(batch_size=32)), config, platform)
    assert message == refusal or (refusal is not None and refusal in message), message


def test_an_evolution_strategy_refuses_learner_processes(tmp_path):
    from trellis.agents.es import ESBuilder, ESConfig
    from trellis.builders.contract.config import ExperimentConfig
    from trellis.builders.experiments.session import UnsupportedError, run_experiment

    config = ExperimentConfig(learner_processes=2, unroll_queue="replay", learner_batch="fixed")
    with pytest.raises(UnsupportedError, match="--learner_processes=2 splits inference's "
                       "unrolls between the learner processes; ESBuilder learns from episodes"):
        run_experiment(ESBuilder(ESConfig()), "CartPole-v1", config, str(tmp_path),
                       platform="local_mp")


def test_learner_processes_need_the_replay_queue_and_fixed_batches():
    from trellis.agents.dqn import DQNBuilder, DQNConfig
    from trellis.builders.contract.config import ConfigError, ExperimentConfig
    from trellis.builders.experiments.distributed import group_refusal

    with pytest.raises(ConfigError, match="--unroll_queue=replay and --learner_batch=fixed"):
        ExperimentConfig(learner_processes=2)
    with pytest.raises(ConfigError, match="not restarted"):
        ExperimentConfig(learner_processes=2, unroll_queue="replay", learner_batch="fixed",
                         max_learner_restarts=1)
    config = ExperimentConfig(learner_processes=2, unroll_queue="replay", learner_batch="fixed")
    assert "DQNBuilder learns from replay" in group_refusal(DQNBuilder(DQNConfig()), config,
                                                            "local_mp")


TWO_LEARNERS = ["--agent=impala", "--env=CartPole-v1", "--learner_processes=2",
                "--unroll_queue=replay", "--learner_batch=fixed", "--stop_at_return=150",
                "--total_env_steps=400000"]


@pytest.mark.slow  # 6 min on 2 cores at load 30 (other agents' runs): five processes.
def test_impala_trains_cartpole_with_a_two_process_learner_on_local_mp(tmp_path):
    out = run(["--platform=local_mp", *TWO_LEARNERS, f"--logdir={tmp_path}"], timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    s = summary(tmp_path)
    # The stop rule saw 150; the summary's window is the final snapshot's, a few episodes on.
    assert s["stopped_by"] == "return_target" and s["mean_return"] >= 120, s
    # The group formed: each process's own line, once its first collective went through.
    for process in range(2):
        assert f"[learner] process {process} of 2 joined the learner group" in out.stderr, (
            out.stderr[-4000:])


# Run in a fresh Python (tests/test_preemption.py's way): a local Ray cluster of two nodes,
# one logical GPU each, so each learner process (which asks for an accelerator) lands on its
# own node, and room for the five nodes' CPUs (replay, two learners, two env workers); run.py
# joins it.
RAY_SCRIPT = """
import faulthandler, json, subprocess, sys
faulthandler.dump_traceback_later(760, exit=True)
import ray
from ray.cluster_utils import Cluster

cluster = Cluster(initialize_head=True, head_node_args={
    "num_cpus": 3, "num_gpus": 1, "include_dashboard": False})
cluster.add_node(num_cpus=3, num_gpus=1)
cluster.wait_for_nodes(timeout=180)
out = subprocess.run([sys.executable, "launch/run.py", "--platform=ray",
                      f"--ray_address={cluster.address}", *sys.argv[1:]],
                     capture_output=True, text=True)
cluster.shutdown()
sys.stderr.write(out.stderr)
print(json.dumps({"code": out.returncode}))
"""


@pytest.mark.slow
def test_impala_trains_cartpole_with_a_two_process_learner_on_a_two_node_ray_cluster(
        tmp_path):
    pytest.importorskip("ray")
    # The nodes bind loopback only: the cluster runs without Ray's auth token (test_ray's).
    env = dict(os.environ, RAY_AUTH_MODE="disabled", PYTHONPATH=REPO)
    out = subprocess.run([sys.executable, "-c", RAY_SCRIPT, *TWO_LEARNERS, "--quiet",
                          f"--logdir={tmp_path}"], env=env, cwd=REPO, capture_output=True,
                         text=True, timeout=800)
    assert out.returncode == 0, out.stderr[-4000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"code": 0}, out.stderr[-4000:]
    s = summary(tmp_path)
    # The stop rule saw 150; the summary's window is the final snapshot's, a few episodes on.
    assert s["stopped_by"] == "return_target" and s["mean_return"] >= 120, s
