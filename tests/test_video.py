"""Videos of every env family that renders (envs/contract.py's RecordedHostEnvFactory and
RenderedJaxEnvFactory, written by builders/experiments/recording.py), read back by ffmpeg:
envpool's Pong (the raw screen while the policy sees the pool's stacked frames), MinAtar on the
host and in gymnax, and a JAX env end to end (run.py --video on anakin, evaluate.py --video)."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from trellis.builders.experiments.evaluation import record_episode
from trellis.builders.experiments.recording import RecordingError, check_recordable
from trellis.envs import make_env_factory
from trellis.envs.contract import records_video

pytest.importorskip("imageio_ffmpeg", reason="the video extra: pip install -e '.[video]'")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _frames(path):
    """(frame count, (width, height)) of a video, read back by ffmpeg."""
    import imageio_ffmpeg

    frames, _ = imageio_ffmpeg.count_frames_and_secs(path)
    reader = imageio_ffmpeg.read_frames(path)
    size = next(reader)["size"]
    reader.close()
    return frames, size


class _RandomPolicy:
    """Uniform actions of `num_actions`; remembers the observation shapes it was given."""

    def __init__(self, num_actions):
        self.num_actions, self.shapes, self.calls = num_actions, set(), 0

    def __call__(self, params, key, obs, state, first):
        self.shapes.add(tuple(obs.shape))
        self.calls += 1
        return jax.random.randint(key, (obs.shape[0],), 0, self.num_actions), {}, state


def _record(env_id, num_actions, path):
    factory = make_env_factory(env_id)
    policy = _RandomPolicy(num_actions)
    total = record_episode(policy, None, lambda n: {}, factory, 0, jax.random.key(0), path)
    return total, policy


def test_pong_records_the_screen_while_the_policy_sees_stacked_grey_frames(tmp_path):
    pytest.importorskip("envpool", reason="the envpool extra: pip install -e '.[envpool]'")
    path = str(tmp_path / "pong.mp4")
    total, policy = _record("envpool:Pong-v5", 6, path)
    assert policy.shapes == {(1, 4, 84, 84)}  # The pool's preprocessing, as in training.
    assert -21 <= total <= 21
    # The 210x160 RGB screen (padded to 224 rows for H.264), a frame at the start and per step.
    assert _frames(path) == (policy.calls + 1, (160, 224))


@pytest.mark.parametrize("env_id", ["minatar:Breakout", "gymnax:Breakout-MinAtar"])
def test_minatar_games_are_drawn_from_their_planes(env_id, tmp_path):
    if env_id.startswith("minatar"):
        pytest.importorskip("minatar", reason="the minatar extra: pip install -e '.[minatar]'")
    path = str(tmp_path / "breakout.mp4")
    _, policy = _record(env_id, 3, path)
    assert policy.shapes == {(1, 10, 10, 4)}
    assert _frames(path) == (policy.calls + 1, (160, 160))  # 10x10 cells of 16 pixels.


@pytest.mark.parametrize("env_id,renders", [
    ("CartPole-v1", True), ("envpool:Pong-v5", True), ("minatar:Breakout", True),
    ("gymnax:CartPole-v1", True), ("brax:inverted_pendulum", True),
    ("playground:CartpoleBalance", True), ("pettingzoo:mpe2/simple_spread_v3", False),
    ("jaxmarl:MPE_simple_spread_v3", False), ("pgx:tic_tac_toe", False)])
def test_each_family_declares_whether_it_renders(env_id, renders):
    assert records_video(make_env_factory(env_id)) is renders


def test_what_does_not_render_is_refused_before_a_run():
    unrendered = make_env_factory("gymnax:Catch-bsuite")  # A gymnax id with no drawing.
    with pytest.raises(RecordingError, match="--video: gymnax:Catch-bsuite has no renderer "
                       "here; gymnax ids that render: gymnax:CartPole-v1, "):
        check_recordable(unrendered)
    with pytest.raises(RecordingError, match="the env pettingzoo:mpe2/simple_spread_v3 does "
                       "not render"):
        check_recordable(make_env_factory("pettingzoo:mpe2/simple_spread_v3"))


# Slow: 34 s of the default suite; the host video tests stay in it.
@pytest.mark.slow
def test_a_jax_env_run_on_anakin_records_its_final_policy(tmp_path):
    run_dir = str(tmp_path / "run")
    out = subprocess.run(
        [sys.executable, os.path.join(REPO, "launch", "run.py"), "--agent=ppo",
         "--platform=anakin", "--env=gymnax:CartPole-v1", "--total_env_steps=20000",
         "--stop_at_return=none", "--video", f"--logdir={run_dir}"],
        capture_output=True, text=True, timeout=600, cwd=REPO)
    assert out.returncode == 0, out.stderr
    (name,) = os.listdir(os.path.join(run_dir, "videos"))  # anakin has no evaluator node.
    frames, size = _frames(os.path.join(run_dir, "videos", name))
    assert frames >= 9 and size == (608, 400)
    out = subprocess.run(
        [sys.executable, os.path.join(REPO, "launch", "evaluate.py"), run_dir, "--episodes=1",
         f"--video={tmp_path / 'eval'}"], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.splitlines()[-1])
    path = str(tmp_path / "eval" / f"step-{result['checkpoint_env_steps']}-episode-0.mp4")
    # CartPole's return is its length: a frame for the start and one per step.
    assert _frames(path) == (int(result["return_mean"]) + 1, (608, 400))
    assert np.isfinite(result["return_mean"])


# Compiling Brax's and MJX's physics takes minutes on a busy 2-core machine.
@pytest.mark.slow
@pytest.mark.parametrize("env_id", ["brax:inverted_pendulum", "playground:CartpoleBalance"])
def test_physics_envs_are_drawn_by_mujoco(env_id, tmp_path):
    """In a process of its own: MuJoCo reads MUJOCO_GL when it is imported."""
    pytest.importorskip("brax" if env_id.startswith("brax") else "mujoco_playground")
    video = str(tmp_path / "v.mp4")
    script = f"""
import dataclasses, jax, imageio_ffmpeg
from trellis.builders.experiments.evaluation import record_episode
from trellis.builders.experiments.recording import check_recordable
from trellis.envs import make_env_factory
from trellis.envs.brax_envs import EpisodeLimit
factory = make_env_factory({env_id!r})
check_recordable(factory)
env = dataclasses.replace(factory.make(), params=EpisodeLimit(20))
def still(params, key, obs, state, first):
    return jax.numpy.zeros((obs.shape[0], factory.spec().action_shape[0])), {{}}, state
record_episode(still, None, lambda n: {{}}, factory, 0, jax.random.key(0), {video!r}, jax_env=env)
reader = imageio_ffmpeg.read_frames({video!r})
print(imageio_ffmpeg.count_frames_and_secs({video!r})[0], next(reader)["size"])
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=900, cwd=REPO, env={**os.environ, "MUJOCO_GL": "egl"})
    assert out.returncode == 0, out.stderr[-3000:]
    frames, size = out.stdout.split(maxsplit=1)
    # At most 20 steps (a pendulum that falls ends sooner) and the first frame; MuJoCo's
    # 320x240 picture.
    assert 2 <= int(frames) <= 21 and size.strip() == "(320, 240)"
