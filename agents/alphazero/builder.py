"""AlphaZero builder: the one place that wires the network, the search, the learning and the
self-play loop."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from trellis.agents.alphazero.config import AlphaZeroConfig
from trellis.agents.alphazero.learner import make_training
from trellis.agents.alphazero.networks import PolicyValueNet, make_networks
from trellis.agents.alphazero.search import make_search
from trellis.agents.alphazero.self_play import make_self_play
from trellis.agents.common.baselines import Player, make_search_match
from trellis.agents.common.params import Params
from trellis.agents.common.self_play import Games, SelfPlayLoop, masked_logits
from trellis.builders.contract.agent import SELF_PLAY, Capabilities, Policy, State, Training
from trellis.builders.contract.self_play import Match
from trellis.envs.specs import EnvSpec


class AlphaZeroBuilder:
    """Builder for AlphaZero on a two-player pgx game (`--env=pgx:GAME --platform=anakin`): a
    `builders.contract.self_play.SelfPlayAgent`.

    Its "observations" are pgx's game states (a pytree with the observation from the player
    to move, who moves, the legal moves): the search steps the game itself.
    """

    def __init__(self, config: AlphaZeroConfig):
        self.config = config

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(SELF_PLAY, anakin=True)

    def make_networks(self, spec: EnvSpec) -> PolicyValueNet:
        return make_networks(spec, self.config.hidden_sizes)

    def make_policy(self, networks: PolicyValueNet, evaluation: bool = False) -> Policy:
        """`policy(params, key, games, state, first)`: the network's own move, without search
        (its most likely legal move, or a sample when not evaluating); `make_search_player`
        is the player that searches."""

        def policy(params: Params, key: jax.Array, games: Games, state: State,
                   first: jax.Array) -> tuple[jax.Array, dict[str, jax.Array], State]:
            del first  # Feed-forward.
            logits, _ = networks.apply(params, games.observation)
            logits = masked_logits(logits, games.legal_action_mask)
            action = (jnp.argmax(logits, axis=-1) if evaluation
                      else jax.random.categorical(key, logits))
            return action, {}, state

        return policy

    def make_search_player(self, networks: PolicyValueNet, env: Any, params: Params) -> Player:
        """`player(key, games) -> action` searching with `params`, without exploration noise
        (agents/common/baselines.py plays it against the baselines)."""
        search = make_search(env, networks, self.config, evaluation=True)
        return lambda key, games: jnp.asarray(search(params, key, games).action)

    def make_match(self, networks: PolicyValueNet, env: Any, opponent: str,
                   num_games: int) -> Match:
        """`play(params, key) -> outcomes [num_games]` (1, 0, -1): the search (no noise)
        against the baseline `opponent` (agents/common/baselines.py), half moving first.

        Raises:
          ValueError: an unknown baseline, or one that does not play this game.
        """
        return make_search_match(
            env, lambda params: self.make_search_player(networks, env, params), opponent,
            self.config.mcts_simulations, num_games)

    def make_training(self, networks: PolicyValueNet, spec: EnvSpec) -> Training:
        return make_training(networks, spec, self.config)

    def make_self_play(self, networks: PolicyValueNet, spec: EnvSpec, env: Any
                       ) -> SelfPlayLoop:
        """Self-play, replay and learning in one pure function (agents/alphazero/self_play.py
        on agents/common/self_play.py's loop)."""
        return make_self_play(env, networks, self.make_training(networks, spec), self.config)
