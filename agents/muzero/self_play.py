"""MuZero's self-play: the shared loop (agents/common/self_play.py: games side by side on the
device, replay, SGD in one jitted call) with the search over the learned model and
positions that hold their K-step targets (`losses.unroll_targets`)."""

from __future__ import annotations

from typing import Any

import jax

from trellis.agents.common.params import Params, pure_apply
from trellis.agents.common.self_play import (
    ActedMoves,
    Moves,
    Positions,
    SelfPlayLoop,
    make_self_play_loop,
)
from trellis.agents.muzero.config import MuZeroConfig
from trellis.agents.muzero.losses import unroll_targets
from trellis.agents.muzero.networks import MuZeroNet
from trellis.agents.muzero.search import make_search
from trellis.builders.contract.agent import Training


def make_positions(network: MuZeroNet, num_unroll_steps: int, td_steps: int) -> Positions:
    """`positions(params, moves [2T, B], valid)`: the replay's items of the first T moves,
    their observation and K-step targets (`agents.common.self_play.Positions`), the value
    targets bootstrapped `td_steps` moves on from the model's value with `params`."""

    def positions(params: Params, moves: Moves, valid: jax.Array) -> dict[str, jax.Array]:
        assert isinstance(moves, ActedMoves)  # make_self_play records them.
        predicted = None
        if td_steps:
            obs = moves.obs.reshape((-1, *moves.obs.shape[2:]))
            _, _, value = pure_apply(network)(params, obs, method=MuZeroNet.initial_inference)
            predicted = value.reshape(moves.terminated.shape)
        targets = unroll_targets(moves.action, moves.policy, moves.rewards, moves.terminated,
                                 moves.player, num_unroll_steps, td_steps, predicted)
        return {**targets, "obs": moves.obs[:moves.obs.shape[0] // 2],
                "weight": targets["weight"] * valid}

    return positions


def make_self_play(env: Any, network: MuZeroNet, training: Training, config: MuZeroConfig
                   ) -> SelfPlayLoop:
    """MuZero's self-play loop on `env` (see the module's docstring)."""
    return make_self_play_loop(env, make_search(network, config), training, config,
                               make_positions(network, config.num_unroll_steps,
                                              config.td_steps), record_actions=True)
