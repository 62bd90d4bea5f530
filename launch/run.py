"""Trains an agent: `python launch/run.py --agent=impala --platform=local_mp --env=CartPole-v1`.

Builds the agent's program graph, launches it on the chosen platform, shows progress while
it runs and writes `summary.json` into the run directory when it stops (budget reached,
return target reached, Ctrl-C/SIGTERM, or a node's error).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any

if __name__ == "__main__" and not __package__:
    # `python launch/run.py` puts launch/ itself first on sys.path, where `import launch`
    # would not find the package; the repository root belongs there instead.
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Only light imports at module level: spawned node processes re-import this module, and
# env workers should not pay for importing JAX. The rest is imported in `train`.
import launch  # noqa: E402
from agents.registry import AGENTS, agent_module  # noqa: E402
from launch.progress import Progress  # noqa: E402

PLATFORMS = ("local_mt", "local_mp")
# Flags that set a field of the agent's config (only allowed where the agent has it).
AGENT_FLAGS = ("unroll_length", "batch_size", "learning_rate")


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


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = _OneLineParser(prog="run.py", description=__doc__.splitlines()[0])
    p.add_argument("--agent", default="impala", choices=sorted(AGENTS))
    p.add_argument("--platform", default="local_mp", choices=PLATFORMS)
    p.add_argument("--env", default="CartPole-v1", help="a Gymnasium id")
    p.add_argument("--num_actors", type=int, default=2, help="env worker nodes")
    p.add_argument("--envs_per_actor", type=int, default=32, help="envs per env worker")
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
    return p.parse_args(argv)


def build(args: argparse.Namespace):
    """(builder, env factory, experiment config) from the flags; ValueError on bad values."""
    from builders import ExperimentConfig
    from envs import EnvFactory

    env_factory = EnvFactory(args.env)
    env_factory.validate()
    if args.replay_backend == "reverb":
        from reverb_tables import reverb_available

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
        total_env_steps=args.total_env_steps,
        stop_at_return=stop_at_return,
        seed=args.seed,
        unroll_queue=args.unroll_queue,
        replay_backend=args.replay_backend,
    )
    return module.Builder(agent_config), env_factory, config, agent_config


def _run_dir(args: argparse.Namespace) -> str:
    if args.logdir:
        path = args.logdir
    else:
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        path = os.path.join("runs", f"{args.agent}-{args.env.replace('/', '_')}-{stamp}")
    os.makedirs(path, exist_ok=True)
    return path


def _write_json(path: str, data: dict[str, Any]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2, default=str)
        f.write("\n")
    os.replace(tmp, path)  # Never a half-written file.


def train(args: argparse.Namespace) -> int:
    from builders import make_program
    from envs import UnknownEnvError

    try:
        builder, env_factory, config, agent_config = build(args)
    except (ValueError, UnknownEnvError, TypeError) as e:
        print(f"run.py: error: {e}", file=sys.stderr)
        return 2
    run_dir = _run_dir(args)
    _write_json(os.path.join(run_dir, "config.json"), {
        "agent": args.agent, "platform": args.platform, "env": args.env,
        "experiment": dataclasses.asdict(config), "agent_config": dataclasses.asdict(agent_config),
    })
    program = make_program(builder, env_factory, config, name=f"{args.agent}-{args.env}")
    progress = Progress(config.total_env_steps, quiet=args.quiet)
    stats: dict[str, Any] = {}
    # SIGTERM ends the run like Ctrl-C: nodes stopped, summary written.
    previous = signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    start = time.monotonic()
    running = launch.launch(program, platform=args.platform, block=False)
    try:
        learner = program.handles("learner")[0].dereference()
        pending = None
        result = None
        while result is None:
            result = running.wait(timeout=config.log_every_s)
            if pending is not None and pending.done():
                if pending.exception() is None:
                    stats = pending.result()
                    progress.update(stats)
                pending = None
            if result is None and pending is None:
                pending = learner.futures.stats()
    except KeyboardInterrupt:
        result = running.stop()
    finally:
        signal.signal(signal.SIGTERM, previous)
        progress.close()
    wall_time = time.monotonic() - start

    if result.stopped_by == "requested":
        stats, stopped_by = dict(result.info), result.reason
    else:
        stopped_by = result.stopped_by
    env_steps = int(stats.get("env_steps", 0))
    summary = {
        "agent": args.agent,
        "platform": args.platform,
        "env": args.env,
        "stopped_by": stopped_by,
        "env_steps": env_steps,
        "wall_time_s": round(wall_time, 3),
        "env_steps_per_s": round(env_steps / wall_time, 1) if wall_time > 0 else 0.0,
        "mean_return_last_100": stats.get("mean_return"),
        "episodes": stats.get("episodes", 0),
        "learner_steps": stats.get("learner_steps", 0),
        "stop_at_return": config.stop_at_return,
        "total_env_steps": config.total_env_steps,
    }
    if result.stopped_by == "error":
        summary["error"] = result.reason
    path = os.path.join(run_dir, "summary.json")
    _write_json(path, summary)
    print(
        f"stopped by {stopped_by} after {env_steps:,d} env steps in {wall_time:.1f} s "
        f"({summary['env_steps_per_s']:,.0f} steps/s), mean return (last 100 episodes) "
        f"{summary['mean_return_last_100']}"
    )
    print(f"summary: {path}")
    return result.exit_code


def _raise_keyboard_interrupt(signum, frame):
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    return train(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
