"""Presets by env family: docs/presets.md's table is every preset's settings with its source;
each preset resolves, chosen by itself from the env's family, to the table's values; --preset
names one or turns them off, flags override them, config.json records the one that applied;
`run.py --list_presets` lists them (benchmarks/mujoco_suite.py's smoke run:
tests/test_benchmarks.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import jax
import numpy as np
import pytest

from trellis.agents.registry import AGENTS, agent_module
from trellis.builders.contract.config import ExperimentConfig, settings
from trellis.envs.specs import EnvSpec
from trellis.launch import flags
from trellis.launch.flags.presets import (
    FAMILIES,
    agent_presets,
    env_family,
    preset_line,
    preset_rows,
    preset_table,
)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(REPO, "docs", "presets.md")
# An env of each family with presets, and the package it needs.
FAMILY_ENVS = {"atari": ("envpool:Pong-v5", "envpool"), "mujoco": ("HalfCheetah-v5", "mujoco"),
               "minatar": ("minatar:Breakout", "minatar"),
               "dmc": ("playground:CartpoleBalance", "mujoco_playground"),
               "tic_tac_toe": ("pgx:tic_tac_toe", "pgx"),
               "connect_four": ("pgx:connect_four", "pgx")}


def documented() -> dict[tuple[str, str], dict[str, tuple[str, str]]]:
    """docs/presets.md's table: {(preset, agent): {setting: (value as written, source)}}."""
    with open(DOC) as f:
        text = f.read()
    table = re.search(r"<!-- presets table: start -->\n(.*?)<!-- presets table: end -->", text,
                      re.S).group(1)
    out: dict[tuple[str, str], dict[str, tuple[str, str]]] = {}
    for line in table.strip().splitlines()[2:]:
        preset, agent, setting, value, source = (c.strip() for c in line.strip("|").split("|"))
        out.setdefault((preset, agent), {})[setting] = (value, source)
    return out


def _setting(agent: str, name: str):
    return next(s for cls in (agent_module(agent).Config, flags.AtariConfig, ExperimentConfig)
                for s in settings(cls) if s.name == name)


def _resolved(run: flags.RunSettings, name: str):
    return getattr(next(c for c in (run.atari, run.experiment, run.agent) if hasattr(c, name)),
                   name)


def test_the_doc_tables_every_preset_setting_with_its_source():
    with open(DOC) as f:
        assert preset_table() in f.read()
    rows = {(r.preset, r.agent, r.setting): r.source for r in preset_rows()}
    table = {(p, a, s): source for (p, a), values in documented().items()
             for s, (_, source) in values.items()}
    assert table == rows
    assert {p for p, _ in documented()} == {"atari", "mujoco", "minatar", "dmc", "tic_tac_toe",
                                            "connect_four"}
    assert {a for p, a in documented() if p == "mujoco"} == {"sac", "td3", "d4pg", "mpo", "ppo"}
    assert all(source.strip() for source in rows.values())


@pytest.mark.parametrize("preset,agent", sorted(documented()))
def test_the_env_family_picks_the_preset_and_it_resolves_to_the_documented_settings(
        preset, agent):
    env, package = FAMILY_ENVS[preset]
    pytest.importorskip(package)
    # pgx's games and Playground's tasks are JAX programs: anakin only.
    platform = ["--platform=anakin"] if env.startswith(("pgx:", "playground:")) else []
    run = flags.parse([f"--agent={agent}", f"--env={env}", *platform])
    assert run.options.preset == preset
    assert run.saved_options()["preset"] == preset  # What config.json records.
    for name, (text, _) in documented()[(preset, agent)].items():
        expected = flags.from_text(_setting(agent, name), text)
        assert _resolved(run, name) == pytest.approx(expected), (preset, agent, name)


@pytest.mark.parametrize("env,family", [
    ("HalfCheetah-v5", "mujoco"), ("Humanoid-v5", "mujoco"), ("Hopper-v5", "mujoco"),
    ("CartPole-v1", "classic"), ("Pendulum-v1", "classic"), ("gymnax:CartPole-v1", "classic"),
    ("minatar:Breakout", "minatar"), ("gymnax:Breakout-MinAtar", "minatar"),
    ("sleep:5", None), ("LunarLander-v3", None), ("NoSuchEnv-v0", None),
    ("pgx:tic_tac_toe", "tic_tac_toe"), ("pgx:connect_four", "connect_four"),
    ("pgx:othello", None),
])
def test_env_family(env, family):
    assert env_family(env) == family


@pytest.mark.parametrize("env,family", [
    ("playground:CartpoleBalance", "dmc"), ("playground:HumanoidWalk", "dmc"),
    ("playground:Go1JoystickFlatTerrain", None), ("playground:NoSuchTask", None),
])
def test_playgrounds_dm_control_suite_is_the_dmc_family(env, family):
    pytest.importorskip("mujoco_playground")
    assert env_family(env) == family


def test_the_dmc_preset_names_its_source_and_the_settings_it_maps_approximately():
    """PPO's dmc preset is Playground's published DM Control PPO settings (its file named for
    each); the two that Trellis's anakin PPO can only approximate say so, and why."""
    rows = {r.setting: r for r in preset_rows() if r.preset == "dmc" and r.agent == "ppo"}
    playground = "mujoco_playground/config/dm_control_suite_params.py"
    assert {s for s, r in rows.items() if playground in r.source} == {
        "batch_size", "unroll_length", "num_epochs", "learning_rate", "entropy_cost",
        "discount", "reward_scale", "normalize_observations", "total_env_steps"}
    assert rows["num_minibatches"].value == 2 and rows["num_minibatches"].source.startswith(
        "Trellis: one 2,048-env rollout per update")
    assert rows["hidden_sizes"].source.startswith("Trellis: one width for both torsos")
    assert {a for p, a in documented() if p == "dmc"} == {"ppo", "sac"}


def test_sacs_dmc_preset_makes_brax_sgd_steps_per_env_step():
    """Brax's SAC steps its 128 envs once, then makes 8 SGD steps: on anakin, the preset's
    iterations of 128 envs x 1 step make round(replay_ratio x 128) = 8."""
    pytest.importorskip("mujoco_playground")
    run = flags.parse(["--agent=sac", "--env=playground:CartpoleBalance", "--platform=anakin"])
    assert run.options.preset == "dmc"
    agent = run.agent
    assert (agent.batch_size, agent.unroll_length, agent.sample_batch_size) == (128, 1, 512)
    assert round(agent.replay_ratio * agent.batch_size * agent.unroll_length) == 8


def test_classic_control_runs_on_every_agents_defaults():
    for agent, env in (("impala", "CartPole-v1"), ("sac", "Pendulum-v1"), ("dqn", "CartPole-v1")):
        run = flags.parse([f"--agent={agent}", f"--env={env}"])
        assert run.options.preset == "classic"
        assert run.agent == agent_module(agent).Config(), agent
    assert all(not agent_presets(a)["classic"] for a in AGENTS)


def test_an_agent_without_the_familys_preset_gets_none():
    pytest.importorskip("mujoco")
    run = flags.parse(["--agent=ddpg", "--env=HalfCheetah-v5"])
    assert run.options.preset is None and run.agent == agent_module("ddpg").Config()


def test_none_turns_it_off_a_name_chooses_and_flags_override(tmp_path):
    pytest.importorskip("mujoco")
    off = flags.parse(["--agent=sac", "--env=HalfCheetah-v5", "--preset=none"])
    assert off.options.preset is None and off.agent == agent_module("sac").Config()
    mujoco = flags.parse(["--agent=sac", "--env=Pendulum-v1", "--preset=mujoco"])
    assert mujoco.agent.replay_ratio == 1.0 and mujoco.agent.hidden_sizes == (256, 256)
    mine = flags.parse(["--agent=sac", "--env=HalfCheetah-v5", "--replay_ratio=0.5",
                        "--num_actors=1"])
    assert mine.agent.replay_ratio == 0.5 and mine.experiment.num_actors == 1
    assert mine.agent.min_replay_size == 10_000 and mine.experiment.envs_per_actor == 4


def test_a_resumed_run_keeps_the_preset_its_config_recorded(tmp_path):
    """A run directory's config.json (flat settings) names the preset that applied; parsing
    it again applies that preset, not the family's, and an older run's none stays none."""
    pytest.importorskip("mujoco")
    saved = flags.parse(["--agent=td3", "--env=HalfCheetah-v5"]).saved_options()
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({**saved, "env": "Hopper-v5"}))
    again = flags.parse([f"--config={path}"])
    assert again.options.preset == "mujoco" and again.agent.hidden_sizes == (256, 256)
    path.write_text(json.dumps({**saved, "preset": None}))
    assert flags.parse([f"--config={path}"]).agent == agent_module("td3").Config()


def test_a_run_names_the_preset_with_settings_that_applied():
    assert preset_line("impala", "minatar") == (
        "preset minatar: 7 settings of --agent=impala (each with its source: docs/presets.md); "
        "flags given override them, --preset=none drops them")
    assert preset_line("impala", "classic") is None  # No settings: nothing to say.
    assert preset_line("impala", None) is None


def test_run_py_lists_the_presets():
    out = subprocess.run([sys.executable, os.path.join(REPO, "launch", "run.py"),
                          "--list_presets"], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr
    for family in FAMILIES:
        assert f"\n{family}: " in out.stdout
    assert "--agent=sac: 18 settings from RL Baselines3 Zoo" in out.stdout


def test_an_unknown_preset_is_one_line():
    with pytest.raises(flags.UsageError) as raised:
        flags.parse(["--preset=mpe"])
    assert str(raised.value) == ("--preset must be one of auto, atari, mujoco, minatar, dmc, "
                                 "classic, tic_tac_toe, connect_four or none, got 'mpe'")



@pytest.mark.parametrize("agent", ["sac", "td3", "d4pg", "mpo"])
def test_mujoco_agents_evaluate_greedily_as_the_references(agent):
    """The evaluation policy (the evaluator's, evaluate.py's) acts the same under any key (the
    references' deterministic evaluation); the acting one explores."""
    spec = EnvSpec((5,), "float32", None, (2,), "float32", action_low=(-1.0, -1.0),
                   action_high=(1.0, 1.0))
    module = agent_module(agent)
    builder = module.Builder(module.Config(hidden_sizes=(8,)))
    networks = builder.make_networks(spec)
    training = builder.make_training(networks, spec)
    params = training.acting_params(training.init(jax.random.PRNGKey(0)))
    obs = np.ones((3, 5), np.float32)
    first = np.ones(3, bool)

    def act(evaluation: bool, seed: int) -> np.ndarray:
        policy = builder.make_policy(networks, evaluation=evaluation)
        return np.asarray(policy(params, jax.random.PRNGKey(seed), obs, {}, first)[0])

    np.testing.assert_array_equal(act(True, 1), act(True, 2))
    assert not np.allclose(act(False, 1), act(False, 2))
