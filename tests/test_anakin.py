"""The anakin platform: episode statistics on the device, the agent's update reused unchanged,
populations, the command line's checks, and resuming a run."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

pytest.importorskip("gymnax", reason="gymnax is an optional extra (pip install -e '.[gymnax]')")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402

from tests.multidevice import assert_devices_match, run_with_cpu_devices  # noqa: E402
from trellis.agents.common import init_training_state  # noqa: E402
from trellis.agents.ppo import Builder as PPOBuilder  # noqa: E402
from trellis.agents.ppo import Config as PPOConfig  # noqa: E402
from trellis.builders.experiments.anakin import Anakin, Population  # noqa: E402
from trellis.builders.experiments.curves import _member_returns, plot_run  # noqa: E402
from trellis.builders.experiments.device_episodes import (  # noqa: E402
    Episodes,
    track_episodes,
    window_in_order,
)
from trellis.builders.experiments.env_worker import EpisodeTracker  # noqa: E402
from trellis.builders.experiments.session import COMPILE_CACHE_SUBDIR  # noqa: E402
from trellis.envs import GymnaxFactory, make_env_factory  # noqa: E402
from trellis.launch import evaluate, run  # noqa: E402
from trellis.launch.flags import member_hparams  # noqa: E402

CARTPOLE = "gymnax:CartPole-v1"


def test_track_episodes_matches_the_env_workers_tracker():
    """The device window holds the host tracker's last W episodes, in order, also when more
    than W end on one step."""
    rng = np.random.default_rng(0)
    num_envs, window = 6, 4
    host = EpisodeTracker(num_envs)
    device = Episodes.zeros(num_envs, window)
    track = jax.jit(track_episodes)
    finished = []
    first = np.ones(num_envs, bool)
    for t in range(200):
        reward = rng.normal(size=num_envs).astype(np.float32)
        done = rng.random(num_envs) < (0.9 if t == 50 else 0.2)  # t=50: more than W end.
        finished += host.update(reward, done, first)
        device = track(device, reward, done, first)
        first = done
    count = int(device.count)
    assert count == len(finished)
    returns = window_in_order(np.asarray(device.returns), count)
    lengths = window_in_order(np.asarray(device.lengths), count)
    np.testing.assert_allclose(returns, [r for r, _ in finished[-window:]], rtol=1e-5)
    np.testing.assert_array_equal(lengths, [n for _, n in finished[-window:]])


def _fixed_policy(params, key, obs, state, first):
    del params, key, first
    return (obs[:, 2] > 0).astype(jnp.int32), {}, state  # Falls after ~35-50 steps.


def test_fixed_policy_rollout_returns_equal_python_stepping():
    """Episodes in the anakin window (vmapped envs, scanned unrolls, nothing learned) have the
    returns of stepping the same gymnax env in Python from their first observations."""
    factory = GymnaxFactory(CARTPOLE, (("max_steps_in_episode", 45),))
    jax_env = factory.make()
    anakin = Anakin(env=jax_env, policy=_fixed_policy,
                    init=functools.partial(init_training_state, lambda key: {}, optax.sgd(0.0)),
                    update=lambda state, batch: (state.replace(step=state.step + 1), {}),
                    initial_state={}, num_envs=4, unroll_length=25, return_window=1000)
    member = jax.jit(anakin.init_member)(jax.random.key(3), {})
    member, batches = jax.jit(lambda m: jax.lax.scan(
        lambda m, _: anakin.unroll(m), m, None, length=12))(member)
    batches = jax.device_get(batches)  # {field: [12, T + 1, B]}
    # The unrolls overlap by one step: drop each one's first, then the very first is the start.
    steps = {k: np.concatenate([v[0, :1], v[:, 1:].reshape((-1,) + v.shape[2:])])
             for k, v in batches.items()}  # [1 + 12 T, B]
    expected = []
    for b in range(anakin.num_envs):
        starts = np.flatnonzero(steps["first"][:, b])
        for t in starts:
            done = steps["terminated"][t + 1:, b] | steps["truncated"][t + 1:, b]
            if not done.any():
                break
            x, x_dot, theta, theta_dot = steps["obs"][t, b]
            state = jax_env.env.reset_env(jax.random.key(0), jax_env.params)[1].replace(
                x=x, x_dot=x_dot, theta=theta, theta_dot=theta_dot, time=0)
            expected.append(_python_return(jax_env, state))
    count = int(member.episodes.count)
    got = window_in_order(np.asarray(member.episodes.returns), count)
    assert count == len(expected) >= 8
    # The window holds the episodes by end time; compare as multisets.
    np.testing.assert_allclose(sorted(got), sorted(expected), rtol=1e-6)
    assert 45.0 in expected and min(expected) < 45.0  # Both truncated and terminated ones.


def _python_return(jax_env, state) -> float:
    env, params, total = jax_env.env, jax_env.params, 0.0
    while True:
        obs = np.asarray(env.get_obs(state))[None]
        action = int(_fixed_policy(None, None, obs, {}, None)[0][0])
        _, state, reward, terminated, truncated, _ = env.step(
            jax.random.key(0), state, action, params)
        total += float(reward)
        if terminated or truncated:
            return total


SMALL_PPO = PPOConfig(batch_size=8, unroll_length=8, num_minibatches=2, hidden_sizes=(16,))


def small_ppo_anakin(return_window: int):
    """(Anakin, learner) of a small PPO on gymnax CartPole-v1."""
    builder = PPOBuilder(SMALL_PPO)
    factory = make_env_factory(CARTPOLE)
    spec = factory.spec()
    networks = builder.make_networks(spec)
    learner = builder.make_learner(networks, spec, jax.random.key(0))
    training = builder.make_training(networks, spec)
    anakin = Anakin(env=factory.make(), policy=builder.make_policy(networks), init=training.init,
                    update=training.make_update(learner.mesh), initial_state={},
                    num_envs=SMALL_PPO.batch_size, unroll_length=SMALL_PPO.unroll_length,
                    return_window=return_window, hparams=training.hparams)
    return anakin, learner


@pytest.fixture(scope="module")
def ppo():
    return small_ppo_anakin(return_window=10)


def test_update_on_anakin_equals_the_learners_update(ppo):
    """One anakin step's update gives the params that the agent's own learner (the host
    shell of the other platforms) gives on the same batch."""
    anakin, learner = ppo
    member = jax.jit(anakin.init_member)(jax.random.key(1), {})
    stepped, _ = jax.jit(anakin.member_update)(member)
    _, batch = jax.jit(anakin.unroll)(member)
    assert batch["obs"].shape == (SMALL_PPO.unroll_length + 1, SMALL_PPO.batch_size, 4)
    learner.restore(member.train)
    learner.step(jax.device_get(batch))
    for got, want in zip(jax.tree.leaves(stepped.train.params), jax.tree.leaves(learner.params),
                         strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert not np.allclose(jax.tree.leaves(stepped.train.params)[0],
                           jax.tree.leaves(member.train.params)[0])  # It did learn.


def test_population_members_are_independent(ppo):
    """Members with the same seed and hyper-parameters are identical; another seed or another
    learning rate gives another member."""
    anakin, learner = ppo
    data = jax.random.key_data(jax.random.split(jax.random.key(5), 2))
    keys = jax.random.wrap_key_data(jnp.stack([data[0], data[0], data[1], data[0]]))
    lr = SMALL_PPO.learning_rate
    population = Population(anakin, learner.mesh, keys,
                            {"learning_rate": [lr, lr, lr, lr / 10]}, updates_per_call=3)
    population.step()
    population.step()
    params = [np.concatenate([np.ravel(x[m]) for x in jax.tree.leaves(
        population.state.train.params)]) for m in range(4)]
    np.testing.assert_array_equal(params[0], params[1])
    assert not np.allclose(params[0], params[2])
    assert not np.allclose(params[0], params[3])
    snapshots = population.snapshots(env_steps=0, elapsed_s=0.0, resumes=0)
    assert snapshots[0].returns == snapshots[1].returns
    assert snapshots[0].learner_steps == 6
    lrs = np.asarray(population.state.train.opt_state[1].hyperparams["learning_rate"])
    np.testing.assert_allclose(lrs, [lr, lr, lr, lr / 10], rtol=1e-6)


@pytest.mark.parametrize("argv, message", [
    (["--platform=anakin", "--env=CartPole-v1"], "needs an env written in JAX"),
    (["--env=gymnax:CartPole-v1"], "runs with --platform=anakin"),
    (["--num_seeds=4"], "num_seeds must be 1 unless --platform=anakin"),
    (["--platform=anakin", "--env=gymnax:CartPole-v1", "--member_hparams=learning_rate=1,2"],
     "learning_rate has 2 values; give 1 or --num_seeds=1"),
    (["--platform=anakin", "--env=gymnax:CartPole-v1", "--member_hparams=learning_rate=x"],
     "must be NAME=V1,V2,... or NAME=LOW:HIGH"),
])
def test_bad_command_lines_are_one_line_and_exit_2(argv, message, capsys, tmp_path):
    assert run.main(["--agent=ppo", f"--logdir={tmp_path}", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err


@pytest.mark.parametrize("argv, message", [
    (["--agent=impala", "--core=lstm"], "feed-forward policies only"),
    (["--agent=dqn"], "DQNBuilder learns from replay on the host"),
    (["--agent=ppo", "--member_hparams=entropy_costt=0.1"], "entropy_costt is not a hyper"),
])
def test_agents_anakin_cannot_run_exit_2(argv, message, capsys, tmp_path):
    assert run.main([*argv, "--platform=anakin", f"--env={CARTPOLE}", "--no_compile_cache",
                     f"--logdir={tmp_path}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err


def _run(*argv: str) -> None:
    script = os.path.join(os.path.dirname(os.path.dirname(__file__)), "launch", "run.py")
    out = subprocess.run([sys.executable, script, *argv], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Where the command-line tests put their run directories: their programs are the same, and
    the compilation cache beside the run directories is shared."""
    return tmp_path_factory.mktemp("runs")


SMALL_FLAGS = ("--agent=ppo", "--platform=anakin", f"--env={CARTPOLE}", "--quiet",
               "--batch_size=8", "--unroll_length=8", "--num_minibatches=2", "--hidden_sizes=16",
               "--updates_per_call=4", "--num_seeds=2", "--stop_at_return=none")


def test_resume_continues_counters_and_returns(runs, capsys):
    """A run stopped at its budget and resumed goes on from its checkpoint: env and learner
    steps, episodes and the return window continue, metrics are appended; the second process
    finds the first one's programs in the compilation cache."""
    run_dir = runs / "resume"
    _run(*SMALL_FLAGS, "--total_env_steps=1024", f"--logdir={run_dir}")
    first = json.loads((run_dir / "summary.json").read_text())
    assert first["env_steps"] == 1024 and first["learner_steps"] == 16
    # At least the initial state's and the step's.
    assert len(os.listdir(runs / COMPILE_CACHE_SUBDIR)) >= 2
    _run(f"--resume={run_dir}", "--total_env_steps=2048")
    second = json.loads((run_dir / "summary.json").read_text())
    assert second["resumed_from_env_steps"] == 1024
    assert second["env_steps"] == 2048 and second["learner_steps"] == 32
    assert second["episodes"] > first["episodes"]
    assert len(second["members"]) == 2
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r["env_steps"] for r in records]
    assert steps == sorted(steps) and steps[-1] == 2048 and records[-1]["resumes"] == 1
    assert os.path.isdir(run_dir / "checkpoints" / "2048")
    # evaluate.py plays a member's greedy policy from the newest checkpoint.
    assert evaluate.main([str(run_dir), "--episodes=4", "--member=1"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["episodes"] == 4 and result["member"] == 1
    assert result["checkpoint_env_steps"] == 2048 and result["return_min"] >= 8  # CartPole.
    assert evaluate.main([str(run_dir), "--member=2"]) == 2
    assert "--member must be in [0, 2)" in capsys.readouterr().err


def test_plot_draws_the_members_mean_and_spread(tmp_path):
    records = [{"env_steps": 100 * i, "return_mean": 1.0, "member/0/return_mean": float(i),
                "member/1/return_mean": float(3 * i), "member/1/learning_rate": 0.1}
               for i in range(1, 4)]
    records.insert(0, {"env_steps": 0, "return_mean": None})  # Before any episode ended.
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    xs, ys = _member_returns(records, "env_steps")
    assert xs == [100, 200, 300]
    np.testing.assert_array_equal(ys, [[1, 3], [2, 6], [3, 9]])
    assert _member_returns([{"env_steps": 1, "return_mean": 2.0}], "env_steps") is None
    assert os.path.getsize(plot_run(str(tmp_path))) > 0


@pytest.mark.slow
@pytest.mark.parametrize("agent, members", [("ppo", 1), ("ppo", 8), ("impala", 1)])
def test_agents_solve_cartpole_on_anakin(agent, members, tmp_path):
    """run.py's defaults reach mean return 450 on gymnax's CartPole-v1, every member."""
    _run(f"--agent={agent}", "--platform=anakin", f"--env={CARTPOLE}", "--quiet",
         "--stop_at_return=450", f"--num_seeds={members}", "--total_env_steps=3000000",
         f"--logdir={tmp_path / 'run'}")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["stopped_by"] == "return_target", summary
    assert summary["solved_fraction"] == 1.0
    assert all(m["mean_return"] >= 450 for m in summary["members"])


def test_ctrl_c_stops_with_a_checkpoint_and_summary(tmp_path, runs):
    """SIGINT during training: exit code 130, stopped_by signal, a final checkpoint."""
    run_dir = runs / "ctrl-c"
    script = os.path.join(os.path.dirname(os.path.dirname(__file__)), "launch", "run.py")
    stderr = (tmp_path / "stderr").open("w")  # A file: a full pipe would block the process.
    process = subprocess.Popen(
        [sys.executable, script, *SMALL_FLAGS, "--total_env_steps=100000000", "--log_every_s=0.1",
         f"--logdir={run_dir}"],
        stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        deadline = time.monotonic() + 240
        while not (run_dir / "metrics.jsonl").exists() or not (
                run_dir / "metrics.jsonl").read_text():
            assert process.poll() is None and time.monotonic() < deadline, "no metrics"
            time.sleep(0.1)
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=240) == 130, (tmp_path / "stderr").read_text()[-3000:]
    finally:
        process.kill()
        stderr.close()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stopped_by"] == "signal" and summary["exit_code"] == 130
    assert os.path.isdir(run_dir / "checkpoints" / str(summary["env_steps"]))


def test_member_hparams_lists_and_log_uniform_ranges():
    out = member_hparams("learning_rate=1e-3:1e-2; entropy_cost=0.01", 64, seed=3)
    lr = np.array(out["learning_rate"])
    assert lr.shape == (64,) and (lr >= 1e-3).all() and (lr <= 1e-2).all()
    # Log-uniform: half below the geometric mean (binomial(64, 1/2), within 3 sigma).
    assert 20 <= (lr < np.sqrt(1e-3 * 1e-2)).sum() <= 44
    assert out["entropy_cost"] == [0.01] * 64
    assert member_hparams("learning_rate=1e-3:1e-2", 64, seed=3)["learning_rate"] == list(lr)
    assert member_hparams("learning_rate=1e-3:1e-2", 64, seed=4)["learning_rate"] != list(lr)
    assert member_hparams("learning_rate=1,2,3", 3, seed=0) == {"learning_rate": [1.0, 2.0, 3.0]}
    assert member_hparams(None, 3, seed=0) == {}


_DEVICES_SCRIPT = """
import json, jax, numpy as np
from trellis.agents.ppo import Builder, Config
from trellis.builders.experiments.anakin_run import PopulationSettings, make_population
from trellis.envs import make_env_factory
config = Config(batch_size=8, unroll_length=8, num_minibatches=2, hidden_sizes=(16,))
population = make_population(Builder(config), make_env_factory("gymnax:CartPole-v1"), 0, 10,
                             PopulationSettings(num_seeds=2, updates_per_call=2))
metrics, _ = population.step()
obs = population.state.pending["obs"]
print(json.dumps({"params": [np.asarray(x).ravel().tolist()
                             for x in jax.tree.leaves(population.state.train.params)],
                  "loss": float(np.mean(metrics["loss"])),
                  "shards": len(obs.sharding.device_set),
                  "member_shard_rows": obs.addressable_shards[0].data.shape[0]}))
"""


@pytest.mark.slow
def test_members_are_split_over_devices_with_the_same_numbers():
    """On 2 devices each holds one of the 2 members whole; params and loss are those of 1."""
    result = {str(n): run_with_cpu_devices(_DEVICES_SCRIPT, n, timeout=600) for n in (1, 2)}
    assert result["2"]["shards"] == 2 and result["1"]["shards"] == 1
    assert result["2"]["member_shard_rows"] == 1 and result["1"]["member_shard_rows"] == 2
    assert_devices_match(result)
