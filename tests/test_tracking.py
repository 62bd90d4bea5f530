"""--track=mlflow|wandb end to end (builders/experiments/tracking.py), offline: an MLflow file
store and a wandb offline run, read back and compared with the run directory's own records;
with --video, the videos of each evaluation and of the final checkpoint, there and tracked."""

import glob
import json
import os
import struct
import subprocess
import sys

import pytest

from trellis.builders.experiments.rundir import read_metrics
from trellis.builders.experiments.tracking import TrackingError, backend

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN = [sys.executable, os.path.join(REPO, "launch", "run.py")]
EVALUATE = [sys.executable, os.path.join(REPO, "launch", "evaluate.py")]
# A short PPO run on CartPole with an evaluator: records every log interval and two evaluations.
ARGS = ["--agent=ppo", "--platform=local_mt", "--total_env_steps=20000", "--stop_at_return=none",
        "--eval_every=10000", "--eval_episodes=2", "--log_every_s=0.5"]


def _run(args, env=None, timeout=600):
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=REPO,
                          env={**os.environ, **(env or {})})


def _frames(path):
    """(frame count, (width, height)) of a video, read back by ffmpeg."""
    imageio_ffmpeg = pytest.importorskip("imageio_ffmpeg")
    frames, _ = imageio_ffmpeg.count_frames_and_secs(path)
    reader = imageio_ffmpeg.read_frames(path)
    size = next(reader)["size"]
    reader.close()
    return frames, size


def _returns(run_dir):
    """(env_steps, return_mean) of each metrics.jsonl record that has a return."""
    return [(r["env_steps"], r["return_mean"]) for r in read_metrics(run_dir)
            if r["return_mean"] is not None]


@pytest.fixture(scope="module")
def mlflow_run(tmp_path_factory):
    """A run tracked by MLflow in a local file store, with videos: (run dir, store URI)."""
    pytest.importorskip("mlflow", reason="the mlflow extra: pip install -e '.[mlflow]'")
    pytest.importorskip("imageio_ffmpeg", reason="the video extra: pip install -e '.[video]'")
    run_dir = str(tmp_path_factory.mktemp("tracked") / "run")
    uri = f"file:{tmp_path_factory.mktemp('mlruns')}"
    out = _run(RUN + ARGS + ["--track=mlflow", "--video", f"--logdir={run_dir}"],
               env={"MLFLOW_TRACKING_URI": uri, "MLFLOW_EXPERIMENT_NAME": "trellis-test"})
    assert out.returncode == 0, out.stderr
    return run_dir, uri


def _mlflow_runs(uri):
    """(client, the runs of the test's experiment) in the file store `uri`."""
    import mlflow

    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # As the tracker does for file:.
    client = mlflow.MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("trellis-test")
    return client, client.search_runs([experiment.experiment_id])


def test_mlflow_gets_every_record_the_config_and_the_files(mlflow_run):
    run_dir, uri = mlflow_run
    client, (run,) = _mlflow_runs(uri)
    assert run.info.run_name == "run" and run.info.status == "FINISHED"
    history = client.get_metric_history(run.info.run_id, "return_mean")
    # One point per log interval, at the record's env steps, with its value.
    expected = _returns(run_dir)
    assert len(expected) >= 5
    assert sorted((m.step, m.value) for m in history) == expected
    steps = client.get_metric_history(run.info.run_id, "learner/loss")
    assert len(steps) == sum("learner/loss" in r for r in read_metrics(run_dir))
    # The resolved config: flat params and config.json as it was written.
    assert run.data.params["command_line.agent"] == "ppo"
    assert run.data.params["experiment.total_env_steps"] == "20000"
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.json", "learning_curve.png", "videos"} <= artifacts
    videos = {a.path for a in client.list_artifacts(run.info.run_id, "videos")}
    assert videos == {f"videos/{name}" for name in os.listdir(os.path.join(run_dir, "videos"))}


def test_video_at_each_evaluation_and_of_the_final_checkpoint(mlflow_run):
    run_dir, _ = mlflow_run
    with open(os.path.join(run_dir, "summary.json")) as f:
        final = json.load(f)["env_steps"]
    names = sorted(os.listdir(os.path.join(run_dir, "videos")))
    # The evaluator's at 0 env steps (it may reach the one at 10,000 or not before the end),
    # and the final checkpoint's.
    assert names[0] == "step-0-episode-0.mp4" and f"step-{final}-episode-0.mp4" in names
    for name in names:
        frames, size = _frames(os.path.join(run_dir, "videos", name))
        assert frames >= 9 and size == (608, 400)  # CartPole falls after 8 steps at the least.


def test_evaluate_writes_a_video_per_episode_as_long_as_the_episode(mlflow_run, tmp_path):
    run_dir, _ = mlflow_run
    out = _run(EVALUATE + [run_dir, "--episodes=2", f"--video={tmp_path}"])
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.splitlines()[-1])
    step = result["checkpoint_env_steps"]
    frames = [_frames(str(tmp_path / f"step-{step}-episode-{i}.mp4"))[0] for i in range(2)]
    # CartPole's return is its length: a frame for the start and one per step.
    assert sorted(frames) == [int(result["return_min"]) + 1, int(result["return_max"]) + 1]


def _wandb_records(path):
    """The records of a wandb offline run's file (LevelDB's log format: 32 KiB blocks of
    chunks, each a 7-byte header of CRC, length and type; the file opens with a 7-byte
    header of its own), parsed as wandb's protobuf Records."""
    from wandb.proto import wandb_internal_pb2

    with open(path, "rb") as f:
        raw = f.read()
    block, pos, chunks, records = 32768, 7, b"", []
    while pos + 7 <= len(raw):
        left = block - pos % block
        if left < 7:  # A block's tail too short for a header is padding.
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", raw[pos:pos + 7])
        pos += 7
        chunks += raw[pos:pos + length]
        pos += length
        if kind in (1, 4):  # A full record, or a record's last chunk.
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunks)
            records.append(record)
            chunks = b""
    return records


def _items(items):
    """{key: value} of a wandb record's items (a key is `key`, or `nested_key`'s parts)."""
    return {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in items}


def test_wandb_offline_run_gets_every_record_and_the_config(tmp_path):
    pytest.importorskip("wandb", reason="the wandb extra: pip install -e '.[wandb]'")
    run_dir = str(tmp_path / "run")
    out = _run(RUN + ARGS[:3] + ["--total_env_steps=8000", "--track=wandb",
                                 f"--logdir={run_dir}"],
               env={"WANDB_MODE": "offline", "WANDB_SILENT": "true"})
    assert out.returncode == 0, out.stderr
    (path,) = glob.glob(os.path.join(run_dir, "wandb", "offline-run-*", "run-*.wandb"))
    records = _wandb_records(path)
    history = [_items(r.history.item) for r in records if r.WhichOneof("record_type") == "history"]
    points = [(h["_step"], h["return_mean"]) for h in history if "return_mean" in h]
    assert len(points) >= 2 and points == _returns(run_dir)
    # The learning curve, logged at the end as an image (its keys nested under its name).
    summaries = [_items(r.summary.update) for r in records
                 if r.WhichOneof("record_type") == "summary"]
    assert any(s.get("learning_curve/_type") == "image-file" for s in summaries)
    (config,) = [_items(r.config.update) for r in records
                 if r.WhichOneof("record_type") == "config"]
    assert config["command_line"]["agent"] == "ppo"
    assert config["experiment"]["total_env_steps"] == 8000


def test_a_resumed_run_continues_its_tracked_run(tmp_path):
    pytest.importorskip("mlflow", reason="the mlflow extra: pip install -e '.[mlflow]'")
    run_dir = str(tmp_path / "run")
    env = {"MLFLOW_TRACKING_URI": f"file:{tmp_path / 'mlruns'}",
           "MLFLOW_EXPERIMENT_NAME": "trellis-test"}
    first = _run(RUN + ARGS[:3] + ["--total_env_steps=6000", "--log_every_s=0.5", "--track=mlflow",
                                   f"--logdir={run_dir}"], env=env)
    assert first.returncode == 0, first.stderr
    ended = _returns(run_dir)[-1][0]
    second = _run(RUN + ["--total_env_steps=12000", "--track=mlflow", f"--resume={run_dir}"],
                  env=env)
    assert second.returncode == 0, second.stderr
    client, (run,) = _mlflow_runs(env["MLFLOW_TRACKING_URI"])  # One run, not a second.
    assert run.info.status == "FINISHED"
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "return_mean")]
    assert max(steps) > ended and max(steps) == _returns(run_dir)[-1][0]
    assert run.data.params["experiment.total_env_steps"] == "6000"  # MLflow keeps the first.


def test_a_tracker_not_installed_is_one_line_naming_its_extra(tmp_path):
    shadow = tmp_path / "mlflow"
    shadow.mkdir()
    (shadow / "__init__.py").write_text("raise ImportError('not installed here')\n")
    out = _run(RUN + ["--track=mlflow", f"--logdir={tmp_path / 'run'}"],
               env={"PYTHONPATH": str(tmp_path)}, timeout=300)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "run.py: error: --track=mlflow needs the mlflow package: pip install -e '.[mlflow]' "
        "(not installed here)"]
    assert not os.path.exists(tmp_path / "run")  # Refused before the run directory.


def test_an_unknown_tracker_is_refused():
    with pytest.raises(TrackingError, match="--track=tensorboard is not a tracker; they are: "
                       "wandb, mlflow"):
        backend("tensorboard")


@pytest.mark.slow
def test_a_sweep_tracks_each_trial_in_the_sweeps_group(tmp_path):
    pytest.importorskip("ray.tune")
    pytest.importorskip("mlflow", reason="the mlflow extra: pip install -e '.[mlflow]'")
    sweep_dir = tmp_path / "sweep"
    uri = f"file:{tmp_path / 'mlruns'}"
    out = _run([sys.executable, os.path.join(REPO, "launch", "tune.py"), "--agent=impala",
                "--num_actors=1", "--envs_per_actor=4", "--batch_size=4", "--unroll_length=8",
                "--log_every_s=0.5", "--total_env_steps=6000", "--num_trials=2",
                "--max_concurrent=2", "--search", "learning_rate=loguniform:1e-4:1e-2",
                "--track=mlflow", f"--logdir={sweep_dir}"],
               env={"MLFLOW_TRACKING_URI": uri, "MLFLOW_EXPERIMENT_NAME": "trellis-test"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    client, runs = _mlflow_runs(uri)
    trials = sorted(os.listdir(sweep_dir / "trials"))
    assert sorted(r.info.run_name for r in runs) == trials and len(trials) == 2
    for run in runs:
        assert run.data.tags["trellis.group"] == "sweep"
        history = client.get_metric_history(run.info.run_id, "return_mean")
        expected = _returns(str(sweep_dir / "trials" / run.info.run_name))
        assert expected and sorted((m.step, m.value) for m in history) == expected
    shadow = tmp_path / "shadow" / "mlflow"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('not installed here')\n")
    out = _run([sys.executable, os.path.join(REPO, "launch", "tune.py"), "--track=mlflow",
                "--search", "learning_rate=loguniform:1e-4:1e-2",
                f"--logdir={tmp_path / 'refused'}"], env={"PYTHONPATH": str(tmp_path / "shadow")})
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        "tune.py: error: --track=mlflow needs the mlflow package: pip install -e '.[mlflow]' "
        "(not installed here)"]
