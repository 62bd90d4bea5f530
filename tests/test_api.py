"""The Python API (launch/api.py, trellis/): `trellis.train` runs run.py's path and returns the
run; `trellis.load` gives a policy that acts and exports (launch/loaded_policy.py); what it
exports plays with jax, numpy and gymnasium alone, in a process that never imports Trellis
(tests/play_exported.py); evaluate.py --export writes the same files; the `trellis` command."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

import gymnasium as gym
import jax
import numpy as np
import pytest

import trellis
from trellis.agents import registry
from trellis.agents.ppo.builder import PPOBuilder
from trellis.agents.ppo.config import A2CConfig
from trellis.launch import evaluate
from trellis.launch.flags import UsageError
from trellis.launch.loaded_policy import FUNCTION_FILE, SPEC_FILE, LoadError

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: mypy's own TOML reader, installed with it.
    import tomli as tomllib

REPO = pathlib.Path(__file__).resolve().parents[1]
PLAYER = REPO / "tests" / "play_exported.py"
SOLVED = 450.0


def _play_exported(directory: str | os.PathLike[str], episodes: int = 20) -> dict:
    """tests/play_exported.py's record of `episodes` CartPole-v1 episodes played by the export
    in `directory`, in a fresh process that sees neither the repository nor Trellis (-I)."""
    out = subprocess.run([sys.executable, "-I", str(PLAYER), str(directory), "CartPole-v1",
                          str(episodes)], capture_output=True, text=True, timeout=300,
                         cwd=os.path.dirname(str(directory)))
    assert out.returncode == 0, out.stderr[-3000:]
    record = json.loads(out.stdout.strip().splitlines()[-1])
    assert "trellis" not in record["packages"], record["packages"]
    return record


def _assert_exports_a_solver(run_dir: str, export_dir: pathlib.Path) -> None:
    policy = trellis.load(run_dir)
    assert policy.export(str(export_dir)) == str(export_dir / FUNCTION_FILE)
    returns = _play_exported(export_dir)["returns"]
    assert len(returns) == 20 and np.mean(returns) >= SOLVED, returns


@pytest.fixture(scope="module")
def ppo_run(tmp_path_factory) -> trellis.Run:
    """PPO trained from Python to CartPole's return of 450 on threads (~20 s on 2 cores)."""
    directory = tmp_path_factory.mktemp("api") / "ppo"
    return trellis.train(agent="ppo", env="CartPole-v1", platform="local_mt",
                         stop_at_return=SOLVED, logdir=str(directory), quiet=True)


def test_a_run_of_an_agent_not_registered_here_says_to_give_the_object(ppo_run, tmp_path):
    """A run whose config.json names an agent object's class (registered only by the process
    that trained it): loading it elsewhere says, in the one line, to pass the object."""
    shutil.copytree(ppo_run.directory, tmp_path / "run")
    config_path = tmp_path / "run" / "config.json"
    config = json.loads(config_path.read_text())
    config["command_line"]["agent"] = "GoneBuilder"
    config_path.write_text(json.dumps(config))
    with pytest.raises(UsageError, match=r"got 'GoneBuilder' \(an agent object's run: give the "
                                         r"object, trellis.load\(run_dir, agent=OBJECT\)\)$"):
        trellis.load(str(tmp_path / "run"))


def test_importing_trellis_gives_the_version_and_loads_no_jax():
    code = ("import sys, trellis; print(trellis.__version__); "
            "print(sorted(m for m in ('jax', 'flax', 'trellis.launch.api') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=os.path.expanduser("~"))
    assert out.returncode == 0, out.stderr[-2000:]
    with open(REPO / "pyproject.toml", "rb") as f:
        version = tomllib.load(f)["project"]["version"]
    assert out.stdout.split() == [version, "[]"]
    assert trellis.__version__ == version == "0.2.0"


def test_train_returns_the_run(ppo_run):
    assert ppo_run.summary["stopped_by"] == "return_target"
    assert ppo_run.summary["mean_return"] >= SOLVED
    # run.py's directory: its config.json records the settings given from Python.
    with open(os.path.join(ppo_run.directory, "config.json")) as f:
        command_line = json.load(f)["command_line"]
    assert (command_line["agent"], command_line["env"], command_line["platform"]) == (
        "ppo", "CartPole-v1", "local_mt")
    metrics = ppo_run.metrics
    steps = [m["env_steps"] for m in metrics]
    assert len(metrics) >= 2 and steps == sorted(steps) and steps[-1] > 0
    returns = [m["return_mean"] for m in metrics if m.get("return_mean") is not None]
    assert returns[-1] > returns[0], returns


def test_the_loaded_policy_acts_and_solves(ppo_run):
    policy = ppo_run.load()
    assert not policy.recurrent and policy.step > 0
    env = gym.make("CartPole-v1")
    returns = []
    for seed in range(5):
        obs, _ = env.reset(seed=seed)
        total, done = 0.0, False
        while not done:
            action = policy(obs)
            assert np.shape(action) == () and action in (0, 1)
            obs, reward, terminated, truncated, _ = env.step(int(action))
            total, done = total + reward, terminated or truncated
        returns.append(total)
    assert np.mean(returns) >= SOLVED, returns
    batch = np.stack([env.observation_space.sample() for _ in range(7)])
    greedy = policy(batch)
    assert greedy.shape == (7,)
    np.testing.assert_array_equal(greedy, [policy(o) for o in batch])
    sampled = np.stack([policy(batch, sample=True) for _ in range(20)])
    assert set(np.unique(sampled)) <= {0, 1}
    with pytest.raises(LoadError, match=r"observations are of shape \(4,\).*got \(3,\)"):
        policy(np.zeros(3))


def test_the_export_plays_with_jax_alone(ppo_run, tmp_path):
    _assert_exports_a_solver(ppo_run.directory, tmp_path / "exported")
    spec = json.loads((tmp_path / "exported" / SPEC_FILE).read_text())
    assert spec["agent"] == "ppo" and spec["env"] == "CartPole-v1"
    assert spec["observation"] == {"shape": [4], "dtype": "float32"}
    assert spec["action"]["discrete"] and spec["action"]["num_actions"] == 2
    assert "cpu" in spec["platforms"] and spec["call"] == "obs -> actions"
    # Any batch size: the exported function's batch axis is symbolic.
    with open(tmp_path / "exported" / FUNCTION_FILE, "rb") as f:
        exported = jax.export.deserialize(bytearray(f.read()))
    obs = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    np.testing.assert_array_equal(exported.call(obs), ppo_run.load()(obs))


def test_an_export_is_not_overwritten_without_force(ppo_run, tmp_path):
    policy = ppo_run.load()
    policy.export(str(tmp_path))
    spec_file = tmp_path / SPEC_FILE
    spec_file.write_text("{}")
    with pytest.raises(LoadError, match="exists: export elsewhere, or overwrite it"):
        policy.export(str(tmp_path))
    assert spec_file.read_text() == "{}"
    policy.export(str(tmp_path), force=True)
    assert json.loads(spec_file.read_text())["agent"] == "ppo"


def test_evaluate_exports(ppo_run, tmp_path, capsys):
    directory = tmp_path / "cli"
    assert evaluate.main([ppo_run.directory, f"--export={directory}"]) == 0
    printed = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert printed["export"] == str(directory / FUNCTION_FILE)
    assert printed["spec"] == json.loads((directory / SPEC_FILE).read_text())
    assert (directory / SPEC_FILE).is_file()
    # Exists: one line, exit 2, the files kept; --force overwrites.
    before = (directory / FUNCTION_FILE).stat().st_mtime_ns
    assert evaluate.main([ppo_run.directory, f"--export={directory}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "exists" in err and "--force" in err, err
    assert (directory / FUNCTION_FILE).stat().st_mtime_ns == before
    assert evaluate.main([ppo_run.directory, f"--export={directory}", "--force"]) == 0


def test_evaluate_refuses_to_export_a_run_without_checkpoints(ppo_run, tmp_path, capsys):
    run_dir = tmp_path / "no_checkpoints"
    run_dir.mkdir()
    shutil.copy(os.path.join(ppo_run.directory, "config.json"), run_dir)
    assert evaluate.main([str(run_dir), f"--export={tmp_path / 'out'}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no checkpoints" in err, err
    assert not (tmp_path / "out").exists()


def test_train_refuses_a_bad_setting_in_one_line():
    with pytest.raises(UsageError, match="--learning_rat is not a setting of --agent=ppo; did "
                       "you mean --learning_rate"):
        trellis.train(agent="ppo", env="CartPole-v1", learning_rat=1e-3)


def test_train_takes_an_env_object(tmp_path):
    """A Gymnasium env constructor: registered under its factory's id, which config.json
    records and `load` finds in this process."""
    run = trellis.train(agent="ppo", env=gym.envs.classic_control.CartPoleEnv,
                        platform="local_mt", total_env_steps=2_000, quiet=True,
                        logdir=str(tmp_path / "object"))
    assert run.summary["env_steps"] >= 2_000
    env_id = json.loads((tmp_path / "object" / "config.json").read_text())["command_line"]["env"]
    assert env_id.startswith("python/CartPoleEnv-v")
    policy = trellis.load(run.directory)
    assert policy.env_id == env_id and policy(np.zeros(4, np.float32)) in (0, 1)


@pytest.fixture
def own_registry(monkeypatch):
    """Agent objects registered by the test stay in the test (the registry is per process)."""
    monkeypatch.setattr(registry, "_REGISTERED", {})


def test_train_takes_an_agent_object(tmp_path, own_registry):
    """A builder object trains with the config it was made with, under its class's name, which
    config.json records; `load` finds it in this process, and one made with another config is
    refused in one line naming the settings that differ."""
    builder = PPOBuilder(A2CConfig(unroll_length=8, batch_size=4, learning_rate=2e-3))
    run = trellis.train(agent=builder, env="CartPole-v1", platform="local_mt",
                        total_env_steps=2_000, quiet=True, logdir=str(tmp_path / "object"))
    assert run.summary["exit_code"] == 0 and run.summary["env_steps"] >= 2_000
    saved = json.loads((tmp_path / "object" / "config.json").read_text())
    assert saved["command_line"]["agent"] == "PPOBuilder"
    assert saved["agent_config"]["learning_rate"] == 2e-3
    assert saved["agent_config"]["unroll_length"] == 8
    assert trellis.load(run.directory)(np.zeros(4, np.float32)) in (0, 1)
    other = PPOBuilder(A2CConfig(unroll_length=8, batch_size=4))
    with pytest.raises(ValueError, match=r"^agent PPOBuilder runs with the config it was made "
                       r"with, and these settings differ from it: learning_rate \(set them in "
                       r"its config, A2CConfig\(...\)\)$"):
        trellis.load(run.directory, agent=other)


def test_train_refuses_what_is_not_an_agent_and_an_objects_settings_in_one_line(own_registry):
    with pytest.raises(TypeError) as raised:
        trellis.train(agent=42, env="CartPole-v1")
    assert str(raised.value) == (
        "agent must be a registered agent's name (e.g. 'ppo') or an agent object (a builder "
        "with `capabilities` and a `config` on trellis.builders.contract.config.Config: "
        "docs/your_own_agent.md), got 42 (int)")
    builder = PPOBuilder(A2CConfig())
    with pytest.raises(UsageError) as raised:
        trellis.train(agent=builder, env="CartPole-v1", learning_rate=1e-3, num_epochs=2)
    assert str(raised.value) == (
        "learning_rate, num_epochs: settings of agent PPOBuilder's config (A2CConfig); an "
        "agent object trains with the config it was made with: "
        "PPOBuilder(A2CConfig(learning_rate=...))")
    # The object registered above is among the names.
    with pytest.raises(UsageError, match="^--agent must be one of 'PPOBuilder', 'a2c', .*, "
                       "got 'nosuch'$"):
        trellis.train(agent="nosuch", env="CartPole-v1")


def test_a_recurrent_policy_keeps_its_state_and_exports_it(tmp_path, capsys):
    """R2D2 (an LSTM, trained from a replay node): the state carries from call to call until
    `reset`, and the exported function takes and gives it. evaluate.py plays the run too (its
    member restored from the training state, without the replay node's client)."""
    run = trellis.train(agent="r2d2", env="CartPole-v1", platform="local_mt",
                        total_env_steps=2_000, quiet=True, logdir=str(tmp_path / "r2d2"))
    policy = run.load()
    assert policy.recurrent
    obs = np.random.default_rng(0).normal(size=(6, 20, 4)).astype(np.float32)  # [T, N, 4]
    actions = [policy(o) for o in obs]
    state = {k: np.asarray(v) for k, v in policy._state.items()}
    assert np.abs(state["h"]).sum() > 0  # The LSTM moved from its zero start.
    policy.reset()
    np.testing.assert_array_equal(policy(obs[0]), actions[0])

    policy.export(str(tmp_path / "exported"))
    spec = json.loads((tmp_path / "exported" / SPEC_FILE).read_text())
    assert spec["recurrent"] and spec["call"] == "(obs, state, first) -> (actions, state)"
    with open(tmp_path / "exported" / FUNCTION_FILE, "rb") as f:
        exported = jax.export.deserialize(bytearray(f.read()))
    carried = {k: np.zeros((20, *v["shape"]), v["dtype"]) for k, v in spec["state"].items()}
    for t, o in enumerate(obs):
        step_actions, carried = exported.call(o, carried, np.full(20, t == 0))
        np.testing.assert_array_equal(step_actions, actions[t])
    np.testing.assert_allclose(carried["h"], state["h"], rtol=1e-5, atol=1e-6)

    assert evaluate.main([run.directory, "--episodes=2"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["episodes"] == 2


def test_the_trellis_command(ppo_run, tmp_path):
    def trellis_command(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "trellis", *args], capture_output=True,
                              text=True, timeout=300, cwd=tmp_path)

    out = trellis_command("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"trellis {trellis.__version__}"
    out = trellis_command("train")
    assert out.returncode == 2 and "unknown command 'train'; choose one of: run" in out.stderr
    out = trellis_command("evaluate", ppo_run.directory, "--episodes=3")
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.splitlines()[-1])["return_mean"] >= SOLVED
    console_script = pathlib.Path(sys.executable).with_name("trellis")
    out = subprocess.run([str(console_script), "run", "--agent=nope"], capture_output=True,
                         text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 2 and "agent must be one of" in out.stderr, out.stderr


@pytest.mark.slow
def test_an_anakin_run_exports(tmp_path):
    """PPO on gymnax's CartPole inside one jitted program; its export plays Gymnasium's
    (66 s on 2 loaded cores)."""
    run = trellis.train(agent="ppo", env="gymnax:CartPole-v1", platform="anakin",
                        stop_at_return=SOLVED, logdir=str(tmp_path / "anakin"), quiet=True)
    assert run.summary["stopped_by"] == "return_target"
    _assert_exports_a_solver(run.directory, tmp_path / "exported")


@pytest.mark.slow
def test_an_impala_local_mp_run_exports(tmp_path):
    # Trained to 475: stopped at a sampled mean of 450, this test failed one of two runs
    # (2026-11-29), a margin too thin for the export's greedy 450, which stays the check.
    run = trellis.train(agent="impala", env="CartPole-v1", platform="local_mp",
                        stop_at_return=475, logdir=str(tmp_path / "impala"), quiet=True)
    assert run.summary["stopped_by"] == "return_target"
    _assert_exports_a_solver(run.directory, tmp_path / "exported")


@pytest.mark.slow
def test_an_es_run_loads_its_mean(tmp_path):
    """Evolution strategies: the policy is the search's mean, deterministic (the search
    explores in parameter space), so sampled actions are the greedy ones."""
    run = trellis.train(agent="es", env="gymnax:CartPole-v1", platform="anakin",
                        total_env_steps=20_000, quiet=True, logdir=str(tmp_path / "es"))
    policy = run.load()
    obs = np.random.default_rng(0).normal(size=(16, 4)).astype(np.float32)
    np.testing.assert_array_equal(policy(obs, sample=True), policy(obs))
    policy.export(str(tmp_path / "exported"))
    with open(tmp_path / "exported" / FUNCTION_FILE, "rb") as f:
        exported = jax.export.deserialize(bytearray(f.read()))
    np.testing.assert_array_equal(exported.call(obs), policy(obs))


@pytest.mark.slow
def test_a_multi_agent_policy_takes_and_gives_a_dict(tmp_path):
    """IPPO on the warehouses (three agents, JAX): {agent: obs} in, {agent: action} out, for
    one step or a batch, and the same from the exported function."""
    run = trellis.train(agent="ippo", env="warehouses", platform="anakin",
                        total_env_steps=2_000, unroll_length=8, batch_size=4,
                        num_minibatches=2, quiet=True, logdir=str(tmp_path / "ippo"))
    policy = run.load()
    agents = policy.spec.agents
    rng = np.random.default_rng(0)
    batch = {a: rng.normal(size=(5, *s.observation_shape)).astype(np.float32)
             for a, s in policy.spec.specs.items()}
    actions = policy(batch)
    assert set(actions) == set(agents) and all(actions[a].shape == (5,) for a in agents)
    one = policy({a: x[0] for a, x in batch.items()})
    assert {a: int(v) for a, v in one.items()} == {a: int(actions[a][0]) for a in agents}
    with pytest.raises(LoadError, match="observes {agent: obs} for the agents"):
        policy({agents[0]: batch[agents[0]]})
    policy.export(str(tmp_path / "exported"))
    with open(tmp_path / "exported" / FUNCTION_FILE, "rb") as f:
        exported = jax.export.deserialize(bytearray(f.read()))
    called = exported.call(batch)
    for a in agents:
        np.testing.assert_array_equal(called[a], actions[a])


@pytest.mark.slow
def test_an_alphazero_run_loads_its_search(tmp_path, capsys):
    """AlphaZero's player is its search (no exploration noise) from pgx's game states, one or
    a batch; its export is refused in one line (a search steps the game's own model)."""
    run = trellis.train(agent="alphazero", env="pgx:tic_tac_toe", platform="anakin",
                        total_env_steps=500, unroll_length=9, batch_size=8,
                        num_simulations=2, eval_every_updates=0, quiet=True,
                        logdir=str(tmp_path / "alphazero"))
    policy = run.load()
    assert isinstance(policy, trellis.SearchPolicy)
    state, moves = policy.env.init(jax.random.PRNGKey(0)), 0
    while not bool(state.terminated):
        action = policy(state)
        assert np.shape(action) == () and bool(state.legal_action_mask[action])
        state, moves = policy.env.step(state, action), moves + 1
    assert 5 <= moves <= 9
    states = jax.vmap(policy.env.init)(jax.random.split(jax.random.PRNGKey(1), 4))
    actions = policy(states)
    assert actions.shape == (4,)
    assert np.asarray(states.legal_action_mask)[np.arange(4), actions].all()
    with pytest.raises(LoadError, match="tree search that steps the game's own model"):
        policy.export(str(tmp_path / "exported"))
    assert evaluate.main([run.directory, f"--export={tmp_path / 'exported'}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "tree search" in err, err
