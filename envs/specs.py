"""Env specs: what learners and inference need to know about observations and actions."""

from __future__ import annotations

import dataclasses
from typing import Any

import gymnasium as gym
import numpy as np

# A vector env's info key, where a game's end is not its `terminated`: with episodic life an
# Atari game terminates an episode at each lost life (what the agent learns from), and the game,
# whose score runs report, ends with the last one. The env worker counts returns per game.
GAME_OVER = "game_over"


@dataclasses.dataclass(frozen=True)
class EnvSpec:
    """Shapes and dtypes of one (unbatched) environment.

    Attributes:
      observation_shape: shape of one observation, e.g. (4,) or (84, 84, 4).
      observation_dtype: numpy dtype name of observations, e.g. "float32" or "uint8".
      num_actions: number of discrete actions, or None for continuous actions.
      action_shape: shape of one action: () for discrete, (d,) for continuous.
      action_low / action_high: bounds of continuous actions (None for discrete).
    """

    observation_shape: tuple[int, ...]
    observation_dtype: str
    num_actions: int | None
    action_shape: tuple[int, ...]
    action_dtype: str
    action_low: tuple[float, ...] | None = None
    action_high: tuple[float, ...] | None = None

    @property
    def discrete(self) -> bool:
        return self.num_actions is not None

    @property
    def pixels(self) -> bool:
        """Image-like observations (rank 3, e.g. [H, W, C]) get a conv torso."""
        return len(self.observation_shape) == 3

    def zeros_observation(self, batch: tuple[int, ...] = ()) -> np.ndarray:
        return np.zeros(batch + self.observation_shape, self.observation_dtype)


def spec_from_spaces(observation_space: gym.Space[Any], action_space: gym.Space[Any]
                     ) -> EnvSpec:
    """Builds an EnvSpec from the single-env Gymnasium spaces.

    Raises:
      TypeError: for spaces Trellis does not handle (only Box observations, Discrete or
        Box actions).
    """
    if not isinstance(observation_space, gym.spaces.Box):
        raise TypeError(
            f"Trellis needs Box observations, got {observation_space!r}; wrap the env "
            "(e.g. gymnasium.wrappers.FlattenObservation) to get one."
        )
    obs_shape = tuple(int(d) for d in observation_space.shape)
    obs_dtype = np.dtype(observation_space.dtype).name
    if isinstance(action_space, gym.spaces.Discrete):
        return EnvSpec(obs_shape, obs_dtype, int(action_space.n), (), "int32")
    if isinstance(action_space, gym.spaces.Box):
        return EnvSpec(
            obs_shape,
            obs_dtype,
            None,
            tuple(int(d) for d in action_space.shape),
            "float32",
            tuple(float(x) for x in np.ravel(action_space.low)),
            tuple(float(x) for x in np.ravel(action_space.high)),
        )
    raise TypeError(f"Trellis handles Discrete or Box actions, got {action_space!r}.")


def vector_spec(factory: Any) -> EnvSpec:
    """The spec of one env as env workers see it: from the single-env spaces of a batch of
    one made by `factory.make_vector` (which may preprocess, e.g. ALE's stacked grey frames)."""
    envs = factory.make_vector(1, seed=0)
    try:
        return spec_from_spaces(envs.single_observation_space, envs.single_action_space)
    finally:
        envs.close()
