"""Trains an agent: `python launch/run.py --agent=impala --platform=local_mp --env=CartPole-v1`.

Builds the agent's program graph, launches it on the chosen platform, shows progress while
it runs, and keeps a run directory (`runs/AGENT-ENV-TIME/` or --logdir; see launch/rundir.py):
config.json, metrics.jsonl, TensorBoard events and checkpoints while it runs, summary.json
and learning_curve.png when it stops (budget reached, return target reached, Ctrl-C/SIGTERM,
or a node's error). `--resume RUN_DIR` continues a run from its newest checkpoint.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.machinery
import importlib.util
import json
import math
import os
import sys
from collections.abc import Sequence

if not __package__:
    # Run as a file from a clone (`python launch/X.py`; spawned node processes re-run it so):
    # the clone's folders are the `trellis` package, and launch/ itself must not shadow modules.
    _root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p) != os.path.join(_root, "launch")]
    _spec = importlib.machinery.ModuleSpec("trellis", None, is_package=True)
    _spec.submodule_search_locations = [_root]
    sys.modules["trellis"] = importlib.util.module_from_spec(_spec)

# Only light imports at module level: spawned node processes re-import this module, and
# env workers should not pay for importing JAX. The rest is imported in `train`.
from trellis.agents.registry import AGENTS, agent_module  # noqa: E402
from trellis.builders.rundir import CONFIG, new_run_dir  # noqa: E402

PLATFORMS = ("local_mt", "local_mp", "ray")
# Flags that set a field of the agent's config (only allowed where the agent has it).
AGENT_FLAGS = ("unroll_length", "batch_size", "learning_rate")
# What a resumed run may not change: the checkpoint holds this agent's state on this env.
FIXED_ON_RESUME = ("agent", "env")


class _OneLineParser(argparse.ArgumentParser):
    """Bad input: one line naming what is wrong and what is allowed, exit code 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def _stop_at_return(value: str) -> float | str | None:
    if value.lower() in ("none", "off"):
        return None
    if value == "auto":  # Resolved in `build` once the env is known.
        return value
    try:
        out = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or 'none', got {value!r}") from None
    if not math.isfinite(out):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {value!r}")
    return out


def _parser() -> argparse.ArgumentParser:
    p = _OneLineParser(prog="run.py", description=__doc__.splitlines()[0])
    p.add_argument("--agent", default="impala", choices=sorted(AGENTS))
    p.add_argument("--platform", default="local_mp", choices=PLATFORMS)
    p.add_argument("--ray_address", default=None,
                   help="--platform=ray: 'auto' or HOST:PORT joins a running Ray cluster; "
                   "unset starts a local Ray instance for this run (see docs/cluster.md)")
    p.add_argument("--env", default="CartPole-v1", help="a Gymnasium id")
    p.add_argument("--num_actors", type=int, default=2, help="env worker nodes")
    p.add_argument("--envs_per_actor", type=int, default=32, help="envs per env worker")
    p.add_argument("--max_actor_restarts", type=int, default=3,
                   help="times each env worker is restarted after it dies or its env raises")
    p.add_argument("--unroll_length", type=int, default=None, help="agent default if unset")
    p.add_argument("--batch_size", type=int, default=None, help="agent default if unset")
    p.add_argument("--learning_rate", type=float, default=None, help="agent default if unset")
    p.add_argument("--total_env_steps", type=int, default=2_000_000)
    p.add_argument(
        "--stop_at_return", type=_stop_at_return, default="auto",
        help="stop once the mean return over the last 100 episodes reaches this; default: "
        "the env's Gymnasium reward_threshold (475 for CartPole-v1); 'none' to disable",
    )
    p.add_argument("--unroll_queue", default="local", choices=("local", "replay"),
                   help="how unrolls reach the learner: an in-process queue, or a Queue table "
                   "on a replay node")
    p.add_argument("--replay_backend", default="native", choices=("native", "reverb"),
                   help="replay tables' backend (reverb needs dm-reverb installed)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--logdir", default=None, help="run directory (default runs/AGENT-ENV-TIME)")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.add_argument("--checkpoint_every_s", type=float, default=60.0,
                   help="seconds between learner checkpoints (one is also written at stop)")
    p.add_argument("--keep_checkpoints", type=int, default=3, help="newest checkpoints kept")
    # Off by default: the evaluator is one more process with its own JAX, which on a small
    # machine competes with the learner for cores (IMPALA on CartPole to 475, local_mp, 2 cores:
    # 14.1 s without, 19.3 s with, one run each).
    p.add_argument("--eval_every", type=int, default=0,
                   help="env steps between evaluations of the greedy policy (e.g. 50000); "
                   "0: no evaluator node")
    p.add_argument("--eval_episodes", type=int, default=10, help="episodes per evaluation")
    p.add_argument("--resume", default=None, metavar="RUN_DIR",
                   help="continue this run from its newest checkpoint, with its settings "
                   "(flags given here override them, except --agent and --env)")
    return p


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The flags; with --resume, the run's saved settings overridden by the flags given."""
    args = _parser().parse_args(argv)
    if args.resume is None:
        return args
    # The flags given explicitly: parsed again with a sentinel (not a string, which argparse
    # would convert with the flag's type) as every default.
    absent = object()
    explicit = _parser()
    explicit.set_defaults(**{name: absent for name in vars(args)})
    given = {k: v for k, v in vars(explicit.parse_args(argv)).items() if v is not absent}
    path = os.path.join(args.resume, CONFIG)
    try:
        with open(path) as f:
            saved = json.load(f)["args"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as e:
        _parser().exit(2, f"run.py: error: --resume: cannot read the run's settings from "
                          f"{path}: {type(e).__name__}: {e}\n")
    for name in FIXED_ON_RESUME:
        if name in given and given[name] != saved.get(name):
            _parser().exit(2, f"run.py: error: --{name} cannot change on --resume (the run "
                              f"used {saved.get(name)!r})\n")
    merged = dict(vars(args))
    merged.update({k: v for k, v in saved.items() if k in merged})
    merged.update(given)
    merged["resume"], merged["logdir"] = args.resume, args.resume
    return argparse.Namespace(**merged)


def build(args: argparse.Namespace):
    """(builder, env factory, experiment config) from the flags; ValueError on bad values."""
    from trellis.builders.config import ExperimentConfig
    from trellis.envs import EnvFactory

    env_factory = EnvFactory(args.env)
    env_factory.validate()
    if args.replay_backend == "reverb":
        from trellis.reverb_tables import reverb_available

        if not reverb_available():
            raise ValueError("--replay_backend=reverb needs dm-reverb, which is not installed "
                             "here (`make test-reverb` builds .venv-reverb with it); use native")
    module = agent_module(args.agent)
    fields = {f.name for f in dataclasses.fields(module.Config)}
    overrides = {}
    for name in AGENT_FLAGS:
        value = getattr(args, name)
        if value is None:
            continue
        if name not in fields:
            raise ValueError(f"--{name} does not apply to agent {args.agent!r}")
        overrides[name] = value
    agent_config = module.Config(**overrides)
    stop_at_return = args.stop_at_return
    if stop_at_return == "auto":
        import gymnasium

        stop_at_return = gymnasium.spec(args.env).reward_threshold
    config = ExperimentConfig(
        num_actors=args.num_actors,
        envs_per_actor=args.envs_per_actor,
        max_actor_restarts=args.max_actor_restarts,
        total_env_steps=args.total_env_steps,
        stop_at_return=stop_at_return,
        seed=args.seed,
        unroll_queue=args.unroll_queue,
        replay_backend=args.replay_backend,
        checkpoint_every_s=args.checkpoint_every_s,
        keep_checkpoints=args.keep_checkpoints,
        eval_every=args.eval_every,
        eval_episodes=args.eval_episodes,
    )
    return module.Builder(agent_config), env_factory, config, agent_config


def train(args: argparse.Namespace) -> int:
    """Runs the experiment the flags describe; returns the exit code (2: bad input)."""
    from trellis.builders.checkpointing import CheckpointError
    from trellis.builders.experiment import run_experiment
    from trellis.envs import UnknownEnvError

    try:
        builder, env_factory, config, agent_config = build(args)
    except (ValueError, UnknownEnvError, TypeError) as e:
        print(f"run.py: error: {e}", file=sys.stderr)
        return 2
    run_dir = args.logdir or new_run_dir(args.agent, args.env)
    settings = {"agent": args.agent, "platform": args.platform, "args": vars(args)}
    extra = {}
    if getattr(agent_config, "learning_rate", None) is not None:
        extra["learning_rate"] = agent_config.learning_rate  # Constant: no schedules yet.
    platform_options = {}
    if args.platform == "ray":
        platform_options["ray_address"] = args.ray_address
    elif args.ray_address is not None:
        print("run.py: error: --ray_address needs --platform=ray", file=sys.stderr)
        return 2
    try:
        summary = run_experiment(builder, env_factory, config, run_dir, platform=args.platform,
                                 platform_options=platform_options,
                                 quiet=args.quiet, resume=args.resume is not None,
                                 settings=settings, extra_metrics=extra)
    except CheckpointError as e:
        print(f"run.py: error: --resume: {e}", file=sys.stderr)
        return 2
    print(
        f"stopped by {summary['stopped_by']} after {summary['env_steps']:,d} env steps in "
        f"{summary['session_wall_time_s']:.1f} s ({summary['env_steps_per_s']:,.0f} steps/s), "
        f"mean return (last 100 episodes) {summary['mean_return_last_100']}"
    )
    print(f"summary: {os.path.join(run_dir, 'summary.json')}")
    return summary["exit_code"]


def main(argv: Sequence[str] | None = None) -> int:
    return train(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
