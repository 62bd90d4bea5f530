"""tune.py's command line without Ray: --search specs, the --pbt_* settings, sweep.json's best,
and bad input as one line with exit code 2."""

import os
import subprocess
import sys

import pytest

from trellis.builders.contract.config import ConfigError
from trellis.builders.experiments.pbt import Dimension, PBTConfig, SearchSpecError, parse_search
from trellis.launch import tune
from trellis.launch.flags import UsageError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("text, name, dimension", [
    ("learning_rate=loguniform:1e-4:1e-2", "learning_rate", Dimension("loguniform", (1e-4, 1e-2))),
    ("entropy_cost=uniform:0:0.05", "entropy_cost", Dimension("uniform", (0.0, 0.05))),
    ("batch_size=randint:8:64", "batch_size", Dimension("randint", (8, 64))),
    ("entropy_cost=choice:0,0.01", "entropy_cost", Dimension("choice", (0, 0.01))),
    ("hidden_sizes=grid:64,128", "hidden_sizes", Dimension("grid", (64, 128))),
    ("core=choice:none,lstm", "core", Dimension("choice", (None, "lstm"))),
    (" learning_rate = loguniform:1e-5:1e-1", "learning_rate",
     Dimension("loguniform", (1e-5, 1e-1))),
])
def test_search_specs_read_as_dimensions(text, name, dimension):
    assert parse_search(text) == (name, dimension)


@pytest.mark.parametrize("text, message", [
    ("learning_rate", "must be NAME=loguniform:LOW:HIGH"),
    ("learning_rate=logunif:1:2", "must be NAME=loguniform:LOW:HIGH"),
    ("=uniform:0:1", "must be NAME=loguniform:LOW:HIGH"),
    ("learning_rate=uniform:", "must be NAME=loguniform:LOW:HIGH"),
    ("learning_rate=loguniform:0:1e-2", "loguniform needs 0 < LOW < HIGH"),
    ("learning_rate=uniform:2:1", "uniform needs LOW < HIGH"),
    ("learning_rate=uniform:a:1", "uniform takes LOW:HIGH, two numbers"),
    ("learning_rate=uniform:1:2:3", "uniform takes LOW:HIGH, two numbers"),
    ("batch_size=randint:1.5:8", "randint takes two integers"),
    ("entropy_cost=choice:,", "choice needs at least one value"),
])
def test_bad_search_specs_say_what_is_allowed(text, message):
    with pytest.raises(SearchSpecError, match=message):
        parse_search(text)


def test_pbt_settings_are_checked():
    assert PBTConfig().pbt_perturb == (0.8, 1.2)
    with pytest.raises(ConfigError, match="pbt_quantile must be in"):
        PBTConfig(pbt_quantile=0.75)
    with pytest.raises(ConfigError, match="pbt_perturb must be two factors"):
        PBTConfig(pbt_perturb=(0.8, 1.0, 1.2))


def test_search_flags_repeat_in_both_spellings():
    specs, rest = tune.split_search(["--agent=ppo", "--search", "a=choice:1,2", "--seed=3",
                                     "--search=b=uniform:0:1"])
    assert specs == ["a=choice:1,2", "b=uniform:0:1"]
    assert rest == ["--agent=ppo", "--seed=3"]
    with pytest.raises(UsageError, match="--search needs a value"):
        tune.split_search(["--search"])


def test_a_sweep_spec_holds_the_flags_and_the_search_space(tmp_path):
    pytest.importorskip("ray.tune")
    spec, restore = tune.parse_sweep([
        "--agent=ppo", "--search", "learning_rate=loguniform:1e-4:1e-2", "--scheduler=pbt",
        "--pbt_interval=5000", "--num_trials=3", "--total_env_steps=9000",
        f"--logdir={tmp_path}", "--clip_epsilon=0.1"])
    assert not restore
    assert (spec.agent, spec.platform, spec.scheduler, spec.num_trials) == (
        "ppo", "local_mt", "pbt", 3)  # Trials run on threads unless --platform says otherwise.
    assert spec.pbt.pbt_interval == 5000 and spec.experiment.total_env_steps == 9000
    assert spec.agent_config.clip_epsilon == 0.1
    assert spec.search == {"learning_rate": Dimension("loguniform", (1e-4, 1e-2))}
    assert spec.sweep_dir == str(tmp_path)


def test_a_sweeps_trials_keep_the_atari_settings(tmp_path):
    """The trials step the env the flags name with its settings, and record them in
    config.json as run.py does (evaluate.py rebuilds the env from there)."""
    pytest.importorskip("ray.tune")
    pytest.importorskip("envpool")
    spec, _ = tune.parse_sweep([
        "--agent=impala", "--preset=atari", "--env=envpool:Pong-v5", "--frame_skip=2",
        "--search", "learning_rate=loguniform:1e-4:1e-3", f"--logdir={tmp_path}"])
    assert dict(spec.env_factory.options)["frame_skip"] == 2
    assert spec.options["frame_skip"] == 2 and spec.options["env"] == "envpool:Pong-v5"
    assert spec.agent_config.pixel_torso == "resnet"  # The preset's.


@pytest.mark.parametrize("argv, message", [
    (["--search", "learning_rate=loguniform:-1:2"], "loguniform needs 0 < LOW < HIGH"),
    (["--search", "clip_epsilon=uniform:0.1:0.3"],
     "clip_epsilon is not a setting of the experiment or of --agent=impala"),
    (["--scheduler=pbt"], "--scheduler=pbt needs at least one --search"),
    (["--scheduler=hyperband"], "--scheduler"),
    (["--pbt_quantile=0.9"], "--pbt_quantile must be in (0, 0.5], got 0.9"),
    (["--resume=runs/x"], "a sweep resumes with --restore=SWEEP_DIR"),
])
def test_bad_command_lines_are_one_line_and_exit_code_2(argv, message, capsys):
    assert tune.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("tune.py: error: ") and message in err
    assert err.count("\n") == 1


def test_a_logdir_that_holds_a_sweep_is_one_line_and_exit_code_2(tmp_path, capsys):
    pytest.importorskip("ray.tune")
    os.makedirs(tmp_path / "tune")  # What a sweep leaves: Tune's own directory.
    argv = ["--search", "learning_rate=loguniform:1e-4:1e-2", f"--logdir={tmp_path}"]
    assert tune.main(argv) == 2
    assert capsys.readouterr().err == (
        f"tune.py: error: --logdir={tmp_path} holds a sweep already (tune/): "
        f"--restore={tmp_path} resumes it; a new sweep needs a new directory\n")
    assert os.listdir(tmp_path) == ["tune"]


def test_the_script_exits_2_on_a_bad_search_space():
    done = subprocess.run(
        [sys.executable, os.path.join(ROOT, "launch", "tune.py"), "--search",
         "learning_rate=loguniform:1e-2"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "tune.py: error: --search 'learning_rate=loguniform:1e-2': loguniform takes LOW:HIGH, "
        "two numbers"]


def test_the_best_trial_is_the_completed_one_with_the_best_final_metric():
    pytest.importorskip("ray.tune")
    from trellis.builders.experiments.tuning import summarize

    trials = [{"trial_id": "c", "status": "completed", "metric": 30.0},
              {"trial_id": "a", "status": "failed", "metric": 90.0},
              {"trial_id": "b", "status": "completed", "metric": 50.0},
              {"trial_id": "d", "status": "completed", "metric": None}]
    summary = summarize(trials, "mean_return", "max")
    assert [t["trial_id"] for t in summary["trials"]] == ["a", "b", "c", "d"]
    assert summary["best"]["trial_id"] == "b"
    assert summarize(trials, "loss", "min")["best"]["trial_id"] == "c"
    assert summarize(trials[1:2], "mean_return", "max")["best"] is None


def test_the_config_files_search_section_and_flags_override_it(tmp_path):
    pytest.importorskip("ray.tune")
    path = tmp_path / "sweep.yaml"
    path.write_text("agent: ppo\nclip_epsilon: 0.1\nsearch:\n  learning_rate: loguniform:1e-4:1e-2"
                    "\n  entropy_cost: choice:0,0.01\n")
    spec, _ = tune.parse_sweep([f"--config={path}", "--search", "entropy_cost=uniform:0:0.1",
                                f"--logdir={tmp_path}"])
    assert spec.agent_config.clip_epsilon == 0.1
    assert spec.search == {"learning_rate": Dimension("loguniform", (1e-4, 1e-2)),
                           "entropy_cost": Dimension("uniform", (0.0, 0.1))}
    # run.py reads the same file and ignores the section.
    from trellis.launch.flags import parse

    assert parse([f"--config={path}"]).agent.clip_epsilon == 0.1
    path.write_text("search:\n  learning_rate: [1, 2]\n")
    with pytest.raises(UsageError, match="the search section must map setting names to specs"):
        tune.parse_sweep([f"--config={path}"])
    path.write_text("search:\n  clip_epsilon: uniform:0.1:0.3\n")
    with pytest.raises(UsageError, match="clip_epsilon is not a setting of the experiment"):
        tune.parse_sweep([f"--config={path}"])


def test_help_shows_the_trial_platforms_default(capsys):
    with pytest.raises(SystemExit):
        tune.main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    platform = out.split("where the nodes run:", 1)[1].split("--", 1)[0]
    assert "(default: local_mt;" in platform
