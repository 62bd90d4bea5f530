"""Evaluates a run's checkpoint: `python launch/evaluate.py RUN_DIR [--episodes=N] [--video=DIR]`.

Rebuilds the run's agent from the settings its config.json saved (launch/flags.py), restores
the newest checkpoint (or --step) as the agent's kind says (builders/experiments/restore.py),
plays N episodes with the greedy policy on fresh envs (a self-play agent: N games against a
baseline) and prints the mean return (a line for people, then one JSON line for scripts). With
--video, episodes are recorded with Gymnasium's RecordVideo in the run's env (its kwargs and
wrappers; the env must render rgb arrays; needs `pip install moviepy`).
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
from trellis.builders.experiments.restore import RestoreError, Wanted  # noqa: E402
from trellis.builders.experiments.session import restore_run_member  # noqa: E402
from trellis.launch.flags import UsageError, load_run  # noqa: E402


class _OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = _OneLineParser(prog="evaluate.py", description=__doc__.splitlines()[0])
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("--episodes", type=int, default=10)
    p.add_argument("--step", type=int, default=None,
                   help="the checkpoint's env steps (default: the newest)")
    p.add_argument("--seed", type=int, default=12345, help="seed of the evaluation envs")
    p.add_argument("--member", type=int, default=0,
                   help="an anakin population's member to evaluate (default: the first)")
    p.add_argument("--opponent", default=None,
                   help="self-play runs (alphazero): the baseline the games are against "
                   "(random, mcts, minimax; default: the run's eval_opponent)")
    p.add_argument("--video", default=None, metavar="DIR",
                   help="record the episodes as videos into DIR (one env, rgb_array rendering)")
    args = p.parse_args(argv)
    if args.episodes < 1:
        p.error(f"--episodes must be >= 1, got {args.episodes}")
    return args


class _Error(Exception):
    """Bad input or a bad checkpoint: one line for the user, exit code 2."""


def evaluate(args: argparse.Namespace) -> dict[str, Any]:
    """Restores the run's member as its agent's kind says (`session.restore_run_member`), plays
    it, and returns {return_mean, return_min, return_max, episodes, checkpoint_env_steps,
    learner_steps, ...} (a population's member; a self-play run's opponent and win, draw and
    loss rates)."""
    try:  # The run's saved settings, as the run used them: no flags, no defaults re-parsed.
        settings = load_run(args.run_dir)
        builder, env_factory = settings.build()
    except (UsageError, ValueError) as e:  # ValueError: an extra the run needs is missing.
        raise _Error(str(e)) from e
    wanted = Wanted(args.run_dir, settings.options.platform, settings.options.num_seeds,
                    args.step, args.member, args.opponent)
    try:
        member = restore_run_member(builder, env_factory, settings.experiment, wanted)
        result = (member.record(args.episodes, args.seed, args.video) if args.video
                  else member.play(args.episodes, args.seed))
    except (RestoreError, CheckpointError, AnakinError) as e:
        raise _Error(str(e)) from e
    return {**result, "checkpoint_env_steps": member.step,
            "learner_steps": member.progress.get("learner_steps")}


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        result = evaluate(args)
    except _Error as e:
        print(f"evaluate.py: error: {e}", file=sys.stderr)
        return 2
    print(f"mean return {result['return_mean']:.2f} over {result['episodes']} episodes "
          f"(min {result['return_min']:.1f}, max {result['return_max']:.1f}); checkpoint at "
          f"{result['checkpoint_env_steps']:,d} env steps"
          + (f"; videos in {args.video}" if args.video else ""))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
