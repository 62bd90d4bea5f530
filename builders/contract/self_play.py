"""Self-play with search in two-player games (`Capabilities.learns_from == SELF_PLAY`):
AlphaZero (agents/alphazero/), and MuZero (agents/muzero/), whose search plans with a learned
model; the protocol carries both unchanged.

The agent plays moves chosen by a search of its network, stores the positions and learns from
them inside one pure function of a state of its own (`SelfPlay.iterate`), which
builders/experiments/self_play_run.py jits and calls on the device; it evaluates its search
against baselines (`make_match`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from trellis.builders.contract.agent import Agent, AgentSettings
from trellis.envs.specs import EnvSpec

if TYPE_CHECKING:  # JAX only for annotations (see agent.py).
    import jax

__all__ = ["Match", "SelfPlay", "SelfPlayAgent", "SelfPlayCounts", "SelfPlaySettings"]

# play(params, key) -> outcomes [num_games] for the agent (1 win, 0 draw, -1 loss).
Match = Callable[[Any, "jax.Array"], "jax.Array"]


class SelfPlayCounts(NamedTuple):
    """What a self-play state has counted (int32 scalars)."""

    moves: jax.Array  # Moves played, all games: the run's env steps.
    learner_steps: jax.Array  # SGD steps taken.
    games_finished: jax.Array


class SelfPlay(Protocol):
    """Self-play, replay and learning as pure functions of the agent's state (jittable)."""

    def init(self, key: jax.Array) -> Any: ...

    def iterate(self, state: Any) -> tuple[Any, dict[str, jax.Array]]:
        """One compiled call: moves of every game, positions stored, SGD steps."""
        ...

    def params(self, state: Any) -> Any:
        """The network params the search plays with."""
        ...

    def counts(self, state: Any) -> SelfPlayCounts: ...


class SelfPlaySettings(AgentSettings, Protocol):
    """What self_play_run.py reads of a self-play agent's config: its evaluation games."""

    @property
    def eval_every_updates(self) -> int:
        """SGD steps between evaluations (one also at the start); 0: none."""
        ...

    @property
    def eval_games(self) -> int:
        """Games per evaluation, half with each side to move first."""
        ...

    @property
    def eval_opponent(self) -> str:
        """The baseline the evaluations play (`SelfPlayAgent.make_match`)."""
        ...


class SelfPlayAgent(Agent[EnvSpec], Protocol):
    """What a self-play agent provides (agents/alphazero/builder.py). Its `make_training` is
    the learning inside `make_self_play`; its `Training.hparams` works on the self-play state
    (which holds the training state) for the learning-rate schedule."""

    @property
    def config(self) -> SelfPlaySettings: ...

    def make_self_play(self, networks: Any, spec: EnvSpec, env: Any) -> SelfPlay:
        """The self-play loop on `env` (the game, e.g. pgx's)."""
        ...

    def make_match(self, networks: Any, env: Any, opponent: str, num_games: int) -> Match:
        """`play(params, key) -> outcomes [num_games]`: the search against the baseline
        `opponent`, half the games moving first.

        Raises:
          ValueError: an unknown baseline, or one that does not play this game.
        """
        ...
