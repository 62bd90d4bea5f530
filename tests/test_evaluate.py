"""A run's member restored for evaluation (builders/experiments/restore.py): the video path
plays in the run's own env (its kwargs and wrappers), and refuses envs it cannot record."""

import importlib.util

import gymnasium as gym
import numpy as np
import pytest

from trellis.builders.experiments.restore import PolicyMember, RestoreError
from trellis.envs import GymnasiumFactory, make_env_factory


def _push_left(params, key, obs, state, first):
    """A policy that always pushes the cart left: CartPole falls within ~10 steps."""
    del params, key, first
    return np.zeros(obs.shape[0], np.int64), {}, state


def _member(factory, jax_env=None):
    return PolicyMember(_push_left, lambda num_slots: {}, None, 100, {"learner_steps": 3},
                        factory, jax_env, {"member": 0})


def test_videos_are_recorded_in_the_runs_env_with_its_kwargs(monkeypatch, tmp_path):
    made = []

    def record_video(env, video_dir, **kwargs):  # Stands in for moviepy's writer.
        made.append((env.render_mode, env.spec.max_episode_steps, video_dir))
        return env

    monkeypatch.setattr(gym.wrappers, "RecordVideo", record_video)
    factory = GymnasiumFactory("CartPole-v1", kwargs=(("max_episode_steps", 5),))
    result = _member(factory).record(3, seed=0, video_dir=str(tmp_path))
    assert made == [("rgb_array", 5, str(tmp_path))]
    # Episodes cut at 5 steps by the kwargs: a return of 1 per step.
    assert result["episodes"] == 3 and result["return_max"] <= 5.0
    assert result["member"] == 0


def test_a_jax_env_is_not_recorded_in_one_line():
    factory = make_env_factory("gymnax:CartPole-v1")
    with pytest.raises(RestoreError, match="--video records Gymnasium envs; this run's env "
                       "gymnax:CartPole-v1 is not one"):
        _member(factory, jax_env=factory.make()).record(1, seed=0, video_dir="unused")


def test_without_moviepy_the_video_path_says_what_to_install(tmp_path):
    if importlib.util.find_spec("moviepy") is not None:
        pytest.skip("moviepy is installed here")
    with pytest.raises(RestoreError, match="--video needs moviepy: pip install moviepy"):
        _member(GymnasiumFactory("CartPole-v1")).record(1, seed=0, video_dir=str(tmp_path))
