"""Players to measure the self-play agents (AlphaZero, MuZero) against, and matches between
two players.

A player is `player(key, state) -> action[B]` on a batch of pgx states (pure, jittable):

- `random_player`: a uniformly random legal move;
- `make_mcts_player`: pure Monte-Carlo tree search (mctx's PUCT with a uniform prior), each
  leaf valued by one random roll-out to the game's end;
- `make_minimax_player`: exact minimax for tic-tac-toe, from a table of every position's
  optimal moves computed once in numpy (`minimax_table`), choosing among them at random.

`match` plays a player against another from both sides; `minimax_lines` checks a
deterministic player against every line of minimax's optimal moves.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import chex
import jax
import jax.numpy as jnp
import mctx
import numpy as np

from trellis.agents.common.params import Params
from trellis.agents.common.self_play import Games, masked_logits

Player = Callable[[jax.Array, Games], jax.Array]
# A while loop's carry over games being played: (key, the games, the outcome so far [B]).
Playing = tuple[jax.Array, Games, jax.Array]


def random_player(key: jax.Array, state: Any) -> jax.Array:
    """A uniformly random legal move of each state: [B]."""
    legal = state.legal_action_mask
    return jax.random.categorical(key, jnp.where(legal, 0.0, -jnp.inf))


def rollout_values(env: Any, key: jax.Array, state: Any) -> jax.Array:
    """The outcome for the player to move of one random game from each state on: [B]."""
    mover = state.current_player

    def not_over(carry: Playing) -> jax.Array:
        return ~jnp.all(carry[1].terminated)

    def play(carry: Playing) -> Playing:
        key, state, outcome = carry
        key, move_key = jax.random.split(key)
        state = jax.vmap(env.step)(state, random_player(move_key, state))
        outcome += jnp.take_along_axis(state.rewards, mover[:, None], axis=-1)[:, 0]
        return key, state, outcome

    _, _, outcome = jax.lax.while_loop(not_over, play,
                                       (key, state, jnp.zeros(mover.shape, jnp.float32)))
    return jnp.where(state.terminated, 0.0, outcome)


def make_mcts_player(env: Any, num_simulations: int) -> Player:
    """Pure MCTS: PUCT over a uniform prior, leaves valued by a random roll-out; the most
    visited move."""

    def uniform(state: Games) -> jax.Array:
        return masked_logits(jnp.zeros(state.legal_action_mask.shape), state.legal_action_mask)

    def recurrent_fn(params: Params, key: jax.Array, action: chex.Array, state: Games
                     ) -> tuple[mctx.RecurrentFnOutput, Games]:
        del params
        mover = state.current_player
        state = jax.vmap(env.step)(state, action)
        reward = jnp.take_along_axis(state.rewards, mover[:, None], axis=-1)[:, 0]
        over = state.terminated
        output = mctx.RecurrentFnOutput(
            reward=reward, discount=jnp.where(over, 0.0, -1.0), prior_logits=uniform(state),
            value=rollout_values(env, key, state))
        return output, state

    def player(key: jax.Array, state: Games) -> jax.Array:
        root_key, search_key = jax.random.split(key)
        root = mctx.RootFnOutput(prior_logits=uniform(state),
                                 value=rollout_values(env, root_key, state), embedding=state)
        # No params: the roll-outs need none (an empty pytree, as None was).
        out = mctx.muzero_policy((), search_key, root, recurrent_fn, num_simulations,
                                 invalid_actions=~state.legal_action_mask,
                                 dirichlet_fraction=0.0, temperature=0.0)
        return jnp.asarray(out.action)

    return player


# Tic-tac-toe's lines of three, cells numbered row by row.
_LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8),
          (2, 4, 6))


@functools.cache
def minimax_table() -> tuple[np.ndarray, np.ndarray]:
    """Every tic-tac-toe position's value and optimal moves for the player to move.

    A position is 9 cells, 0 empty, 1 the mover's, 2 the opponent's, indexed by
    `sum(cell_i * 3**i)`. Negamax: a position where the opponent has a line is lost (-1), a
    full one drawn (0), else the best over the empty cells of minus the value after the move
    (seen from the other side, whose mover is the opponent).

    Returns:
      (value [3**9] int8 in {-1, 0, 1}, optimal [3**9, 9] bool: the moves that keep it),
      unreachable positions with value 0 and no optimal move.
    """
    value = np.zeros(3 ** 9, np.int8)
    optimal = np.zeros((3 ** 9, 9), bool)
    powers = 3 ** np.arange(9)
    solved: dict[tuple[int, ...], int] = {}

    def solve(cells: tuple[int, ...]) -> int:
        if cells in solved:
            return solved[cells]
        index = int(np.dot(cells, powers))
        if any(all(cells[i] == 2 for i in line) for line in _LINES):
            result = -1
        elif all(cells):
            result = 0
        else:
            swapped = tuple((0, 2, 1)[c] for c in cells)  # The opponent's view.
            after = {a: -solve(swapped[:a] + (2,) + swapped[a + 1:])
                     for a in range(9) if not cells[a]}
            result = max(after.values())
            optimal[index] = [after.get(a) == result for a in range(9)]
        value[index] = result
        solved[cells] = result
        return result

    solve((0,) * 9)
    return value, optimal


def board_index(observation: jax.Array) -> jax.Array:
    """pgx tic-tac-toe observations [B, 3, 3, 2] (plane 0 the mover's marks, 1 the
    opponent's) as `minimax_table` indices [B]."""
    cells = observation[..., 0].reshape(-1, 9) + 2 * observation[..., 1].reshape(-1, 9)
    return cells.astype(jnp.int32) @ (3 ** jnp.arange(9, dtype=jnp.int32))


def make_minimax_player() -> Player:
    """Exact minimax for pgx's tic-tac-toe: a random one of the optimal moves."""
    optimal = jnp.asarray(minimax_table()[1])

    def player(key: jax.Array, state: Games) -> jax.Array:
        best = optimal[board_index(state.observation)]
        return jax.random.categorical(key, jnp.where(best, 0.0, -jnp.inf))

    return player


def minimax_lines(env: Any, player: Player, key: jax.Array) -> tuple[int, int]:
    """Every line of tic-tac-toe that exact minimax's optimal moves allow against `player`,
    from both sides: (the positions where `player` moves on them, its moves there that turn
    the game from drawn to lost). 0 lost moves: `player` loses no game to minimax, whichever
    optimal moves minimax picks, which 100 sampled games only suggest.

    `player` must be deterministic (the search without exploration noise): it is asked once
    per position, with `key`, on a batch of one.
    """
    value, optimal = minimax_table()
    act = jax.jit(player)
    step = jax.jit(jax.vmap(env.step))
    seen: set[tuple[int, int]] = set()
    lost = 0

    def visit(state: Any, side: int) -> None:
        nonlocal lost
        if bool(state.terminated[0]):
            return
        index = int(board_index(state.observation)[0])
        mover = int(state.current_player[0])
        if (index, mover == side) in seen:
            return
        seen.add((index, mover == side))
        if mover == side:
            moves = [int(act(key, state)[0])]
            lost += int(value[index] == 0 and not optimal[index, moves[0]])
        else:
            moves = np.flatnonzero(optimal[index]).tolist()
        for move in moves:
            visit(step(state, jnp.array([move])), side)

    start = jax.tree.map(lambda x: x[None], env.init(jax.random.key(0)))
    first = int(start.current_player[0])
    for side in (first, 1 - first):
        visit(start, side)
    return sum(own for _, own in seen), lost


def play_games(env: Any, first: Player, second: Player, key: jax.Array, num_games: int
               ) -> jax.Array:
    """`num_games` games of `first` (moving first) against `second`: first's outcomes [G]."""
    init_key, key = jax.random.split(key)
    state = jax.vmap(env.init)(jax.random.split(init_key, num_games))
    first_id = state.current_player

    def not_over(carry: Playing) -> jax.Array:
        return ~jnp.all(carry[1].terminated)

    def move(carry: Playing) -> Playing:
        key, state, outcome = carry
        key, key_a, key_b = jax.random.split(key, 3)
        action = jnp.where(state.current_player == first_id, first(key_a, state),
                           second(key_b, state))
        state = jax.vmap(env.step)(state, action)
        outcome += jnp.take_along_axis(state.rewards, first_id[:, None], axis=-1)[:, 0]
        return key, state, outcome

    _, _, outcome = jax.lax.while_loop(
        not_over, move, (key, state, jnp.zeros(num_games, jnp.float32)))
    return outcome


def match(env: Any, player: Player, opponent: Player, key: jax.Array, num_games: int
          ) -> jax.Array:
    """`player`'s outcomes [G] (1 win, 0 draw, -1 loss) in `num_games` against `opponent`,
    the first half moving first, the second half second."""
    half = num_games // 2
    first_key, second_key = jax.random.split(key)
    as_first = play_games(env, player, opponent, first_key, half)
    as_second = -play_games(env, opponent, player, second_key, num_games - half)
    return jnp.concatenate([as_first, as_second])


def make_search_match(env: Any, player_of: Callable[[Params], Player], opponent: str,
                      mcts_simulations: int, num_games: int
                      ) -> Callable[[Params, jax.Array], jax.Array]:
    """`play(params, key) -> outcomes [num_games]` (1, 0, -1): the player `player_of(params)`
    against the baseline `opponent` (`make_opponent`), half the games moving first.

    Raises:
      ValueError: an unknown baseline, or one that does not play this game.
    """
    baseline = make_opponent(opponent, env, mcts_simulations)

    def play(params: Params, key: jax.Array) -> jax.Array:
        return match(env, player_of(params), baseline, key, num_games)

    return play


def make_opponent(name: str, env: Any, mcts_simulations: int) -> Player:
    """The baseline called `name` ("random", "mcts", "minimax").

    Raises:
      ValueError: minimax for another game than tic-tac-toe, or an unknown name.
    """
    if name == "random":
        return random_player
    if name == "mcts":
        return make_mcts_player(env, mcts_simulations)
    if name == "minimax":
        if env.id != "tic_tac_toe":
            raise ValueError(f"the minimax baseline plays tic-tac-toe only, not {env.id!r} "
                             "(use random or mcts)")
        return make_minimax_player()
    raise ValueError(f"unknown baseline {name!r}; choose one of: random, mcts, minimax")
