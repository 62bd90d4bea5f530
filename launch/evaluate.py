"""Evaluates a run's checkpoint: `python launch/evaluate.py RUN_DIR [--episodes=N] [--video=DIR]`.

Rebuilds the run's agent from the settings its config.json saved (launch/flags.py), restores
the newest readable checkpoint (or --step) as the agent's kind says (builders/experiments/
restore.py, through launch/loaded_policy.py; a damaged newer one is passed over with one
warning line, as --resume does, and left in place), plays N episodes with the greedy policy on
fresh envs (a self-play agent: N games against a baseline) and prints the mean return (a line
for people, then one JSON line for scripts). With --video=DIR, each episode is also written as
DIR/step-S-episode-I.mp4, played in the run's env (its kwargs, wrappers and preprocessing) and
drawn by its factory (every family that renders: Gymnasium ids, envpool's Atari with its raw
screen, MinAtar, gymnax, Brax, Playground; builders/experiments/recording.py; the `video` extra).
With --export=DIR, the greedy policy is written instead, as
DIR/policy.jax (`jax.export`, params inside) and DIR/spec.json (launch/loaded_policy.py),
with --onnx DIR/policy.onnx too (launch/onnx_policy.py); existing files are kept unless --force.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import types
from collections.abc import Sequence
from typing import Any, NoReturn

if not __package__:  # Run as a file from a clone, also in spawned nodes: docs/architecture.md.
    _root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p) != os.path.join(_root, "launch")]
    sys.modules["trellis"] = types.ModuleType("trellis", f"Trellis from the clone at {_root}")
    sys.modules["trellis"].__path__ = [_root]

from trellis.builders.experiments.anakin_run import AnakinError  # noqa: E402
from trellis.builders.experiments.checkpointing import CheckpointError  # noqa: E402
from trellis.launch.flags import UsageError  # noqa: E402
from trellis.launch.loaded_policy import SPEC_FILE, load_policy, rebuild  # noqa: E402


class _OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = _OneLineParser(prog="evaluate.py", description=__doc__.splitlines()[0])
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("--episodes", type=int, default=10)
    p.add_argument("--step", type=int, default=None,
                   help="the checkpoint's env steps (default: the newest readable)")
    p.add_argument("--seed", type=int, default=12345, help="seed of the evaluation envs")
    p.add_argument("--member", type=int, default=0,
                   help="an anakin population's member to evaluate (default: the first)")
    p.add_argument("--opponent", default=None,
                   help="self-play runs (alphazero): the baseline the games are against "
                   "(random, mcts, minimax; default: the run's eval_opponent)")
    p.add_argument("--video", default=None, metavar="DIR",
                   help="also write each episode as an MP4 into DIR (one env at a time, drawn "
                   "by the env's factory; the video extra)")
    p.add_argument("--export", default=None, metavar="DIR",
                   help="write the greedy policy to DIR/policy.jax (jax.export, params inside) "
                   "and DIR/spec.json instead of playing")
    p.add_argument("--onnx", action="store_true",
                   help="--export: also write DIR/policy.onnx (jax2onnx: the onnx extra; "
                   "feed-forward policies of single-agent envs)")
    p.add_argument("--force", action="store_true",
                   help="--export: overwrite DIR's policy.jax and spec.json (and policy.onnx)")
    args = p.parse_args(argv)
    if args.episodes < 1:
        p.error(f"--episodes must be >= 1, got {args.episodes}")
    if args.onnx and not args.export:
        p.error("--onnx writes DIR/policy.onnx with --export=DIR: give --export")
    return args


class _Error(Exception):
    """Bad input or a bad checkpoint: one line for the user, exit code 2."""


def evaluate(args: argparse.Namespace) -> dict[str, Any]:
    """Restores the run's member as its agent's kind says (`session.restore_run_member`), plays
    it, and returns {return_mean, return_min, return_max, episodes, checkpoint_env_steps,
    learner_steps, ...} (a population's member; a self-play run's opponent and win, draw and
    loss rates)."""
    try:  # The run's saved settings, as the run used them: no flags, no defaults re-parsed.
        member = rebuild(args.run_dir).member(args.step, args.member, args.opponent)
        result = (member.record(args.episodes, args.seed, args.video) if args.video
                  else member.play(args.episodes, args.seed))
    # ValueError: an extra the run needs is missing (RestoreError is one).
    except (UsageError, ValueError, CheckpointError, AnakinError) as e:
        raise _Error(str(e)) from e
    return {**result, "checkpoint_env_steps": member.step,
            "learner_steps": member.progress.get("learner_steps")}


def export(args: argparse.Namespace) -> dict[str, Any]:
    """Writes the run's greedy policy to `args.export` (`LoadedPolicy.export`); returns
    {export, spec, checkpoint_env_steps}: the paths written and spec.json's content."""
    try:
        policy = load_policy(args.run_dir, args.step, args.member)
        path = policy.export(args.export, force=args.force, onnx=args.onnx)
    except (UsageError, ValueError, CheckpointError, AnakinError) as e:  # LoadError is one.
        raise _Error(str(e)) from e
    with open(os.path.join(args.export, SPEC_FILE)) as f:
        spec = json.load(f)
    return {"export": path, "spec": spec, "checkpoint_env_steps": policy.step}


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        result = export(args) if args.export else evaluate(args)
    except _Error as e:
        print(f"evaluate.py: error: {e}", file=sys.stderr)
        return 2
    if args.export:
        print(f"exported the greedy policy at {result['checkpoint_env_steps']:,d} env steps to "
              f"{result['export']} (spec.json beside it)")
        print(json.dumps(result))
        return 0
    print(f"mean return {result['return_mean']:.2f} over {result['episodes']} episodes "
          f"(min {result['return_min']:.1f}, max {result['return_max']:.1f}); checkpoint at "
          f"{result['checkpoint_env_steps']:,d} env steps"
          + (f"; videos in {args.video}" if args.video else ""))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
