"""pgx's board games: `--env=pgx:tic_tac_toe` names pgx's tic-tac-toe (Koyamada et al., 2023).

A game is a set of pure JAX functions (`env.init(key)`, `env.step(state, action)`) over a state
that says whose turn it is, which actions are legal, and each player's reward; the observation
is from the player to move. Trellis's AlphaZero (agents/alphazero/) searches and self-plays in
them on the anakin platform (builders/experiments/self_play_run.py).

Nothing heavy at import time: envs/factory.py imports this module in every node process. pgx
is an optional dependency (the `search` extra), imported only when a game is built.
"""

from __future__ import annotations

import dataclasses
import importlib
import types
from typing import Any

from trellis.envs.contract import Players
from trellis.envs.errors import UnknownEnvError, check_registered
from trellis.envs.specs import EnvSpec

PREFIX = "pgx:"


class PgxUnavailableError(UnknownEnvError):
    """pgx is not installed."""


def _pgx() -> types.ModuleType:
    try:
        pgx = importlib.import_module("pgx")
    except ImportError as e:
        raise PgxUnavailableError(
            "pgx games need the pgx package: pip install -e '.[search]'") from e
    return pgx


@dataclasses.dataclass(frozen=True)
class PgxFactory:
    """Builds pgx games for one id.

    Attributes:
      env_id: "pgx:" and a pgx game id, e.g. "pgx:tic_tac_toe", "pgx:connect_four".
    """

    env_id: str

    # Stepped inside jitted code (--platform=anakin), and a game of two players taking turns,
    # which only self-play agents learn from (`builders.experiments.session.check_supported`).
    jax_native = True
    players = Players.TWO_PLAYER_GAME

    @property
    def game_id(self) -> str:
        return self.env_id[len(PREFIX):]

    def validate(self) -> None:
        """Raises UnknownEnvError (naming close matches) for an id pgx does not have, or a game
        that is not for two players; PgxUnavailableError when pgx is not installed."""
        pgx = _pgx()
        check_registered(PREFIX, self.game_id, pgx.available_envs(), "a pgx game id")
        players = pgx.make(self.game_id).num_players
        if players != 2:
            raise UnknownEnvError(f"env {self.env_id!r} is a game of {players} player(s); "
                                  "Trellis plays pgx's two-player games, e.g. pgx:tic_tac_toe, "
                                  "pgx:connect_four, pgx:othello, pgx:go_9x9")

    def make(self) -> Any:
        """The game as pgx's `Env` (pure functions; JAX loaded here, not at import time)."""
        self.validate()
        return _pgx().make(self.game_id)

    def spec(self) -> EnvSpec:
        """One position's observation (from the player to move) and the game's actions."""
        env = self.make()
        return EnvSpec(tuple(int(d) for d in env.observation_shape), "float32",
                       int(env.num_actions), (), "int32")

    def reward_threshold(self) -> float | None:
        """None: a game has no return to reach; the run's return is its score against the
        evaluation's baseline (agents/alphazero/README.md)."""
        return None
