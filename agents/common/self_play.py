"""Self-play with search on two-player pgx games, AlphaZero's and MuZero's alike: the search's
call, the positions' value targets, the replay on the device and the self-play loop.

The loop is one pure function of the state: nothing steps per move in Python.
`iterate(state) -> (state, metrics)` plays `unroll_length` moves of `batch_size` games side by
side, every move chosen by the agent's search (AlphaZero's over the game, MuZero's over its
learned model; both call `run_search`); a finished game restarts at once. A position's
outcome is known only when its game ends, so each iteration's moves wait for the next
iteration's (a game ends within them when it is no longer than `unroll_length` moves): then
the agent's `Positions` make the replay's items of them (AlphaZero's: observation, search
policy, outcome for the player to move; MuZero's: K-step targets), and
`updates_per_iteration` SGD steps follow on positions sampled from the replay.

Values are for the player to move: a move's reward is the mover's, and mctx's discount of -1
hands the next node's value over to the other player (0 once the game is over).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import chex
import flax.struct
import jax
import jax.numpy as jnp
import mctx

from trellis.agents.common.params import Params
from trellis.agents.common.self_play_config import SelfPlayConfig
from trellis.agents.common.training import TrainingState
from trellis.builders.contract.agent import Training
from trellis.builders.contract.self_play import SelfPlayCounts

# pgx's game state, batched ([B] leaves): pgx ships no annotations, so to a type checker it is
# Any; the name says what it is.
Games = Any
# What a search gives for a batch of games: its action [B] and the visit-count targets
# `action_weights` [B, A], and its extra data (Gumbel MuZero's; none for MuZero's).
SearchOutput = mctx.PolicyOutput[None] | mctx.PolicyOutput[mctx.GumbelMuZeroExtraData]
# search(params, key, games) -> the search's output for each game.
Search = Callable[[Params, jax.Array, Games], SearchOutput]


def masked_logits(logits: jax.Array, legal: jax.Array) -> jax.Array:
    """Logits with illegal actions at the lowest float: they get no probability."""
    logits = logits - jnp.max(logits, axis=-1, keepdims=True)
    return jnp.where(legal, logits, jnp.finfo(logits.dtype).min)


def run_search(config: SelfPlayConfig, params: Params, key: jax.Array,
               root: mctx.RootFnOutput, recurrent_fn: mctx.RecurrentFn, invalid: jax.Array,
               evaluation: bool = False) -> SearchOutput:
    """mctx's search from `root` as `config` sets it (AlphaZero's and MuZero's alike).

    Self-play explores: Dirichlet noise at the root and moves sampled from the visit counts
    (muzero), or Gumbel noise (gumbel). Evaluation does not: the most visited move (muzero),
    sequential halving without noise (gumbel), with `eval_simulations` where it is set.

    Args:
      config: the search's settings.
      params, key: the search's params (passed to `recurrent_fn`) and key.
      root: the root's prior logits [B, A], value [B] and embedding.
      recurrent_fn: the model the tree steps.
      invalid: [B, A] the root's illegal actions, never searched nor chosen.
      evaluation: without exploration noise.
    """
    simulations = (config.eval_simulations or config.num_simulations if evaluation
                   else config.num_simulations)
    if config.search_policy == "gumbel":
        return mctx.gumbel_muzero_policy(
            params, key, root, recurrent_fn, simulations, invalid_actions=invalid,
            max_num_considered_actions=config.max_considered_actions,
            gumbel_scale=0.0 if evaluation else 1.0)
    return mctx.muzero_policy(
        params, key, root, recurrent_fn, simulations, invalid_actions=invalid,
        dirichlet_fraction=0.0 if evaluation else config.dirichlet_fraction,
        dirichlet_alpha=config.dirichlet_alpha, pb_c_init=config.pb_c_init,
        temperature=0.0 if evaluation else 1.0)


def value_targets(rewards: jax.Array, terminated: jax.Array, player: jax.Array
                  ) -> tuple[jax.Array, jax.Array]:
    """The outcome of each position's game for the player to move there, and whether known.

    Positions are consecutive moves of games side by side; a game that ends at move t
    (`terminated[t]`) is followed at t + 1 by a new one. A position's target is its game's
    final reward to the player who moves there; in a zero-sum game of alternating moves it
    flips sign from one ply to the next. The positions of games still going at the last move
    have no target yet (`known` False).

    Args:
      rewards: [T, B, 2] each player's reward for the move made at t (non-zero only at a
        game's end).
      terminated: [T, B] the move made at t ended the game.
      player: [T, B] who moves at t (0 or 1).

    Returns:
      (values [T, B] in the mover's view, known [T, B]).
    """
    chex.assert_rank([rewards, terminated, player], [3, 2, 2])

    def backward(carry: tuple[jax.Array, jax.Array], step: tuple[jax.Array, jax.Array]
                 ) -> tuple[tuple[jax.Array, jax.Array], tuple[jax.Array, jax.Array]]:
        outcome, known = carry  # [B, 2], [B]: of the game that position t + 1 belongs to.
        reward, ended = step
        outcome = jnp.where(ended[:, None], reward, outcome)
        known = ended | known
        return (outcome, known), (outcome, known)

    batch = rewards.shape[1]
    init = (jnp.zeros((batch, 2), rewards.dtype), jnp.zeros((batch,), bool))
    _, (outcomes, known) = jax.lax.scan(backward, init, (rewards, terminated), reverse=True)
    values = jnp.take_along_axis(outcomes, player[..., None].astype(jnp.int32), axis=-1)[..., 0]
    return values, known


def select_games(where: jax.Array, games: Games, others: Games) -> Games:
    """Batched pgx states: `games`' where `where` [B], else `others`'."""
    return jax.tree.map(
        lambda a, b: jnp.where(where.reshape(where.shape + (1,) * (a.ndim - 1)), a, b),
        games, others)


def random_moves(games: Games, key: jax.Array, action: jax.Array, opening_moves: int,
                 probability: float) -> jax.Array:
    """`action` [B], where a game has made fewer than `opening_moves` moves, and elsewhere with
    `probability`, a legal one drawn uniformly instead.

    The position's policy target stays the search's; its value target is the game's outcome
    after the drawn move, as it is after a move sampled from the visit counts. Later random
    moves show the model what follows the search's rejected moves (a threat left open), which
    its own play never makes.
    """
    legal = games.legal_action_mask
    drawn = jax.random.categorical(key, masked_logits(jnp.zeros(legal.shape), legal))
    # pgx counts a game's moves in `_step_count` (v2's State; no public name for it).
    random = games._step_count < opening_moves
    if probability:
        # fold_in: the openings' draws stay what they were before this setting.
        coin = jax.random.uniform(jax.random.fold_in(key, 1), action.shape)
        random |= coin < probability
    return jnp.where(random, drawn, action)


@flax.struct.dataclass
class Replay:
    """A ring of positions: the `Positions`' items, [N, ...] each, "weight" [N] among them;
    `next` is where the next position goes, `size` how many are held."""

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
    the search's policy there, and what the move gave (rewards, whether the game ended)."""

    obs: jax.Array
    player: jax.Array
    policy: jax.Array
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


# `Moves`' fields in order, of one move of the games side by side [B, ...].
Made = tuple[jax.Array, jax.Array, jax.Array, jax.Array, jax.Array]
# record(made, action, out) -> what the loop keeps of a move: `action` is the move made (the
# search's or a random one), `out` the search's output; the positions read the records.
Record = Callable[[Made, jax.Array, SearchOutput], Moves]

# positions(moves [2T, B], valid) -> the replay's items of the first T moves' positions,
# {name: [T, B, ...]} with "weight" (0: not stored), from those moves and the next T (whose
# games end the first T's); `valid` False: the first T are the zeros before any move.
Positions = Callable[[Moves, jax.Array], dict[str, jax.Array]]


def make_self_play_loop(env: Any, search: Search, training: Training, config: SelfPlayConfig,
                        record: Record, positions: Positions) -> SelfPlayLoop:
    """The self-play loop on `env` of any search and learning (see the module's docstring):
    `search` picks the moves, `record` keeps what `positions` reads of them, `positions`
    makes the replay's items, `training` learns from `sample_batch_size` of them per step."""
    update = training.make_update(None)
    num_games, num_moves = config.batch_size, config.unroll_length

    def new_games(key: jax.Array) -> Games:
        return jax.vmap(env.init)(jax.random.split(key, num_games))

    def move(carry: tuple[Params, Games], key: jax.Array
             ) -> tuple[tuple[Params, Games], Moves]:
        search_key, reset_key = jax.random.split(key)
        params, games = carry
        out = search(params, search_key, games)
        action = jnp.asarray(out.action)
        if config.random_opening_moves or config.random_move_probability:
            # fold_in, not a third split: without random moves the keys, and so a seed's
            # games, are what they were before the settings.
            action = random_moves(games, jax.random.fold_in(key, 1), action,
                                  config.random_opening_moves, config.random_move_probability)
        after = jax.vmap(env.step)(games, action)
        made: Made = (games.observation, games.current_player, jnp.asarray(out.action_weights),
                after.rewards, after.terminated)
        # Finished games restart at once.
        after = select_games(after.terminated, new_games(reset_key), after)
        return (params, after), record(made, action, out)

    def init(key: jax.Array) -> SelfPlayState:
        train_key, games_key, moves_key, key = jax.random.split(key, 4)
        games, train = new_games(games_key), training.init(train_key)
        _, pending = jax.eval_shape(
            lambda: jax.lax.scan(move, (train.params, games),
                                 jax.random.split(moves_key, num_moves)))
        pending = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), pending)
        both = jax.tree.map(lambda a: jnp.concatenate([a, a]), pending)
        example = jax.tree.map(
            lambda s: jnp.zeros(s.shape[2:], s.dtype),
            jax.eval_shape(positions, both, jnp.zeros((), bool)))
        zero = jnp.zeros((), jnp.int32)
        return SelfPlayState(train, games,
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
