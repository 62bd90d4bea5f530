"""A run's member restored for evaluation (builders/experiments/restore.py): the video path
plays in the run's own env (its kwargs and wrappers), host or JAX, and refuses envs that do not
render in one line; a damaged newest checkpoint is passed over, as --resume does."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import trellis
from tests.checkpoints import truncate_state
from trellis.builders.experiments.checkpointing import CORRUPT_SUBDIR
from trellis.builders.experiments.restore import PolicyMember, RestoreError
from trellis.envs import GymnasiumFactory, make_env_factory

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _push_left(params, key, obs, state, first):
    """A policy that always pushes the cart left: CartPole falls within ~10 steps."""
    del params, key, first
    return np.zeros(obs.shape[0], np.int64), {}, state


def _member(factory, jax_env=None):
    return PolicyMember(_push_left, lambda num_slots: {}, None, 100, {"learner_steps": 3},
                        factory, jax_env, {"member": 0})


def _frames(path):
    """(frame count, (width, height)) of a video, read back by ffmpeg."""
    imageio_ffmpeg = pytest.importorskip("imageio_ffmpeg")
    frames, _ = imageio_ffmpeg.count_frames_and_secs(path)
    reader = imageio_ffmpeg.read_frames(path)
    size = next(reader)["size"]
    reader.close()
    return frames, size


def test_videos_are_recorded_in_the_runs_env_with_its_kwargs(tmp_path):
    pytest.importorskip("imageio_ffmpeg")
    factory = GymnasiumFactory("CartPole-v1", kwargs=(("max_episode_steps", 5),))
    result = _member(factory).record(3, seed=0, video_dir=str(tmp_path))
    # Episodes cut at 5 steps by the kwargs: a return of 1 per step.
    assert result["episodes"] == 3 and result["return_max"] == 5.0
    assert result["member"] == 0
    assert sorted(os.listdir(tmp_path)) == [f"step-100-episode-{i}.mp4" for i in range(3)]
    # The first frame and one per step; CartPole's 600x400 padded to H.264's 16-pixel blocks.
    assert _frames(str(tmp_path / "step-100-episode-0.mp4")) == (6, (608, 400))


def test_a_jax_env_is_recorded_from_its_states(tmp_path):
    pytest.importorskip("imageio_ffmpeg")
    factory = make_env_factory("gymnax:CartPole-v1")
    result = _member(factory, jax_env=factory.make()).record(1, seed=0, video_dir=str(tmp_path))
    steps = int(result["return_mean"])  # 1 per step; pushed left all along, the pole falls.
    assert 5 <= steps <= 30
    # Gymnasium's CartPole drawing of each state, the first one's too.
    assert _frames(str(tmp_path / "step-100-episode-0.mp4")) == (steps + 1, (608, 400))


def test_an_env_that_does_not_render_is_refused_in_one_line():
    factory = make_env_factory("pettingzoo:mpe2/simple_spread_v3")
    with pytest.raises(RestoreError, match="--video: the env pettingzoo:mpe2/simple_spread_v3 "
                       "does not render"):
        _member(factory).record(1, seed=0, video_dir="unused")


def test_without_imageio_ffmpeg_the_video_path_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "imageio_ffmpeg", None)  # `import` then raises.
    with pytest.raises(RestoreError, match=r"--video needs imageio-ffmpeg: pip install -e "
                       r"'\.\[video\]'"):
        _member(GymnasiumFactory("CartPole-v1")).record(1, seed=0, video_dir=str(tmp_path))


def test_evaluate_and_load_pass_over_a_damaged_newest_checkpoint(tmp_path, capfd):
    """A short real run, its newest checkpoint truncated: evaluate.py and `trellis.load` use
    the one before, say so in one warning line, and leave the damaged one where it is (a
    reader moves nothing; --resume sets it aside)."""
    run_dir = str(tmp_path / "run")
    out = subprocess.run([sys.executable, os.path.join(REPO, "launch", "run.py"),
                          "--platform=local_mt", "--total_env_steps=20000",
                          "--stop_at_return=none", "--eval_every=0", "--checkpoint_every_s=1",
                          "--quiet", f"--logdir={run_dir}"],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-4000:]
    directory = os.path.join(run_dir, "checkpoints")
    steps = sorted(int(name) for name in os.listdir(directory) if name.isdigit())
    assert len(steps) >= 2, steps
    truncate_state(os.path.join(directory, str(steps[-1])))

    out = subprocess.run([sys.executable, os.path.join(REPO, "launch", "evaluate.py"), run_dir,
                          "--episodes=2"], cwd=REPO, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-4000:]
    assert json.loads(out.stdout.splitlines()[-1])["checkpoint_env_steps"] == steps[-2]
    warnings = [line for line in out.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "Traceback" not in out.stderr, out.stderr[-4000:]
    assert (f"checkpoint {steps[-1]} cannot be read" in warnings[0]
            and f"using checkpoint {steps[-2]}" in warnings[0]), warnings[0]

    capfd.readouterr()
    assert trellis.load(run_dir).step == steps[-2]
    err = capfd.readouterr().err
    assert [line for line in err.splitlines() if "warning" in line] == warnings, err
    # Both read past it in place.
    steps_now = sorted(int(name) for name in os.listdir(directory) if name.isdigit())
    assert steps_now == steps and not os.path.exists(os.path.join(run_dir, CORRUPT_SUBDIR))
