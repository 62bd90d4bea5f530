"""The run directory: every file there and valid; plot.py; evaluate.py; bad checkpoints."""

import concurrent.futures
import datetime
import json
import os
import shutil
import struct
import subprocess
import sys
import threading
import types

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = sys.executable


def script(name, args, timeout=120):
    return subprocess.run([PY, os.path.join(REPO, "launch", name)] + args, capture_output=True,
                          text=True, timeout=timeout, cwd=REPO)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """One short IMPALA run on CartPole, with evaluations and checkpoints."""
    path = str(tmp_path_factory.mktemp("run"))
    out = script("run.py", ["--platform=local_mt", "--total_env_steps=30000",
                            "--stop_at_return=none", "--eval_every=10000", "--eval_episodes=4",
                            "--checkpoint_every_s=2", "--log_every_s=0.1",
                            f"--logdir={path}"])
    assert out.returncode == 0, out.stderr
    return path


def read_events(path):
    """Every Event in a TensorBoard event file, checking the TFRecord framing and CRCs."""
    from tensorboardX.proto.event_pb2 import Event
    from tensorboardX.record_writer import masked_crc32c

    with open(path, "rb") as f:
        data = f.read()
    events, i = [], 0
    while i < len(data):
        header = data[i:i + 8]
        (length,) = struct.unpack("<Q", header)
        assert struct.unpack("<I", data[i + 8:i + 12])[0] == masked_crc32c(header)
        body = data[i + 12:i + 12 + length]
        assert struct.unpack("<I", data[i + 12 + length:i + 16 + length])[0] == \
            masked_crc32c(body)
        event = Event()
        event.ParseFromString(body)
        events.append(event)
        i += 16 + length
    return events


def test_run_dir_has_every_file_and_each_is_valid(run_dir):
    files = set(os.listdir(run_dir))
    for name in ("config.json", "metrics.jsonl", "summary.json", "learning_curve.png",
                 "checkpoints"):
        assert name in files, files

    config = json.load(open(os.path.join(run_dir, "config.json")))
    assert config["command_line"]["agent"] == "impala"
    assert config["command_line"]["env"] == "CartPole-v1"
    assert config["experiment"]["total_env_steps"] == 30000
    assert config["experiment"]["eval_every"] == 10000
    assert config["experiment"]["stop_at_return"] is None
    assert config["agent_config"]["learning_rate"] > 0
    record = config["run"]
    for lib in ("jax", "flax", "optax", "gymnasium"):
        assert record["versions"][lib], record["versions"]
    assert len(record["git_commit"].split("-")[0]) == 40

    summary = json.load(open(os.path.join(run_dir, "summary.json")))
    assert summary["stopped_by"] == "budget" and summary["env_steps"] >= 30000

    records = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    assert len(records) >= 3
    steps = [r["env_steps"] for r in records]
    assert steps == sorted(set(steps))  # Strictly increasing.
    last = records[-1]
    for field in ("learner_steps", "wall_time_s", "env_steps_per_s", "return_mean",
                  "return_min", "return_max", "learning_rate", "queue_size", "restarts",
                  "learner/loss", "policy_lag_mean", "policy_lag_max", "inference_batch_mean"):
        assert field in last, (field, last)
    assert 0 <= last["policy_lag_mean"] <= last["policy_lag_max"]
    # From one worker's envs per policy call to every worker's.
    experiment = config["experiment"]
    assert (experiment["envs_per_actor"] <= last["inference_batch_mean"]
            <= experiment["num_actors"] * experiment["envs_per_actor"]), last
    assert last["return_min"] <= last["return_mean"] <= last["return_max"]
    evals = [r for r in records if "eval_return_mean" in r]
    assert evals and evals[0]["eval_episodes"] == 4
    assert evals[0]["eval_env_steps"] < 10000  # The first evaluation is at the start.

    event_files = [f for f in files if f.startswith("events.out.tfevents")]
    assert len(event_files) == 1
    events = read_events(os.path.join(run_dir, event_files[0]))
    tags = {v.tag for e in events for v in e.summary.value}
    assert {"train/return_mean", "learner/loss", "eval/return_mean", "train/policy_lag_mean",
            "train/policy_lag_max", "train/inference_batch_mean"} <= tags, tags
    returns = [(e.step, v.simple_value) for e in events for v in e.summary.value
               if v.tag == "train/return_mean"]
    assert returns[-1] == (last["env_steps"], pytest.approx(last["return_mean"]))

    from PIL import Image

    image = np.asarray(Image.open(os.path.join(run_dir, "learning_curve.png")).convert("L"))
    assert image.shape[0] > 200 and image.shape[1] > 400
    assert image.std() > 10  # Lines and text, not a blank canvas.

    checkpoints = sorted(int(d) for d in os.listdir(os.path.join(run_dir, "checkpoints"))
                         if d.isdigit())
    assert 1 <= len(checkpoints) <= 3 and checkpoints[-1] >= 30000  # The one at stop.


def test_plot_overlays_runs(run_dir, tmp_path):
    second = tmp_path / "seed1"
    shutil.copytree(run_dir, second)
    out = tmp_path / "both.png"
    result = script("plot.py", [run_dir, str(second), f"--out={out}"], timeout=60)
    assert result.returncode == 0, result.stderr
    from PIL import Image

    assert np.asarray(Image.open(out).convert("L")).std() > 10
    missing = script("plot.py", [str(tmp_path / "nothing")], timeout=60)
    assert missing.returncode == 2 and "metrics.jsonl" in missing.stderr


def test_evaluate_reports_the_checkpoints_return(run_dir):
    out = script("evaluate.py", [run_dir, "--episodes=3"])
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["episodes"] == 3 and result["checkpoint_env_steps"] >= 30000
    assert result["return_mean"] > 0


def _one_line_error(out, path):
    assert out.returncode == 2, (out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert path in lines[0], lines[0]


def test_resume_without_checkpoint_is_one_clear_error(tmp_path):
    os.makedirs(tmp_path / "empty")
    json.dump({"command_line": {"agent": "impala", "env": "CartPole-v1"}, "experiment": {},
               "agent_config": {}}, open(tmp_path / "empty" / "config.json", "w"))
    out = script("run.py", [f"--resume={tmp_path / 'empty'}"], timeout=60)
    _one_line_error(out, str(tmp_path / "empty" / "checkpoints"))
    out = script("run.py", [f"--resume={tmp_path / 'nowhere'}"], timeout=60)
    _one_line_error(out, str(tmp_path / "nowhere" / "config.json"))


def _written(run_dir):
    """What a run wrote that a second run.py on its directory could change."""
    def read(name):
        with open(os.path.join(run_dir, name), "rb") as f:
            return f.read()

    return {name: read(name) for name in ("config.json", "metrics.jsonl", "summary.json")}


def test_a_logdir_that_holds_a_run_is_one_clear_error_and_left_as_it_was(run_dir):
    files = _written(run_dir)
    out = script("run.py", ["--platform=local_mt", "--total_env_steps=2000",
                            f"--logdir={run_dir}"], timeout=60)
    assert out.returncode == 2, out.stderr
    assert out.stderr.splitlines() == [
        f"run.py: error: --logdir={run_dir} holds a run already (config.json): "
        f"--resume={run_dir} continues it; a new run needs a new directory"]
    assert _written(run_dir) == files


def test_a_resume_of_a_run_still_going_is_one_clear_error_and_changes_nothing(run_dir):
    from trellis.builders.experiments.rundir import claim

    files = _written(run_dir)
    with claim(run_dir):  # As the run.py writing there holds it.
        out = script("run.py", [f"--resume={run_dir}", "--total_env_steps=40000"], timeout=60)
    assert out.returncode == 2, out.stderr
    assert out.stderr.splitlines() == [
        f"run.py: error: {run_dir} is in use by another run (pid {os.getpid()}): wait until "
        "it stops"]
    assert _written(run_dir) == files


def test_runs_started_in_the_same_second_get_a_directory_each(tmp_path, monkeypatch):
    from trellis.builders.experiments import rundir

    class Frozen(datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return cls(2026, 11, 27, 6, 0, 15)

    monkeypatch.setattr(rundir, "datetime", types.SimpleNamespace(datetime=Frozen))
    root = str(tmp_path / "runs")
    together = threading.Barrier(8)

    def new(_):
        together.wait()
        return rundir.new_run_dir("impala", "CartPole-v1", root=root)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        paths = list(pool.map(new, range(8)))
    base = os.path.join(root, "impala-CartPole-v1-20261127-060015")
    assert sorted(paths) == sorted([base] + [f"{base}-{n}" for n in range(2, 9)])
    assert all(os.path.isdir(path) for path in paths)
    # An env id's path separators and colons do not reach the name.
    assert os.path.basename(rundir.new_run_dir("impala", "mycart:ALE/My Cart-v0", root=root)) == (
        "impala-mycart_ALE_My_Cart-v0-20261127-060015")


@pytest.mark.parametrize("tool", ["run.py", "evaluate.py"])
def test_corrupt_checkpoint_is_one_clear_error(run_dir, tmp_path, tool):
    """Every checkpoint corrupt: both fall back past a corrupt newest one
    (tests/test_preemption.py, tests/test_evaluate.py), not past all."""
    broken = tmp_path / "broken"
    shutil.copytree(run_dir, broken)
    ckpt = broken / "checkpoints"
    steps = sorted((d for d in os.listdir(ckpt) if d.isdigit()), key=int)
    for step in steps:
        for root, _, names in os.walk(ckpt / step / "state"):
            for name in names:  # Garbage of the same size in every file of the state.
                path = os.path.join(root, name)
                size = os.path.getsize(path)
                with open(path, "wb") as f:
                    f.write(os.urandom(max(size, 16)))
    flag = f"--resume={broken}" if tool == "run.py" else str(broken)
    out = script(tool, [flag], timeout=60)
    _one_line_error(out, str(ckpt) if tool == "run.py" else str(ckpt / steps[-1]))


def test_a_short_run_draws_its_learning_curve_from_many_points(tmp_path):
    """Points every 5% of env-step growth, besides one per --log_every_s (issue 20: a
    7-second run drew 5 points, one per second). The log interval is set far beyond the run,
    so every point but the last comes from env-step growth."""
    out = script("run.py", ["--platform=local_mt", "--total_env_steps=60000",
                            "--stop_at_return=none", "--eval_every=0", "--log_every_s=600",
                            f"--logdir={tmp_path}", "--quiet"])
    assert out.returncode == 0, out.stderr
    steps = [json.loads(line)["env_steps"]
             for line in open(os.path.join(tmp_path, "metrics.jsonl"))]
    assert len(steps) >= 10, steps
    assert steps == sorted(set(steps))  # One point per env-step count, in order.
    assert all(b >= 1.05 * a for a, b in zip(steps[:-2], steps[1:-1], strict=True)), steps


def test_the_run_writer_does_not_import_torch_for_tensorboard(tmp_path):
    # tensorboardX imports torch wherever it is installed, for nothing a run writes: a
    # launcher held 650 MB instead of 230 MB on the H100 machine. A stand-in package of that
    # name tells whether it was loaded; nothing here loads it.
    site = tmp_path / "site"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text("class Tensor:\n    pass\n")
    code = f"""
import importlib.util
import sys
import threading
from trellis.builders.experiments.rundir import RunWriter
writer = RunWriter({str(tmp_path / "run")!r})
writer.log({{"env_steps": 1, "mean_return": 1.0}})
writer.close()
assert "torch" not in sys.modules, "tensorboardX imported torch"
found = []  # Still found afterwards, from any thread: the refusal is gone.
thread = threading.Thread(target=lambda: found.append(importlib.util.find_spec("torch")))
thread.start()
thread.join()
found.append(importlib.util.find_spec("torch"))
assert all(spec is not None and spec.origin.startswith({str(site)!r}) for spec in found), found
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(site), os.environ.get("PYTHONPATH")) if p)}
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert os.path.exists(tmp_path / "run" / "metrics.jsonl")
