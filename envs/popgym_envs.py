"""POPGym's partially observable envs through the env factory: "popgym-ID" (e.g.
popgym-RepeatPreviousEasy-v0, popgym-PositionOnlyCartPoleEasy-v0) is a Gymnasium id that
`import popgym` registers. Optional: pip install -e '.[popgym]'.

Env workers and networks take Box observations, so `adapt` gives the card and grid games'
Discrete, MultiDiscrete and Tuple observations as their one-hot codes, concatenated, in
float32 (a card's suit becomes 4 numbers, not an index a network would read as a magnitude).
Actions are not adapted: the ids with MultiDiscrete actions (Battleship, MineSweeper) raise
UnknownEnvError.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from trellis.envs.errors import UnknownEnvError

PREFIX = "popgym-"


def adapt(env: gym.Env[Any, Any]) -> gym.Env[Any, Any]:
    """`env` with Box float32 observations.

    Raises:
      UnknownEnvError: its actions are neither Discrete nor Box.
    """
    if not isinstance(env.action_space, gym.spaces.Discrete | gym.spaces.Box):
        name = env.spec.id if env.spec is not None else env
        raise UnknownEnvError(
            f"env {name!r} has {env.action_space} actions; Trellis handles Discrete or "
            "Box actions")
    if isinstance(env.observation_space, gym.spaces.Box):
        return env
    return gym.wrappers.DtypeObservation(gym.wrappers.FlattenObservation(env), np.float32)
