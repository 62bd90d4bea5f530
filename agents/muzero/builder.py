"""MuZero builder: the one place that wires the learned model, its search, the learning and
the self-play loop (agents/common/self_play.py)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from trellis.agents.common.baselines import Player, make_search_match
from trellis.agents.common.params import Params, pure_apply
from trellis.agents.common.self_play import Games, SelfPlayLoop, masked_logits
from trellis.agents.muzero.config import MuZeroConfig
from trellis.agents.muzero.learner import make_training
from trellis.agents.muzero.networks import MuZeroNet, make_networks
from trellis.agents.muzero.search import make_search
from trellis.agents.muzero.self_play import make_self_play
from trellis.builders.contract.agent import SELF_PLAY, Capabilities, Policy, State, Training
from trellis.builders.contract.self_play import Match
from trellis.envs.specs import EnvSpec


class MuZeroBuilder:
    """Builder for MuZero on a two-player pgx game (`--env=pgx:GAME --platform=anakin`): a
    `builders.contract.self_play.SelfPlayAgent`, as AlphaZero's.

    The games are pgx's states (the observation from the player to move, who moves, the
    legal moves); the search sees only the observation and the root's legal moves, and
    plans with the learned model.
    """

    def __init__(self, config: MuZeroConfig):
        self.config = config

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(SELF_PLAY, anakin=True)

    def make_networks(self, spec: EnvSpec) -> MuZeroNet:
        return make_networks(spec, self.config.hidden_sizes, self.config.latent_size)

    def make_policy(self, networks: MuZeroNet, evaluation: bool = False) -> Policy:
        """`policy(params, key, games, state, first)`: the prediction's own move at the
        representation of the position, without search (its most likely legal move, or a
        sample when not evaluating); `make_search_player` is the player that searches."""

        def policy(params: Params, key: jax.Array, games: Games, state: State,
                   first: jax.Array) -> tuple[jax.Array, dict[str, jax.Array], State]:
            del first  # Feed-forward.
            _, logits, _ = pure_apply(networks)(params, games.observation,
                                                method=MuZeroNet.initial_inference)
            logits = masked_logits(logits, games.legal_action_mask)
            action = (jnp.argmax(logits, axis=-1) if evaluation
                      else jax.random.categorical(key, logits))
            return action, {}, state

        return policy

    def make_search_player(self, networks: MuZeroNet, env: Any, params: Params) -> Player:
        """`player(key, games) -> action` searching the model with `params`, without
        exploration noise (played against agents/common/baselines.py's baselines)."""
        del env  # The model is the search's game.
        search = make_search(networks, self.config, evaluation=True)
        return lambda key, games: jnp.asarray(search(params, key, games).action)

    def make_match(self, networks: MuZeroNet, env: Any, opponent: str, num_games: int
                   ) -> Match:
        """`play(params, key) -> outcomes [num_games]` (1, 0, -1): the search (no noise)
        against the baseline `opponent`, half moving first.

        Raises:
          ValueError: an unknown baseline, or one that does not play this game.
        """
        return make_search_match(
            env, lambda params: self.make_search_player(networks, env, params), opponent,
            self.config.mcts_simulations, num_games)

    def make_training(self, networks: MuZeroNet, spec: EnvSpec) -> Training:
        return make_training(networks, spec, self.config)

    def make_self_play(self, networks: MuZeroNet, spec: EnvSpec, env: Any) -> SelfPlayLoop:
        """Self-play, replay and learning in one pure function (agents/muzero/self_play.py)."""
        return make_self_play(env, networks, self.make_training(networks, spec), self.config)
