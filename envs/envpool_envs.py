"""envpool as an env backend: "envpool:TASK" (e.g. envpool:Pong-v5, envpool:HalfCheetah-v4,
envpool:CartPole-v1) steps a batch of envpool's C++ envs in an env worker, in place of a
Gymnasium vector env. Optional: pip install -e '.[envpool]'.

`EnvpoolFactory.make_vector` gives the env worker what it relies on from a Gymnasium vector
env: `reset(seed=...)`, `step(actions) -> (obs, reward, terminated, truncated, info)`, the
single-env spaces, and next-step autoreset (the step after an episode's end returns the next
episode's first observation with reward 0, its action ignored), so that no transition crosses
an episode boundary. Where envpool differs, this module adapts:

- Atari: by default envpool reports `terminated` at each lost life without resetting the game
  (`episodic_life`) and clips rewards to their sign; the worker would then start an episode
  inside a game and report clipped returns. Both are off here: an episode is a game, as with
  Gymnasium's ALE ids, and clipping is the learner's business (the agents' `reward_clip`), so
  reported returns are the game's score. `options` (envs/atari.py's settings: frame skip,
  stack, size, no-ops, sticky actions, full action space, episodic life) change the rest;
  with episodic life on, a lost life ends an episode as the worker sees it, the game's reset
  follows only its last life, and the step's info says where a game ended (`GAME_OVER`), so
  the worker still reports returns per game.
- envpool seeds its envs when the pool is built, not at reset: `make_vector(num_envs, seed)`
  builds it with the worker's seed.
- Each step checks that the envs that reset (envpool's `elapsed_step` is 0 after a reset) are
  exactly those that ended at the step before; any other reset would join two episodes in
  one unroll, so it raises instead.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import sys
import types
from collections.abc import Iterator
from typing import Any

import numpy as np

from trellis.envs.contract import Players
from trellis.envs.errors import UnknownEnvError
from trellis.envs.specs import GAME_OVER, EnvSpec, spec_from_spaces

PREFIX = "envpool:"
# Atari options that change what an episode and a reward are (see the module docstring).
_GAME_EPISODES = {"episodic_life": False, "reward_clip": False}


@contextlib.contextmanager
def _jax_hidden_unless_imported() -> Iterator[None]:
    """Makes `import jax` fail inside, in a process that has not imported JAX. envpool's env
    classes import JAX when envpool is imported, for an XLA interface that Trellis does not
    use (they fall back without it); an env worker process, which never imports JAX otherwise
    (tests/test_layers.py), would pay 0.4-0.6 s of CPU at start for it. A process with JAX
    imported (the learner's, the launcher's) is left as it is. (None in `sys.modules` is
    Python's marker for a module that cannot be imported.)"""
    if "jax" in sys.modules:
        yield
        return
    sys.modules["jax"] = None  # type: ignore[assignment]
    try:
        yield
    finally:
        del sys.modules["jax"]


def _envpool() -> types.ModuleType:
    try:
        with _jax_hidden_unless_imported():
            import envpool
    except ImportError as e:
        raise UnknownEnvError(
            "envpool ids need the envpool package: pip install -e '.[envpool]'") from e
    return envpool


@functools.cache
def task_settings(task: str) -> tuple[str, ...]:
    """The keyword arguments envpool's `task` takes (its config's fields), read once per
    process: each read builds the task's spec (0.08 s for an Atari game)."""
    return tuple(_envpool().make_spec(task).config._fields)


class EnvpoolVector:
    """A batch of envpool envs seen as a Gymnasium vector env with next-step autoreset.

    Args:
      pool: an envpool env made with env_type="gymnasium".
      episodic_life: the pool reports `terminated` at each lost life (Atari's
        `episodic_life`); only the game's end (envpool's `info["terminated"]`) resets it.
    """

    def __init__(self, pool: Any, episodic_life: bool = False) -> None:
        self._pool = pool
        self._episodic_life = episodic_life
        self.num_envs = int(pool.config["num_envs"])
        self.single_observation_space = pool.observation_space
        self.single_action_space = pool.action_space
        self._action_dtype = np.dtype(pool.action_space.dtype)
        self._ended: np.ndarray | None = None  # Which envs ended at the last step.

    def reset(self, seed: int | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        """Resets every env; the pool was seeded when built, so `seed` is not used here."""
        obs, info = self._pool.reset()
        self._ended = np.zeros(self.num_envs, bool)
        return obs, info

    def step(self, actions: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Steps every env; an env that ended at the previous step is reset instead. The
        info's `GAME_OVER` says where a game ended (with episodic life, not at a lost life).

        Raises:
          RuntimeError: an env reset without having ended, or did not reset after ending.
        """
        if self._ended is None:
            raise RuntimeError("step() before reset()")
        obs, reward, terminated, truncated, info = self._pool.step(
            np.asarray(actions, self._action_dtype))
        reset = np.asarray(info["elapsed_step"]) == 0
        if not np.array_equal(reset, self._ended):
            raise RuntimeError(
                f"envpool reset envs {np.flatnonzero(reset).tolist()} after envs "
                f"{np.flatnonzero(self._ended).tolist()} ended: an episode boundary the env "
                f"worker would not see")
        game_over = np.asarray(info["terminated"], bool) if self._episodic_life else terminated
        self._ended = game_over | truncated
        info[GAME_OVER] = game_over
        return obs, reward, terminated, truncated, info

    def render(self) -> np.ndarray:
        """The envs' pictures now, uint8 [N, H, W, 3] (a pool made with
        render_mode="rgb_array")."""
        frames: np.ndarray = self._pool.render(env_ids=np.arange(self.num_envs))
        return frames

    def close(self) -> None:
        self._pool.close()


@dataclasses.dataclass(frozen=True)
class EnvpoolFactory:
    """Builds batches of envpool envs for one "envpool:TASK" id.

    Attributes:
      env_id: "envpool:" and an envpool task id, e.g. "envpool:Pong-v5".
    """

    env_id: str
    options: tuple[tuple[str, Any], ...] = ()  # envpool's own keyword arguments (Atari's).

    jax_native = False  # Stepped by env workers on the host.
    players = Players.SINGLE_AGENT

    @property
    def task(self) -> str:
        return self.env_id[len(PREFIX):]

    def validate(self) -> None:
        """Raises UnknownEnvError when envpool is missing or does not know the task."""
        tasks = _envpool().list_all_envs()
        if self.task not in tasks:
            raise UnknownEnvError(f"unknown env {self.env_id!r}: envpool has no task "
                                  f"{self.task!r} (envpool.list_all_envs() lists them)")

    def _kwargs(self) -> dict[str, Any]:
        """envpool's keyword arguments for the task: the game-episode settings it knows, then
        `options`.

        Raises:
          UnknownEnvError: an unknown task, or an option the task does not have.
        """
        self.validate()
        known = task_settings(self.task)
        kwargs = {k: v for k, v in _GAME_EPISODES.items() if k in known}
        unknown = sorted(k for k, _ in self.options if k not in known)
        if unknown:
            raise UnknownEnvError(f"{self.env_id}: envpool's task has no option {unknown[0]!r} "
                                  f"(the Atari settings are for Atari tasks)")
        kwargs.update(self.options)
        return kwargs

    def make_vector(self, num_envs: int, seed: int, **render: Any) -> EnvpoolVector:
        """`num_envs` envs of the task in one pool seeded with `seed`, reset; `render`:
        envpool's rendering arguments (`make_recorded`'s)."""
        kwargs = self._kwargs()
        envs = EnvpoolVector(_envpool().make(self.task, env_type="gymnasium",
                                             num_envs=num_envs, seed=seed, **kwargs, **render),
                             episodic_life=bool(kwargs.get("episodic_life")))
        envs.reset()
        return envs

    def make_recorded(self, seed: int) -> EnvpoolVector:
        """A pool of one env, as `make_vector` makes it (the policy sees the task's own
        preprocessing: Atari's stacked grey frames), rendering rgb arrays: Atari's raw screen
        (the env contract's `RecordedHostEnvFactory`)."""
        return self.make_vector(1, seed, render_mode="rgb_array")

    def reward_threshold(self) -> float | None:
        """The task's reward_threshold where envpool gives one (classic control)."""
        config = _envpool().make_spec(self.task).config
        return getattr(config, "reward_threshold", None)

    def spec(self) -> EnvSpec:
        """From envpool's spec of the task with these settings, whose spaces are the pool's
        (no env is made), found once: the factory keeps it, and so takes it along when it is
        pickled to the node processes, which then need not import envpool to ask (the
        learner only asks; docs/benchmarks.md)."""
        if "_spec" not in self.__dict__:
            spec = _envpool().make_spec(self.task, **self._kwargs())
            object.__setattr__(self, "_spec", spec_from_spaces(
                spec.gymnasium_observation_space, spec.gymnasium_action_space))
        found: EnvSpec = self.__dict__["_spec"]
        return found
