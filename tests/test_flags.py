"""launch/flags/: every setting reachable from flags and files, one-line errors, saved runs."""

import dataclasses
import json
import math
import os
import subprocess
import sys

import pytest

from trellis.agents.registry import AGENTS, agent_module
from trellis.builders.contract.config import ExperimentConfig, settings
from trellis.builders.experiments.session import _write_config
from trellis.launch import flags, run

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Options every case sets (agent) or that say how an invocation starts or need another option:
# tested on their own below.
OPTIONS_TESTED_ELSEWHERE = {"agent", "config", "resume", "ray_address", "logdir",
                            "num_seeds", "member_hparams",  # Anakin only: test_anakin.
                            "pbt",  # Anakin only: test_pbt_anakin.
                            "preset",  # Needs an Atari env: test_atari_presets.
                            "env_kwargs", "env_wrappers"}  # test_user_envs.


def _other_value(s):
    """A valid value of setting `s` other than its default."""
    d = s.declaration
    if d.choices is not None:
        return next(c for c in d.choices if c != s.default)
    if s.sequence:
        return (7, 5)
    if s.kind is bool:
        return not s.default
    if s.kind is int:
        if (d.le is not None or d.lt is not None) and s.default > 1:
            return s.default // 2  # Within the bound (actor_nice's 19).
        return 2 * s.default if s.default else 1  # Doubling keeps PPO's minibatches dividing.
    if s.kind is float:
        if s.default in (None, 0):
            return 0.5
        return s.default / 2 if d.le is not None or d.lt is not None else s.default * 2
    return {"env": "Acrobot-v1", "policy_mapping": "per_agent",
            "policies": "shared,other"}[s.name]


def owners(name):
    """The agents whose config has the setting `name`, as the one-line error lists them."""
    return ", ".join(a for a in sorted(AGENTS)
                     if any(s.name == name for s in settings(agent_module(a).Config)))


# Settings an agent's preset fixes: any other value is refused in one line (tested below).
PINNED = {("iimpala", "core"), ("mappo", "normalize_observations"), ("mappo", "shared_torso")}
# Settings whose other value needs others set with it (ExperimentConfig.check refuses it alone).
COMPANIONS = {"learner_processes": {"unroll_queue": "replay", "learner_batch": "fixed"}}


def _text(value):
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def _cases():
    """(agent, class, setting): the experiment's fields once, every agent's every field."""
    cases = [("impala", ExperimentConfig, s) for s in settings(ExperimentConfig)]
    cases += [("impala", flags.RunOptions, s) for s in settings(flags.RunOptions)
              if s.name not in OPTIONS_TESTED_ELSEWHERE]
    for agent in sorted(AGENTS):
        config = agent_module(agent).Config
        cases += [(agent, config, s) for s in settings(config) if (agent, s.name) not in PINNED]
    return cases


CASES = _cases()
IDS = [f"{agent}-{s.name}" for agent, _, s in CASES]


def _value_of(result, cls, name):
    config = {flags.RunOptions: result.options, ExperimentConfig: result.experiment}.get(
        cls, result.agent)
    return getattr(config, name)


def _same(a, b):
    return math.isclose(a, b) if isinstance(a, float) else a == b


@pytest.mark.parametrize("agent,cls,s", CASES, ids=IDS)
def test_every_setting_is_settable_from_the_command_line(agent, cls, s):
    value = _other_value(s)
    companions = [f"--{k}={v}" for k, v in COMPANIONS.get(s.name, {}).items()]
    result = flags.parse([f"--agent={agent}", f"--{s.name}={_text(value)}", *companions])
    assert _same(_value_of(result, cls, s.name), value)
    assert result.options.agent == agent


@pytest.mark.parametrize("agent,name", sorted(PINNED))
def test_a_setting_a_preset_fixes_is_refused_in_one_line(agent, name):
    s = next(s for s in settings(agent_module(agent).Config) if s.name == name)
    with pytest.raises(flags.UsageError, match=f"--{name} must be"):
        flags.parse([f"--agent={agent}", f"--{name}={_text(_other_value(s))}"])


@pytest.mark.parametrize("agent,cls,s", CASES, ids=IDS)
def test_every_setting_is_settable_from_a_config_file(agent, cls, s, tmp_path):
    value = _other_value(s)
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"agent": agent, s.name: value, **COMPANIONS.get(s.name, {})}))
    result = flags.parse([f"--config={path}"])
    assert _same(_value_of(result, cls, s.name), value)
    assert result.options.agent == agent


def test_yaml_file_and_flags_override_it(tmp_path):
    path = tmp_path / "ppo.yaml"
    path.write_text("agent: ppo\nclip_epsilon: 0.1\nhidden_sizes: [32, 16]\nnum_actors: 3\n")
    result = flags.parse([f"--config={path}", "--num_actors=4"])
    assert result.agent.clip_epsilon == 0.1 and result.agent.hidden_sizes == (32, 16)
    assert result.experiment.num_actors == 4  # The flag wins over the file.


@pytest.mark.parametrize("agent", sorted(AGENTS))
def test_no_setting_name_is_used_twice(agent):
    names = [s.name for cls in (flags.RunOptions, ExperimentConfig, agent_module(agent).Config)
             for s in settings(cls)]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)


@pytest.mark.parametrize("agent", sorted(AGENTS))
def test_every_setting_has_a_one_line_help(agent):
    for cls in (flags.RunOptions, ExperimentConfig, agent_module(agent).Config):
        for s in settings(cls):
            assert s.help and "\n" not in s.help, (cls.__name__, s.name)


def test_defaults_and_stop_at_return():
    result = flags.parse([])
    # The env's family's preset applied: classic control's, the agent's own defaults.
    assert result.options == dataclasses.replace(flags.RunOptions(), preset="classic")
    # auto: the env's Gymnasium reward_threshold; everything else the dataclass's default.
    assert result.experiment == ExperimentConfig(stop_at_return=475.0)
    assert result.agent == agent_module("impala").Config()
    assert flags.parse(["--stop_at_return=none"]).experiment.stop_at_return is None
    assert flags.parse(["--stop_at_return=200"]).experiment.stop_at_return == 200.0
    # Pendulum has no reward_threshold: auto is no target.
    assert flags.parse(["--env=Pendulum-v1"]).experiment.stop_at_return is None


def test_boolean_flags():
    assert flags.parse(["--quiet"]).options.quiet is True
    assert flags.parse(["--learn=false"]).experiment.learn is False
    assert flags.parse(["--agent=ppo", "--normalize_advantages=no"]).agent.normalize_advantages \
        is False


def test_help_lists_the_agents_settings(capsys):
    with pytest.raises(SystemExit) as exit_:
        run.main(["--agent=ppo", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "agent ppo (PPOConfig)" in out and "--clip_epsilon FLOAT" in out
    assert "clip range of the probability ratio (default: 0.2; a number > 0)" in " ".join(
        out.split())
    assert "--num_actors INT" in out and "--vtrace_lambda" not in out


def _one_line_error(capsys, argv, expected):
    assert run.main(argv) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("run.py: error: ") and expected in lines[0], lines[0]


@pytest.mark.parametrize("argv,expected", [
    (["--clip_epsilon=0.1"], f"--clip_epsilon is a setting of {owners('clip_epsilon')}, not "
     "of impala"),
    (["--agent=dqn", "--entropy_cost=0.1"], f"--entropy_cost is a setting of "
     f"{owners('entropy_cost')}, not of dqn"),
    (["--entropy_costt=0.1"], "--entropy_costt is not a setting of --agent=impala; did you "
     "mean --entropy_cost?"),
    (["--entropy_cost=-1"], "--entropy_cost must be >= 0, got -1.0"),
    (["--agent=ppo", "--gae_lambda=1.5"], "--gae_lambda must be in [0, 1], got 1.5"),
    (["--batch_size=2.5"], "--batch_size must be an int >= 1, got '2.5'"),
    (["--learn=maybe"], "--learn must be true or false, got 'maybe'"),
    # IMPALA's default is its core's (none: CORE_DEFAULTS), so none is allowed too.
    (["--hidden_sizes=64,0"], "--hidden_sizes must be a non-empty list of ints >= 1 or none, "
     "got '64,0'"),
    (["--unroll_queue=disk"], "--unroll_queue must be one of 'local', 'replay', got 'disk'"),
    (["--agent=ppo", "--num_minibatches=3"], "--num_minibatches must be a divisor of "
     "unroll_length * batch_size = 1024"),
    (["--ray_address=auto"], "--ray_address must be none unless --platform=ray"),
    (["--agent=dqnx"], "--agent must be one of " + ", ".join(map(repr, sorted(AGENTS)))),
    (["--env=CartPole-v7"], "unknown env 'CartPole-v7'"),
    (["--env=sleep:fast"], "env 'sleep:fast': expected sleep:MS"),
])
def test_bad_flag_is_one_line_and_exit_2(argv, expected, capsys):
    _one_line_error(capsys, argv, expected)


@pytest.mark.parametrize("content,expected", [
    ({"agent": "impala", "clip_epsilon": 0.1}, f"clip_epsilon is a setting of "
     f"{owners('clip_epsilon')}, not of impala"),
    ({"entropy_cots": 0.1}, "entropy_cots is not a setting of --agent=impala; did you mean "
     "entropy_cost?"),
    ({"entropy_cost": -1}, "entropy_cost must be >= 0, got -1"),
    ({"num_actors": "two"}, "num_actors must be an int >= 1, got 'two'"),
    ({"hidden_sizes": [64, "x"]}, "hidden_sizes must be a non-empty list of ints >= 1"),
    ({"resume": "somewhere"}, "resume can only be given on the command line"),
    ({"experiment": {}, "agent": {}}, "unknown section 'agent'"),
    ([1, 2], "expected a mapping of settings, got list"),
])
def test_bad_config_file_is_one_line_naming_the_file_and_exit_2(content, expected, capsys,
                                                               tmp_path):
    path = tmp_path / "settings.json"
    path.write_text(json.dumps(content))
    _one_line_error(capsys, [f"--config={path}"], f"{path}: {expected}")


def test_unreadable_config_file_is_one_line(capsys, tmp_path):
    _one_line_error(capsys, [f"--config={tmp_path / 'none.json'}"], "cannot read settings from")
    (tmp_path / "torn.json").write_text('{"agent": ')
    _one_line_error(capsys, [f"--config={tmp_path / 'torn.json'}"], "JSONDecodeError")


def test_bad_config_file_through_run_py_is_one_line_and_exit_2(tmp_path):
    path = tmp_path / "settings.yaml"
    path.write_text("agent: sac\ntau: 2.0\n")
    out = subprocess.run([sys.executable, os.path.join(REPO, "launch", "run.py"),
                          f"--config={path}"], capture_output=True, text=True, timeout=120,
                         cwd=REPO)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines() == [
        f"run.py: error: {path}: tau must be in (0, 1], got 2.0"]


class _Builder:
    """What config.json's writer reads of a builder."""

    def __init__(self, config):
        self.config = config


def save_run_config(run_dir, argv):
    """config.json as run_experiment writes it for the run `argv` describes."""
    result = flags.parse(argv)
    _write_config(str(run_dir), _Builder(result.agent), result.experiment,
                  result.saved_options(), argv, None)
    return result


def test_config_json_round_trips_through_config(tmp_path):
    argv = ["--agent=ppo", "--platform=local_mt", "--clip_epsilon=0.1", "--hidden_sizes=32,32",
            "--value_clip_epsilon=0.3", "--num_actors=3", "--stop_at_return=none", "--quiet"]
    saved = save_run_config(tmp_path, argv)
    again = flags.parse([f"--config={tmp_path / 'config.json'}"])
    assert again.options.config == str(tmp_path / "config.json")
    assert dataclasses.replace(again, options=saved.options) == saved
    # The file is one to read and edit: three sections of settings and the run's record.
    data = json.loads((tmp_path / "config.json").read_text())
    assert set(data) == {"command_line", "experiment", "agent_config", "run"}
    assert data["agent_config"]["clip_epsilon"] == 0.1 and data["run"]["sessions"][0]["argv"] \
        == argv


def test_resume_rebuilds_the_saved_settings_and_flags_override(tmp_path):
    saved = save_run_config(tmp_path, ["--agent=dqn", "--epsilon=0.05", "--total_env_steps=5000",
                             "--env=Acrobot-v1"])
    resumed = flags.parse([f"--resume={tmp_path}"])
    assert resumed.agent == saved.agent and resumed.experiment == saved.experiment
    assert resumed.options == dataclasses.replace(saved.options, resume=str(tmp_path),
                                                  logdir=str(tmp_path))
    assert flags.load_run(str(tmp_path)).agent == saved.agent  # evaluate.py's way.
    longer = flags.parse([f"--resume={tmp_path}", "--total_env_steps=9000"])
    assert longer.experiment.total_env_steps == 9000 and longer.agent.epsilon == 0.05


@pytest.mark.parametrize("flag", ["--agent=impala", "--env=CartPole-v1"])
def test_resume_cannot_change_agent_or_env(flag, tmp_path, capsys):
    save_run_config(tmp_path, ["--agent=dqn", "--env=Acrobot-v1"])
    _one_line_error(capsys, [f"--resume={tmp_path}", flag],
                    f"{flag.split('=')[0]} cannot change on --resume")
