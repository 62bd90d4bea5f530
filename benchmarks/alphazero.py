"""Self-play agents (AlphaZero, MuZero) on a pgx game: M minutes of training, then baselines.

Usage: python benchmarks/alphazero.py [--agent=alphazero|muzero] --game=GAME --minutes=M
       [--games=100] [--seed=0]
       [--baselines=random,mcts,minimax] [--keep_run=DIR] [run.py's flags for the agent,
       e.g. --search_policy=gumbel --num_simulations=32]

`launch/run.py --agent=AGENT --platform=anakin --env=pgx:GAME` is started as a user starts
it (the game's preset applying: agents/alphazero/config.py) and stopped with Ctrl-C (SIGINT: a
final checkpoint) M minutes after its launch, imports and compilation included (or at its
first metrics record, if its start-up took longer), or ends first at its env-step budget where
`--total_env_steps` or the preset gives one it reaches (tic-tac-toe's: 300k moves); the
checkpoint's search then plays `--games` games against each baseline of
agents/common/baselines.py (random, roll-out MCTS with --mcts_simulations, minimax on
tic-tac-toe), half of them moving first; against minimax it also follows every line of
minimax's optimal moves from both sides (`baselines.minimax_lines`: exact, where 100 games
sample). Prints a line per baseline, then one JSON line: {"vs_minimax": {"win", "draw",
"loss"}, "minimax_lines": {"positions", "lost"}, "vs_random": ..., "vs_mcts": ..., "train": ...}.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import jax
from common import child_process

from trellis.agents.alphazero import AlphaZeroBuilder
from trellis.agents.common.baselines import minimax_lines
from trellis.agents.muzero import MuZeroBuilder
from trellis.builders.experiments.rundir import read_json
from trellis.builders.experiments.self_play_run import outcome_rates, restore_params
from trellis.launch.flags import UsageError, load_run, parse, preset_settings

SMOKE_FLAGS = ["--game=tic_tac_toe", "--minutes=0.1", "--games=2", "--baselines=random",
               "--unroll_length=9", "--batch_size=8", "--num_simulations=2",
               "--eval_every_updates=0"]
RUN_PY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "launch",
                      "run.py")


def train(agent: str, game: str, minutes: float, run_dir: str, flags: list[str]) -> dict:
    """run.py until its budget or for `minutes` from its launch, then SIGINT; its
    summary.json."""
    run = [f"--agent={agent}", "--platform=anakin", f"--env=pgx:{game}"]
    # No budget but the time unless the game's preset or `flags` give one (the last of a flag
    # counts); a bad flag fails here in one line, before anything starts.
    try:
        preset = preset_settings(agent, parse([*run, *flags]).options.preset)
    except UsageError as e:
        raise SystemExit(f"alphazero.py: {e}") from None
    budget = [] if "total_env_steps" in preset else ["--total_env_steps=1000000000"]
    command = [sys.executable, RUN_PY, *run, f"--logdir={run_dir}", "--quiet", *budget, *flags]
    launched = time.monotonic()
    metrics = os.path.join(run_dir, "metrics.jsonl")
    # Stopped with its group if this benchmark is interrupted or terminated first.
    with child_process(command) as process:
        try:
            process.wait(timeout=minutes * 60)
        except subprocess.TimeoutExpired:
            # Ctrl-C stops a run cleanly once its session runs (its first record is written);
            # before that (start-up longer than M minutes) it would only interrupt the start.
            while process.poll() is None and not (
                    os.path.exists(metrics) and os.path.getsize(metrics) > 0):
                time.sleep(0.5)
            process.send_signal(signal.SIGINT)
            process.wait()
    summary_path = os.path.join(run_dir, "summary.json")
    if not os.path.exists(summary_path):
        raise SystemExit(f"alphazero.py: run.py exited with {process.returncode} and no "
                         f"summary after {time.monotonic() - launched:.0f} s")
    return read_json(summary_path)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--agent", default="alphazero", choices=("alphazero", "muzero"),
                   help="the self-play agent (muzero: its search plans with a learned model)")
    p.add_argument("--game", default="tic_tac_toe", help="a pgx two-player game id")
    p.add_argument("--minutes", type=float, default=10.0, help="training time from launch")
    p.add_argument("--games", type=int, default=100, help="games against each baseline")
    p.add_argument("--seed", type=int, default=0, help="seed of the evaluation games")
    p.add_argument("--baselines", default=None,
                   help="comma-separated (random, mcts, minimax); default: all the game has")
    p.add_argument("--keep_run", default=None, help="keep the run directory here")
    args, flags = p.parse_known_args()
    with tempfile.TemporaryDirectory() as runs:
        run_dir = args.keep_run or os.path.join(runs, "run")
        summary = train(args.agent, args.game, args.minutes, run_dir, flags)
        settings = load_run(run_dir)
        builder, env_factory = settings.build()
        assert isinstance(builder, AlphaZeroBuilder | MuZeroBuilder)
        program, params, step, _ = restore_params(builder, env_factory,
                                                  settings.experiment.seed, run_dir)
    baselines = (args.baselines.split(",") if args.baselines else
                 ["random", "mcts"] + (["minimax"] if args.game == "tic_tac_toe" else []))
    out: dict = {"game": args.game, "minutes": args.minutes, "games": args.games,
                 "mcts_simulations": builder.config.mcts_simulations,
                 "train": {k: summary.get(k) for k in (
                     "stopped_by", "wall_time_s", "env_steps", "learner_steps",
                     "self_play_games", "env_steps_per_s", "steady_env_steps_per_s")}}
    for i, name in enumerate(baselines):
        started = time.monotonic()
        outcomes = program.outcomes(params, name, jax.random.key(args.seed + i), args.games)
        rates = outcome_rates(outcomes)
        out[f"vs_{name}"] = rates
        print(f"vs {name:<8} win {rates['win']:.2f}  draw {rates['draw']:.2f}  loss "
              f"{rates['loss']:.2f}  ({args.games} games, {time.monotonic() - started:.0f} s; "
              f"checkpoint at {step:,d} moves)", flush=True)
    if "minimax" in baselines:
        player = builder.make_search_player(program.networks, program.env, params)
        positions, lost = minimax_lines(program.env, player, jax.random.key(args.seed))
        out["minimax_lines"] = {"positions": positions, "lost": lost}
        print(f"vs minimax's every optimal line, from both sides: {lost} of its moves in "
              f"{positions} positions lose a drawn game", flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
