"""MuZero's learned model of tic-tac-toe measured against the game itself, on every position.

Usage: python benchmarks/muzero_model.py --run=RUN_DIR
       python benchmarks/muzero_model.py --fit [--hidden_sizes=256,256] [--latent_size=128]
           [--updates=6000] [--seed=0]

A MuZero search is as good as its model on the positions and moves the search visits, which
self-play's own games may not cover: minimax's replies and the moves a search tries and
rejects. This measures the model on all 4,520 tic-tac-toe positions a game can reach with
the mover to play (pgx's states, by breadth-first search), against exact minimax's values
(agents/common/baselines.py's table):

- `root_value`: the representation's value rounded to -1, 0 or 1 equals minimax's;
- `prior_optimal`: the prior's most likely legal move is one of minimax's optimal moves;
- `q_optimal`: so is the legal move with the best one-step value in the model, the
  dynamics' reward minus the value after it;
- `win_reward`: the dynamics' reward of the moves that win, averaged (exact: 1);
- `end_value`: the absolute value after a move that ends the game, averaged (exact: 0);
- `lines`: the search (`eval_simulations`) on every line of minimax's optimal moves, from
  both sides: its moves that turn a drawn game into a lost one (`baselines.minimax_lines`).

`--run` measures a MuZero run on pgx:tic_tac_toe (its newest checkpoint). `--fit` trains a
fresh model of the given size with MuZero's own update (`agents.muzero.learner`) on exact
targets instead of self-play's: each sampled position with K random legal moves ahead,
minimax's value and a uniform policy over its optimal moves at each step, the game's
rewards. What a size reaches there bounds what self-play can teach it. Prints a line per
measure, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from trellis.agents.common.baselines import board_index, minimax_lines, minimax_table
from trellis.agents.common.params import Params
from trellis.agents.common.self_play import masked_logits, select_games
from trellis.agents.muzero import MuZeroBuilder, MuZeroConfig
from trellis.agents.muzero.networks import MuZeroNet
from trellis.builders.experiments.self_play_run import restore_params
from trellis.envs.pgx_envs import PgxFactory
from trellis.launch.flags import load_run

SMOKE_FLAGS = ["--fit", "--hidden_sizes=16", "--latent_size=8", "--updates=2",
               "--eval_simulations=2"]
FACTORY = PgxFactory("pgx:tic_tac_toe")


def take(games: Any, rows: Any) -> Any:
    """The batched pgx states `games` at `rows`."""
    return jax.tree.map(lambda x: x[rows], games)


def reachable_positions(env: Any) -> Any:
    """Every position a game reaches with the mover to play and the game not over, once each
    (pgx's batched states, in breadth-first order from the empty board)."""
    frontier = take(env.init(jax.random.key(0)), None)
    step = jax.jit(jax.vmap(env.step))
    found, seen = [], set()
    while frontier.observation.shape[0]:
        keep = []
        for i, (index, over) in enumerate(zip(np.asarray(board_index(frontier.observation)),
                                              np.asarray(frontier.terminated), strict=True)):
            if not over and index not in seen:
                seen.add(index)
                keep.append(i)
        frontier = take(frontier, np.array(keep, int))
        found.append(frontier)
        rows, actions = np.nonzero(np.asarray(frontier.legal_action_mask))
        frontier = step(take(frontier, rows), jnp.asarray(actions))
    return jax.tree.map(lambda *xs: jnp.concatenate(xs), *found)


def moves_in_game(env: Any, games: Any) -> tuple[np.ndarray, np.ndarray]:
    """Each position's every move in the game: (its reward to the mover [N, 9], whether it ends
    the game [N, 9]); illegal moves' entries are 0 and False."""
    step = jax.vmap(env.step)

    def move(action: jax.Array) -> tuple[jax.Array, jax.Array]:
        after = step(games, jnp.full(games.current_player.shape, action))
        reward = jnp.take_along_axis(after.rewards, games.current_player[:, None], 1)[:, 0]
        return reward, after.terminated

    reward, ends = jax.jit(jax.vmap(move))(jnp.arange(9))
    legal = np.asarray(games.legal_action_mask)
    return np.where(legal, np.asarray(reward).T, 0), legal & np.asarray(ends).T


def measure(network: MuZeroNet, params: Params, builder: MuZeroBuilder, env: Any,
            games: Any) -> dict[str, Any]:
    """The measures of the module's docstring for the model `params` of `network`."""
    value_table, optimal_table = minimax_table()
    index = np.asarray(board_index(games.observation))
    value, optimal = value_table[index], optimal_table[index]
    legal = np.asarray(games.legal_action_mask)
    apply = jax.jit(lambda p, obs: network.apply(p, obs, method=MuZeroNet.initial_inference))
    recurrent = jax.jit(jax.vmap(
        lambda p, latent, a: network.apply(p, latent, jnp.full(latent.shape[:1], a),
                                           method=MuZeroNet.recurrent_inference),
        in_axes=(None, None, 0)))
    latent, logits, root = apply(params, games.observation)
    _, reward, _, after = (np.moveaxis(np.asarray(x), 0, 1)
                           for x in recurrent(params, latent, jnp.arange(9)))
    true_reward, ends = moves_in_game(env, games)
    q = np.where(legal, reward - after, -np.inf)
    rows = np.arange(len(index))
    out = {
        "positions": len(index),
        "root_value": float(np.mean(np.clip(np.round(np.asarray(root)), -1, 1) == value)),
        "prior_optimal": float(np.mean(optimal[rows, np.asarray(
            masked_logits(logits, games.legal_action_mask)).argmax(1)])),
        "q_optimal": float(np.mean(optimal[rows, q.argmax(1)])),
        "win_reward": float(reward[legal & (true_reward == 1)].mean()),
        "end_value": float(np.abs(after[ends]).mean()),
    }
    player = builder.make_search_player(network, env, params)
    searched, lost = minimax_lines(env, player, jax.random.key(0))
    out["lines"] = {"positions": searched, "lost": lost}
    return out


def exact_targets(env: Any, games: Any, num_unroll_steps: int):
    """`sample(key, n) -> batch`: n positions drawn uniformly from `games`, each with K random
    legal moves ahead and exact targets in `agents.muzero.losses.unroll_targets`' fields
    (past the game's end: moves at random, no policy target, value and reward 0)."""
    value_table, optimal_table = (jnp.asarray(t) for t in minimax_table())
    step = jax.vmap(env.step)

    def sample(key: jax.Array, n: int) -> dict[str, jax.Array]:
        pick, key = jax.random.split(key)
        state = first = jax.tree.map(
            lambda x: x[jax.random.randint(pick, (n,), 0, len(x))], games)
        steps: dict[str, list[jax.Array]] = {"action": [], "policy": [], "policy_mask": [],
                                              "value": [], "reward": []}
        over = jnp.zeros(n, bool)
        for k, move_key in enumerate(jax.random.split(key, num_unroll_steps + 1)):
            index = board_index(state.observation)
            best = optimal_table[index].astype(jnp.float32)
            steps["policy"].append(best / jnp.maximum(best.sum(-1, keepdims=True), 1))
            steps["policy_mask"].append((~over).astype(jnp.float32))
            steps["value"].append(jnp.where(over, 0.0, value_table[index].astype(jnp.float32)))
            if k == num_unroll_steps:
                break
            # Past the end any move: the model learns that nothing follows the end.
            legal = over[:, None] | state.legal_action_mask
            action = jax.random.categorical(move_key,
                                            masked_logits(jnp.zeros(legal.shape), legal))
            after = step(state, action)
            reward = jnp.take_along_axis(after.rewards, state.current_player[:, None], 1)[:, 0]
            steps["action"].append(action)
            steps["reward"].append(jnp.where(over, 0.0, reward))
            over = over | after.terminated
            # An ended game stays at its last position, whose later targets are masked.
            state = select_games(over, state, after)
        return {**{name: jnp.stack(x, axis=1) for name, x in steps.items()},
                "obs": first.observation.astype(jnp.float32), "weight": jnp.ones(n)}

    return sample


def fit(config: MuZeroConfig, network: MuZeroNet, env: Any, games: Any, updates: int,
        seed: int) -> tuple[Params, float]:
    """A fresh model trained by MuZero's update on `exact_targets`, `sample_batch_size`
    positions a step; (its params, updates per second)."""
    training = MuZeroBuilder(config).make_training(network, FACTORY.spec())
    sample = jax.jit(exact_targets(env, games, config.num_unroll_steps),
                     static_argnums=1)
    update = jax.jit(training.make_update(None))
    key, init_key = jax.random.split(jax.random.key(seed))
    state = training.init(init_key)
    started = time.monotonic()
    for i, update_key in enumerate(jax.random.split(key, updates)):
        state, metrics = update(state, sample(update_key, config.sample_batch_size))
        if (i + 1) % 1000 == 0 or i + 1 == updates:
            losses = "  ".join(f"{name} {float(v):.4f}" for name, v in sorted(metrics.items()))
            print(f"update {i + 1:,d}: {losses}  ({time.monotonic() - started:.0f} s)",
                  flush=True)
    return state.params, updates / (time.monotonic() - started)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", default=None, help="a MuZero run on pgx:tic_tac_toe to measure")
    p.add_argument("--fit", action="store_true", help="fit a fresh model on exact targets")
    p.add_argument("--hidden_sizes", default="128,128", help="--fit: the model's MLPs")
    p.add_argument("--latent_size", type=int, default=64, help="--fit: the latent's units")
    p.add_argument("--updates", type=int, default=6000, help="--fit: SGD steps")
    p.add_argument("--eval_simulations", type=int, default=200,
                   help="--fit: the search's simulations on minimax's lines")
    p.add_argument("--seed", type=int, default=0, help="--fit: the init's and samples' seed")
    args = p.parse_args()
    if (args.run is None) == (not args.fit):
        p.error("give one of --run=RUN_DIR and --fit")
    env = FACTORY.make()
    games = reachable_positions(env)
    if args.run is not None:
        settings = load_run(args.run)
        if settings.options.env != FACTORY.env_id:
            p.error(f"--run: a run on {FACTORY.env_id} (this one: {settings.options.env})")
        builder, factory = settings.build()
        if not isinstance(builder, MuZeroBuilder):
            p.error(f"--run: a MuZero run (this one: {type(builder).__name__})")
        _, params, step, _ = restore_params(builder, factory, settings.experiment.seed,
                                            args.run)
        network = builder.make_networks(factory.spec())
        source: dict[str, Any] = {"run": args.run, "checkpoint": step}
    else:
        sizes = tuple(int(n) for n in args.hidden_sizes.split(","))
        config = MuZeroConfig(hidden_sizes=sizes, latent_size=args.latent_size,
                              search_policy="gumbel", eval_simulations=args.eval_simulations)
        builder = MuZeroBuilder(config)
        network = builder.make_networks(FACTORY.spec())
        params, rate = fit(config, network, env, games, args.updates, args.seed)
        source = {"fit": {"hidden_sizes": sizes, "latent_size": args.latent_size,
                          "updates": args.updates, "seed": args.seed,
                          "updates_per_s": round(rate, 1)}}
    out = {**source, **{name: round(v, 3) if isinstance(v, float) else v
                        for name, v in measure(network, params, builder, env, games).items()}}
    for name, v in out.items():
        print(f"{name:<14} {v}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
