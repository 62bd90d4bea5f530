"""The env contract: what every env factory is and gives, declared rather than probed.

An env factory is a small, frozen, picklable object that names one env (`env_id`) and builds
its envs where they run: in an env worker process (a host factory: a batch of envs stepped by
numpy, `make_vector`) or inside the jitted program of the anakin platform (a JAX factory:
pure functions, `make`). Every factory says which of the two it is (`jax_native`) and who acts
in its envs (`players`): one agent, several agents at each step (envs/multi_agent.py), or two
players taking turns in a board game (envs/pgx_envs.py, for self-play agents). The experiment
layer reads these declarations to choose an execution and to refuse an agent that does not
fit the env, in one line, before anything starts.

`EnvFactory` is what the experiment layer needs of every factory; `HostEnvFactory` and
`JaxEnvFactory` add what only that kind has, and `is_host` / `is_jax` narrow a factory to its
kind from its declaration. Rendering is a capability of either kind (`RecordedHostEnvFactory`,
`RenderedJaxEnvFactory`): a factory that has it can be watched as a video. A factory of one's
own need not inherit from anything: it has the members (tests/test_env_contract.py checks
Trellis's with `isinstance`, mypy checks them through `envs/registry.py`), and
`envs.registry.register` makes its ids reachable from `--env`.

Nothing heavy here: env workers import this module, and they must not load JAX.
"""

from __future__ import annotations

import enum
from typing import Any, Protocol, TypeGuard, runtime_checkable

from trellis.envs.multi_agent import MultiAgentSpec
from trellis.envs.specs import EnvSpec


class Players(enum.Enum):
    """Who acts in an env."""

    SINGLE_AGENT = "single_agent"  # One agent; the spec is an EnvSpec.
    MULTI_AGENT = "multi_agent"  # Several agents each step; the spec is a MultiAgentSpec.
    TWO_PLAYER_GAME = "two_player_game"  # Two players taking turns; for self-play agents.


@runtime_checkable
class EnvFactory(Protocol):
    """What every env factory declares and gives (see the module docstring).

    Attributes:
      env_id: the id the factory was made for, e.g. "CartPole-v1", "gymnax:CartPole-v1".
      jax_native: its envs step inside jitted code (the anakin platform), not in env workers.
      players: who acts in its envs.
    """

    @property
    def env_id(self) -> str: ...

    @property
    def jax_native(self) -> bool: ...

    @property
    def players(self) -> Players: ...

    def validate(self) -> None:
        """Raises envs.errors.UnknownEnvError, in one line naming what would work, when the
        id is unknown or its package is not installed."""

    def spec(self) -> EnvSpec | MultiAgentSpec:
        """One env's spec: a MultiAgentSpec where `players` is MULTI_AGENT, else an EnvSpec."""

    def reward_threshold(self) -> float | None:
        """The return that solves the env (what --stop_at_return=auto stops at), or None."""


@runtime_checkable
class HostEnvFactory(EnvFactory, Protocol):
    """A factory whose envs env workers step on the host (`jax_native` False)."""

    def make_vector(self, num_envs: int, seed: int) -> Any:
        """`num_envs` envs as one vector env, reset with `seed`, with next-step autoreset.

        The vector env has `num_envs`, `reset(seed=...)`, `step(actions)` and `close()`, as
        Gymnasium's; a single-agent one also `single_observation_space` and
        `single_action_space` and steps to (obs, reward, terminated, truncated, info); a
        multi-agent one steps to an envs.multi_agent.MultiAgentStep. (Any: Gymnasium's vector
        envs, envpool's and Trellis's own adapters share these members and no base class.)
        """


@runtime_checkable
class JaxEnvFactory(EnvFactory, Protocol):
    """A factory whose envs step inside jitted code (`jax_native` True)."""

    def make(self) -> Any:
        """The env as pure functions of JAX arrays: an envs.jax_env.JaxEnv (one agent), an
        envs.jax_multi_agent.MultiAgentJaxEnv (several) or pgx's Env (a two-player game).
        (Any: three APIs, told apart by `players`.)"""


@runtime_checkable
class RecordedHostEnvFactory(HostEnvFactory, Protocol):
    """A host factory whose envs can be watched (videos: builders/experiments/recording.py)."""

    def make_recorded(self, seed: int) -> Any:
        """One env as `make_vector(1, seed)` gives it (so a policy sees what it saw in
        training: the factory's own preprocessing), that also renders: its `render()` gives
        one picture per env of where it is now, each uint8 [H, W, 3] (Gymnasium's vector envs'
        call; Atari's is the raw screen, not the preprocessed observation)."""


@runtime_checkable
class RenderedJaxEnvFactory(JaxEnvFactory, Protocol):
    """A JAX factory whose envs can be watched (videos: builders/experiments/recording.py)."""

    def render(self, state: Any) -> Any:
        """The picture of one env's state (of `make()`'s env, not batched) on the host: a
        numpy uint8 [H, W, 3] array.

        Raises:
          envs.errors.UnknownEnvError: this id of the family does not render (one line
            naming those that do).
        """


def records_video(factory: EnvFactory) -> bool:
    """Whether `factory` declares rendering for its kind (host or JAX envs)."""
    return isinstance(factory, RenderedJaxEnvFactory if factory.jax_native
                      else RecordedHostEnvFactory)


def is_jax(factory: EnvFactory) -> TypeGuard[JaxEnvFactory]:
    """Whether `factory` declares JAX envs (and so has `make() -> pure functions`)."""
    return factory.jax_native


def is_host(factory: EnvFactory) -> TypeGuard[HostEnvFactory]:
    """Whether `factory` declares envs for env workers (and so has `make_vector`)."""
    return not factory.jax_native
