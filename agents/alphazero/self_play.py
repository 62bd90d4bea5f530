"""Self-play and learning as one pure function of the state: nothing steps per move in Python.

`iterate(state) -> (state, metrics)` plays `unroll_length` moves of `batch_size` games side by
side, every move chosen by the search (agents/alphazero/search.py); a finished game restarts
at once. A position's outcome is known only when its game ends, so each iteration's moves wait
for the next iteration's (a game ends within them when it is no longer than `unroll_length`
moves): then their (observation, search policy, outcome for the player to move) go into the
replay on the device, and `updates_per_iteration` SGD steps follow on positions sampled from it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from trellis.agents.alphazero.config import AlphaZeroConfig
from trellis.agents.alphazero.losses import value_targets
from trellis.agents.alphazero.search import Games, Search, make_search
from trellis.agents.common.params import Params
from trellis.agents.common.training import TrainingState
from trellis.builders.contract.agent import Training
from trellis.builders.contract.self_play import SelfPlayCounts


@flax.struct.dataclass
class Replay:
    """A ring of positions: obs [N, ...], policy [N, A], value [N], weight [N]; `next` is
    where the next position goes, `size` how many are held."""

    items: dict[str, jax.Array]
    next: jax.Array
    size: jax.Array


def replay_init(capacity: int, example: Mapping[str, jax.Array]) -> Replay:
    """An empty replay of `capacity` positions shaped like `example`'s ([...] per position)."""
    items = {k: jnp.zeros((capacity, *v.shape), v.dtype) for k, v in example.items()}
    return Replay(items, jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32))


def replay_add(replay: Replay, items: Mapping[str, jax.Array]) -> Replay:
    """Adds the positions of `items` ([M, ...]) whose weight is positive, oldest overwritten.

    All M rows are written, kept ones first; only the kept ones count (`next`, `size`): the
    others lie where the next positions will go.
    """
    capacity = replay.items["weight"].shape[0]
    keep = items["weight"] > 0
    order = jnp.argsort(~keep, stable=True)  # Kept rows first, in their order.
    rows = (replay.next + jnp.arange(keep.shape[0])) % capacity
    stored = {k: replay.items[k].at[rows].set(v[order]) for k, v in items.items()}
    kept = keep.sum(dtype=jnp.int32)
    return Replay(stored, (replay.next + kept) % capacity,
                  jnp.minimum(replay.size + kept, capacity))


def replay_sample(replay: Replay, key: jax.Array, batch_size: int) -> dict[str, jax.Array]:
    """`batch_size` positions drawn uniformly (with replacement) from those held."""
    index = jax.random.randint(key, (batch_size,), 0, jnp.maximum(replay.size, 1))
    return {k: v[index] for k, v in replay.items.items()}


@flax.struct.dataclass
class Moves:
    """Moves of the games side by side, [T, B, ...]: the position (observation, who moves),
    the search's policy there, the move, and what it gave (rewards, whether the game ended)."""

    obs: jax.Array
    player: jax.Array
    policy: jax.Array
    action: jax.Array
    rewards: jax.Array
    terminated: jax.Array


@flax.struct.dataclass
class SelfPlayState:
    """Everything the loop carries: learning, the games being played, the replay, the last
    iteration's moves (outcomes pending; `pending_valid` False before the first), counts."""

    train: TrainingState
    games: Games
    replay: Replay
    pending: Moves
    pending_valid: jax.Array
    key: jax.Array
    moves: jax.Array  # Moves played (env steps), all games.
    games_finished: jax.Array


@dataclasses.dataclass(frozen=True)
class SelfPlayLoop:
    """`init(key) -> SelfPlayState` and `iterate(state) -> (state, metrics)` (see the module's
    docstring), pure and jittable: a `builders.contract.self_play.SelfPlay`."""

    init: Callable[[jax.Array], SelfPlayState]
    iterate: Callable[[SelfPlayState], tuple[SelfPlayState, dict[str, jax.Array]]]

    @staticmethod
    def params(state: SelfPlayState) -> Params:
        return state.train.params

    @staticmethod
    def counts(state: SelfPlayState) -> SelfPlayCounts:
        return SelfPlayCounts(state.moves, state.train.step, state.games_finished)


# positions(moves [2T, B], valid) -> the replay's items of the first T moves' positions,
# {name: [T, B, ...]} with "weight" (0: not stored), from those moves and the next T (whose
# games end the first T's); `valid` False: the first T are the zeros before any move.
Positions = Callable[[Moves, jax.Array], dict[str, jax.Array]]


def outcome_positions(moves: Moves, valid: jax.Array) -> dict[str, jax.Array]:
    """AlphaZero's positions: observation, search policy, and the game's outcome for the
    player to move (weight 0 where the game has not ended yet)."""
    num_moves = moves.obs.shape[0] // 2
    values, known = value_targets(moves.rewards, moves.terminated, moves.player)
    return {"obs": moves.obs[:num_moves], "policy": moves.policy[:num_moves],
            "value": values[:num_moves],
            "weight": (known[:num_moves] & valid).astype(jnp.float32)}


def make_self_play(env: Any, network: Any, training: Training, config: AlphaZeroConfig
                   ) -> SelfPlayLoop:
    """AlphaZero's self-play loop on `env` (see the module's docstring)."""
    return make_self_play_loop(env, make_search(env, network, config), training, config,
                               outcome_positions)


def make_self_play_loop(env: Any, search: Search, training: Training, config: AlphaZeroConfig,
                        positions: Positions) -> SelfPlayLoop:
    """The self-play loop on `env` of any search and learning (AlphaZero's, MuZero's):
    `search` picks the moves, `positions` makes the replay's items, `training` learns from
    `sample_batch_size` of them per step."""
    update = training.make_update(None)
    num_games, num_moves = config.batch_size, config.unroll_length

    def new_games(key: jax.Array) -> Games:
        return jax.vmap(env.init)(jax.random.split(key, num_games))

    def move(carry: tuple[Params, Games], key: jax.Array
             ) -> tuple[tuple[Params, Games], Moves]:
        search_key, reset_key = jax.random.split(key)
        params, games = carry
        out = search(params, search_key, games)
        after = jax.vmap(env.step)(games, out.action)
        record = Moves(games.observation, games.current_player, jnp.asarray(out.action_weights),
                       jnp.asarray(out.action), after.rewards, after.terminated)
        # Finished games restart at once.
        fresh = new_games(reset_key)
        over = after.terminated
        after = jax.tree.map(
            lambda f, a: jnp.where(over.reshape(over.shape + (1,) * (a.ndim - 1)), f, a),
            fresh, after)
        return (params, after), record

    def init(key: jax.Array) -> SelfPlayState:
        train_key, games_key, moves_key, key = jax.random.split(key, 4)
        games = new_games(games_key)
        _, pending = jax.eval_shape(
            lambda: jax.lax.scan(move, (training.init(train_key).params, games),
                                 jax.random.split(moves_key, num_moves)))
        pending = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), pending)
        both = jax.tree.map(lambda a: jnp.concatenate([a, a]), pending)
        example = jax.tree.map(lambda s: jnp.zeros(s.shape[2:], s.dtype),
                               jax.eval_shape(positions, both, jnp.zeros((), bool)))
        zero = jnp.zeros((), jnp.int32)
        return SelfPlayState(training.init(train_key), games,
                             replay_init(config.replay_size, example), pending,
                             jnp.zeros((), bool), key, zero, zero)

    def learn(train: TrainingState, replay: Replay, key: jax.Array
              ) -> tuple[TrainingState, dict[str, jax.Array]]:
        def sgd(train: TrainingState, key: jax.Array
                ) -> tuple[TrainingState, dict[str, jax.Array]]:
            return update(train, replay_sample(replay, key, config.sample_batch_size))

        train, metrics = jax.lax.scan(sgd, train,
                                      jax.random.split(key, config.updates_per_iteration))
        return train, jax.tree.map(jnp.mean, metrics)

    def iterate(state: SelfPlayState) -> tuple[SelfPlayState, dict[str, jax.Array]]:
        key, play_key, learn_key = jax.random.split(state.key, 3)
        (_, games), moves = jax.lax.scan(move, (state.train.params, state.games),
                                         jax.random.split(play_key, num_moves))
        # The pending moves' games end in these moves (or earlier) when no longer than T.
        both = jax.tree.map(lambda a, b: jnp.concatenate([a, b]), state.pending, moves)
        items = positions(both, state.pending_valid)
        replay = replay_add(state.replay, jax.tree.map(
            lambda x: x.reshape((-1, *x.shape[2:])), items))
        ready = replay.size >= config.min_replay_size
        zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype),
                             jax.eval_shape(learn, state.train, replay, learn_key)[1])
        train, metrics = jax.lax.cond(ready, learn, lambda t, r, k: (t, zeros),
                                      state.train, replay, learn_key)
        finished = moves.terminated.sum(dtype=jnp.int32)
        state = SelfPlayState(train, games, replay, moves, jnp.ones((), bool), key,
                              state.moves + num_moves * num_games,
                              state.games_finished + finished)
        metrics.update(replay_size=replay.size, self_play_games=finished,
                       unknown_outcomes=(items["weight"] == 0).sum(dtype=jnp.int32))
        return state, metrics

    return SelfPlayLoop(init, iterate)
