"""R2D2 through launch/run.py: it learns CartPoleNoVel-v1 on local_mt, local_mp and ray, and
a run resumes from its checkpoint (slow: minutes each on 2 cores); anakin refuses it."""

import json
import os

import pytest

from tests.test_run import RANDOM_CARTPOLE_RETURN, run, summary

NOVEL = "--env=CartPoleNoVel-v1"


@pytest.mark.slow
@pytest.mark.parametrize("platform", ["local_mt", "local_mp", "ray"])
def test_r2d2_learns_without_velocities(platform, tmp_path):
    if platform == "ray":
        pytest.importorskip("ray")
    out = run(["--agent=r2d2", NOVEL, f"--platform={platform}", "--total_env_steps=100000",
               "--stop_at_return=none", f"--logdir={tmp_path}"], timeout=420)
    assert out.returncode == 0, out.stderr[-4000:]
    s = summary(tmp_path)
    assert s["stopped_by"] == "budget" and s["learner_steps"] > 100
    # Without velocities a memoryless policy stays near random; the LSTM must infer them.
    # (At 60k env steps three runs had 39, 81 and 90; at 100k one had 105 to 170.)
    assert s["mean_return"] > 2.5 * RANDOM_CARTPOLE_RETURN, s


@pytest.mark.slow
def test_r2d2_resumes_from_its_checkpoint(tmp_path):
    run_dir = str(tmp_path / "run")
    out = run(["--agent=r2d2", NOVEL, "--platform=local_mp", "--total_env_steps=80000",
               "--stop_at_return=none", f"--logdir={run_dir}"], timeout=300)
    assert out.returncode == 0, out.stderr[-4000:]
    first = summary(run_dir)
    out = run([f"--resume={run_dir}", "--platform=local_mt",
               f"--total_env_steps={first['env_steps'] + 20000}"], timeout=300)
    assert out.returncode == 0, out.stderr[-4000:]
    s = summary(run_dir)
    assert s["resumed_from_env_steps"] == first["env_steps"]
    assert s["learner_steps"] > first["learner_steps"] and s["episodes"] > first["episodes"]
    records = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    resumed = [r for r in records if r["resumes"] == 1]
    # The restored network acts well at once (the replay table starts empty, learning waits).
    assert resumed[0]["learner_steps"] >= first["learner_steps"]
    assert s["mean_return"] > 2.5 * RANDOM_CARTPOLE_RETURN, s


def test_anakin_refuses_a_recurrent_agent_in_one_line(tmp_path):
    pytest.importorskip("gymnax")  # Otherwise anakin refuses the env first.
    out = run(["--agent=r2d2", "--platform=anakin", "--env=gymnax:CartPole-v1",
               f"--logdir={tmp_path}"], timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "run.py: error: --platform=anakin runs feed-forward policies only; R2D2Builder's policy "
        "is recurrent (use --platform=local_mp for it)"]
