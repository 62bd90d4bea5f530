"""MinAtar (Young & Tian, 2019) on the host: "minatar:GAME" (minatar:Breakout, minatar:Asterix,
minatar:Freeway, minatar:Seaquest, minatar:SpaceInvaders) steps a batch of the `minatar`
package's games in an env worker. Optional: pip install -e '.[minatar]'. The same games in JAX,
for --platform=anakin, are gymnax's "gymnax:Breakout-MinAtar" and so on (envs/gymnax_envs.py).

The games are played as in the MinAtar paper, whose published returns docs/benchmarks.md
compares with: all 6 actions (gymnax's versions keep the minimal set), sticky actions with
probability 0.1 and difficulty ramping, the package's defaults. The observation is the game's
10x10xC grid of 0/1 planes as uint8 (pixel torsos see it as frames; agents/common/torsos.py's
`minatar` torso is the paper's network, which takes the planes unscaled).

`MinatarVector` gives the env worker what it relies on from a Gymnasium vector env: next-step
autoreset (the step after an episode's end returns the next episode's first observation with
reward 0, its action ignored), and `terminated` (the game ended) kept apart from `truncated`
(the episode reached `max_episode_steps`). The paper's episodes have no step limit; the limit
here only keeps an agent that never loses from playing one episode for ever.
"""

from __future__ import annotations

import dataclasses
import sys
import types
from typing import Any

import gymnasium as gym
import numpy as np

from trellis.envs.contract import Players
from trellis.envs.errors import UnknownEnvError
from trellis.envs.specs import EnvSpec, vector_spec

PREFIX = "minatar:"
# The id's game name: the module of minatar.environments that plays it.
GAMES = {"Asterix": "asterix", "Breakout": "breakout", "Freeway": "freeway",
         "Seaquest": "seaquest", "SpaceInvaders": "space_invaders"}
# What minatar's package imports at its top only to draw a game: seaborn and pyplot take about
# 1.9 s of each env worker's start, and Trellis never draws a MinAtar game.
_DRAWING_ONLY = ("seaborn", "matplotlib.pyplot")


# A colour per plane (the later plane drawn over the earlier where both are set), on black.
_PALETTE = np.array([(230, 80, 60), (250, 200, 60), (90, 200, 90), (70, 150, 240),
                     (200, 110, 220), (240, 240, 240), (120, 220, 220), (250, 140, 40),
                     (160, 160, 160), (180, 230, 90)], np.uint8)


def planes_frame(planes: np.ndarray, scale: int = 16) -> np.ndarray:
    """A MinAtar observation, [10, 10, C] planes of 0/1, as a picture: uint8 [10 x scale,
    10 x scale, 3], each set cell in its plane's colour (the package's own display needs
    pyplot and seaborn)."""
    planes = np.asarray(planes) > 0
    frame = np.zeros(planes.shape[:2] + (3,), np.uint8)
    for channel in range(planes.shape[-1]):
        frame[planes[..., channel]] = _PALETTE[channel % len(_PALETTE)]
    return np.repeat(np.repeat(frame, scale, axis=0), scale, axis=1)


def _minatar() -> Any:
    stand_ins = {name: types.ModuleType(name) for name in _DRAWING_ONLY
                 if name not in sys.modules}
    sys.modules.update(stand_ins)
    try:
        import minatar
    except ImportError as e:
        raise UnknownEnvError(
            "minatar ids need the minatar package: pip install -e '.[minatar]'") from e
    finally:
        for name, module in stand_ins.items():
            if sys.modules.get(name) is module:
                del sys.modules[name]
    return minatar


class MinatarVector:
    """`num_envs` MinAtar games seen as a Gymnasium vector env with next-step autoreset.

    Args:
      game: a module name of minatar.environments, e.g. "breakout".
      num_envs: the number of games.
      sticky_action_prob: the chance that a game repeats its previous action instead.
      difficulty_ramping: whether the games that speed up over an episode do.
      max_episode_steps: episodes that reach it are truncated.
    """

    def __init__(self, game: str, num_envs: int, sticky_action_prob: float,
                 difficulty_ramping: bool, max_episode_steps: int):
        environment = _minatar().Environment
        self._games = [environment(game, sticky_action_prob=sticky_action_prob,
                                   difficulty_ramping=difficulty_ramping)
                       for _ in range(num_envs)]
        self.num_envs = num_envs
        shape = tuple(int(d) for d in self._games[0].state_shape())
        self.single_observation_space = gym.spaces.Box(0, 1, shape, np.uint8)
        self.single_action_space: gym.spaces.Discrete[np.int64] = gym.spaces.Discrete(
            self._games[0].num_actions())
        self._max_steps = max_episode_steps
        self._obs = np.zeros((num_envs,) + shape, np.uint8)
        self._steps = np.zeros(num_envs, np.int64)  # Steps into each game's episode.
        self._ended: np.ndarray | None = None  # Which games ended at the last step.

    def reset(self, seed: int | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        """Starts every game; with `seed`, each game's random stream (its start states and
        sticky actions) is seeded from it first."""
        if seed is not None:
            for game, game_seed in zip(self._games, np.random.SeedSequence(seed).generate_state(
                    self.num_envs), strict=True):
                game.seed(int(game_seed))
        for i, game in enumerate(self._games):
            game.reset()
            self._obs[i] = game.state()
        self._steps[:] = 0
        self._ended = np.zeros(self.num_envs, bool)
        return self._obs.copy(), {}

    def step(self, actions: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Plays one action in every game; a game that ended at the previous step starts its
        next episode instead (reward 0, not terminated, the action ignored)."""
        if self._ended is None:
            raise RuntimeError("step() before reset()")
        reward = np.zeros(self.num_envs, np.float32)
        terminated = np.zeros(self.num_envs, bool)
        for i, game in enumerate(self._games):
            if self._ended[i]:
                game.reset()
                self._steps[i] = 0
            else:
                reward[i], terminated[i] = game.act(int(actions[i]))
                self._steps[i] += 1
            self._obs[i] = game.state()
        truncated = ~terminated & (self._steps >= self._max_steps)
        self._ended = terminated | truncated
        return self._obs.copy(), reward, terminated, truncated, {}

    def render(self) -> tuple[np.ndarray, ...]:
        """Each game's picture now (`planes_frame` of its observation)."""
        return tuple(planes_frame(obs) for obs in self._obs)

    def close(self) -> None:
        pass


@dataclasses.dataclass(frozen=True)
class MinatarFactory:
    """Builds batches of MinAtar games for one "minatar:GAME" id.

    Attributes:
      env_id: "minatar:" and a game, e.g. "minatar:Breakout".
      sticky_action_prob: 0.1, the paper's and the package's.
      difficulty_ramping: True, the paper's and the package's.
      max_episode_steps: the truncation limit (the paper has none; see the module docstring).
    """

    env_id: str
    sticky_action_prob: float = 0.1
    difficulty_ramping: bool = True
    max_episode_steps: int = 100_000

    jax_native = False  # Stepped by env workers on the host.
    players = Players.SINGLE_AGENT

    @property
    def game(self) -> str:
        """The game's module name in minatar.environments, e.g. "breakout"."""
        name = self.env_id[len(PREFIX):]
        if name not in GAMES:
            raise UnknownEnvError(f"unknown env {self.env_id!r}: MinAtar's games are "
                                  f"{', '.join(PREFIX + g for g in GAMES)}")
        return GAMES[name]

    def validate(self) -> None:
        """Raises UnknownEnvError for a game MinAtar does not have, or without minatar."""
        _ = self.game
        _minatar()

    def make_vector(self, num_envs: int, seed: int) -> MinatarVector:
        """`num_envs` games seeded from `seed`, reset."""
        envs = MinatarVector(self.game, num_envs, self.sticky_action_prob,
                             self.difficulty_ramping, self.max_episode_steps)
        envs.reset(seed=seed)
        return envs

    def make_recorded(self, seed: int) -> MinatarVector:
        """One game as `make_vector` makes it, whose `render()` draws its planes (the env
        contract's `RecordedHostEnvFactory`)."""
        return self.make_vector(1, seed)

    def reward_threshold(self) -> float | None:
        """None: MinAtar sets no return that solves a game (docs/benchmarks.md names the
        published returns)."""
        return None

    def spec(self) -> EnvSpec:
        return vector_spec(self)
