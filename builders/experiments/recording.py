"""Videos of episodes: which envs can be recorded (the env contract's `RecordedHostEnvFactory`
and `RenderedJaxEnvFactory`, envs/contract.py) and the writer, H.264 MP4 by imageio-ffmpeg
(the `video` extra), whose wheel carries its own ffmpeg.

The episodes are played by `evaluation.record_episode`, one file each; launch/evaluate.py's
--video and run.py's --video (at each evaluation, and of the final checkpoint) write them.
"""

from __future__ import annotations

import importlib
import types
import warnings
from collections.abc import Sequence

import gymnasium
import jax
import numpy as np

from trellis.envs.contract import (
    EnvFactory,
    RecordedHostEnvFactory,
    RenderedJaxEnvFactory,
    records_video,
)
from trellis.envs.errors import UnknownEnvError

# Frames per second of the videos: the envs' own pace differs (CartPole's 50, Atari's 60 frames
# of which each step shows one in four), and a video to watch needs none of them exactly.
VIDEO_FPS = 30
# H.264's macro blocks: frames are padded to sides divisible by it (black below and right),
# where imageio-ffmpeg would resize them, and say so on every video.
_BLOCK = 16


class RecordingError(ValueError):
    """An episode cannot be recorded: one line saying what would work."""


def _ffmpeg() -> types.ModuleType:
    try:
        return importlib.import_module("imageio_ffmpeg")
    except ImportError as e:
        raise RecordingError(f"--video needs imageio-ffmpeg: pip install -e '.[video]' ({e})"
                             ) from e


def first_frame(factory: EnvFactory) -> np.ndarray:
    """The picture of a fresh env of `factory`, which must render (`records_video`).

    Raises:
      UnknownEnvError: its family renders, this id does not (a gymnax id with no drawing).
      gymnasium.error.Error: a Gymnasium env without rgb_array rendering.
    """
    if isinstance(factory, RenderedJaxEnvFactory):
        state, _ = factory.make().reset(jax.random.key(0))
        return np.asarray(factory.render(state))
    assert isinstance(factory, RecordedHostEnvFactory), factory  # records_video said so.
    envs = factory.make_recorded(0)
    try:
        return np.asarray(envs.render()[0])
    finally:
        envs.close()


def check_recordable(factory: EnvFactory) -> None:
    """Raises RecordingError, in one line, when `factory`'s envs do not render (one is made
    and drawn) or the video extra is not installed: before a run starts, not after it
    trained."""
    if not records_video(factory):
        raise RecordingError(
            f"--video: the env {factory.env_id} does not render ({type(factory).__name__} has "
            "no make_recorded/render, envs/contract.py); these do: Gymnasium ids with rgb_array "
            "rendering, envpool's (Atari), minatar:*, gymnax's classic control and MinAtar, "
            "brax:* and playground:* (MuJoCo's renderer: MUJOCO_GL=egl without a display)")
    _ffmpeg()
    try:
        first_frame(factory)
    except (UnknownEnvError, gymnasium.error.Error) as e:
        raise RecordingError(f"--video: {e}") from e


def _padded(frame: np.ndarray) -> np.ndarray:
    height, width = frame.shape[:2]
    return np.pad(frame, ((0, -height % _BLOCK), (0, -width % _BLOCK), (0, 0)))


def write_video(path: str, frames: Sequence[np.ndarray], fps: int = VIDEO_FPS) -> None:
    """Writes uint8 [H, W, 3] `frames` to `path` as an H.264 MP4 (sides padded to _BLOCK).

    Raises:
      RecordingError: no frames, or the video extra is not installed.
    """
    if not frames:
        raise RecordingError(f"no frames to write to {path}")
    padded = [_padded(np.asarray(f, np.uint8)) for f in frames]
    height, width = padded[0].shape[:2]
    writer = _ffmpeg().write_frames(path, (width, height), fps=fps, codec="libx264",
                                    macro_block_size=_BLOCK)
    with warnings.catch_warnings():
        # JAX warns of any fork in its process; ffmpeg's is exec'd at once, no JAX thread needed.
        warnings.filterwarnings("ignore", "os.fork", RuntimeWarning)
        writer.send(None)  # Starts ffmpeg.
    try:
        for frame in padded:
            writer.send(np.ascontiguousarray(frame))
    finally:
        writer.close()
