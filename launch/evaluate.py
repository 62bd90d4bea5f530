"""Evaluates a run's checkpoint: `python launch/evaluate.py RUN_DIR [--episodes=N] [--video=DIR]`.

Rebuilds the run's agent from the settings its config.json saved (launch/flags.py), restores
the newest checkpoint (or --step), plays N episodes with the greedy policy on fresh envs and
prints the mean return (a line for people, then one JSON line for scripts). With --video,
episodes are recorded with Gymnasium's RecordVideo (the env must render rgb arrays; needs
`pip install moviepy`).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import types
from collections.abc import Sequence

if not __package__:  # Run as a file from a clone, also in spawned nodes: docs/architecture.md.
    _root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p) != os.path.join(_root, "launch")]
    sys.modules["trellis"] = types.ModuleType("trellis", f"Trellis from the clone at {_root}")
    sys.modules["trellis"].__path__ = [_root]

import gymnasium as gym  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402

from trellis.builders.contract.agent import EPISODES, SELF_PLAY  # noqa: E402
from trellis.builders.experiments.anakin_run import AnakinError, restore_member  # noqa: E402
from trellis.builders.experiments.checkpointing import (  # noqa: E402
    Checkpointer,
    CheckpointError,
    checkpoint_dir,
)
from trellis.builders.experiments.device_evaluation import play_episodes  # noqa: E402
from trellis.builders.experiments.evaluation import run_episodes, summarize  # noqa: E402
from trellis.builders.experiments.self_play_run import outcome_rates, restore_params  # noqa: E402
from trellis.launch.flags import ANAKIN, RunSettings, UsageError, load_run  # noqa: E402


class _OneLineParser(argparse.ArgumentParser):
    def error(self, message: str):
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


def load_policy(run_dir: str, step: int | None = None):
    """The run's greedy policy with the checkpoint's params.

    Returns:
      (policy, initial_state(num_envs) -> the policy's state, params, env_factory,
      checkpoint step, progress of that checkpoint).

    Raises:
      _Error: the run's config or checkpoint is missing or unreadable.
    """
    try:  # The run's saved settings, as the run used them: no flags, no defaults re-parsed.
        builder, env_factory = load_run(run_dir).build()
    except (UsageError, ValueError) as e:
        raise _Error(str(e)) from e
    spec = env_factory.spec()
    networks = builder.make_networks(spec)
    learner = builder.make_learner(networks, spec, jax.random.PRNGKey(0))
    directory = checkpoint_dir(run_dir)
    if not os.path.isdir(directory):
        raise _Error(f"no checkpoints in {directory}")
    checkpointer = Checkpointer(directory)
    try:
        step = checkpointer.latest_step() if step is None else step
        state, progress = checkpointer.restore(learner.state, step)
    except CheckpointError as e:
        raise _Error(str(e)) from e
    finally:
        checkpointer.close()
    learner.restore(state)
    policy = jax.jit(builder.make_policy(networks, evaluation=True))
    initial_state = functools.partial(builder.initial_state, spec)
    return policy, initial_state, jax.device_get(learner.params), env_factory, step, progress


def _record(policy, initial_state, params, env_factory, episodes: int, seed: int,
            video_dir: str):
    env = gym.make(env_factory.env_id, render_mode="rgb_array", **dict(env_factory.kwargs))
    try:
        env = gym.wrappers.RecordVideo(env, video_dir, episode_trigger=lambda _: True,
                                       disable_logger=True)
    except gym.error.DependencyNotInstalled as e:
        raise _Error(f"--video needs moviepy: pip install moviepy ({e})") from e
    key = jax.random.PRNGKey(seed)
    returns = []
    for i in range(episodes):
        obs, _ = env.reset(seed=seed + i)
        total, done = 0.0, False
        state, first = initial_state(1), np.ones(1, bool)
        while not done:
            key, step_key = jax.random.split(key)
            action, _, state = policy(params, step_key, np.asarray(obs)[None], state, first)
            first = np.zeros(1, bool)
            obs, reward, terminated, truncated, _ = env.step(np.asarray(action)[0])
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return returns


def _evaluate_anakin(args: argparse.Namespace, settings: RunSettings) -> dict:
    """A member of an anakin run (of an ES run: its search mean), greedy, in fresh JAX envs, one
    episode each."""
    if args.video:
        raise _Error("--video records Gymnasium envs; this run's env is written in JAX")
    builder, env_factory = settings.build()
    if builder.capabilities.learns_from == EPISODES:  # One search, not a population: its mean.
        policy, _, params, _, step, progress = load_policy(args.run_dir, args.step)
        env = env_factory.make()
    else:
        try:
            anakin, params, step, progress = restore_member(
                builder, env_factory, settings.experiment, settings.options.num_seeds,
                args.run_dir, args.step, args.member)
        except (AnakinError, CheckpointError) as e:
            raise _Error(str(e)) from e
        policy = builder.make_policy(builder.make_networks(env_factory.spec()), evaluation=True)
        env = anakin.env
    play = jax.jit(functools.partial(play_episodes, env, policy, initial_state={},
                                     num_episodes=args.episodes))
    result = summarize(np.asarray(play(params, key=jax.random.key(args.seed))).tolist())
    result.update(checkpoint_env_steps=step, learner_steps=progress.get("learner_steps"),
                  member=args.member)
    return result


def _evaluate_self_play(args: argparse.Namespace, settings: RunSettings) -> dict:
    """A self-play run (alphazero): its search plays `--episodes` games against a baseline,
    half moving first; the returns are the outcomes (1 win, 0 draw, -1 loss)."""
    if args.video:
        raise _Error("--video records Gymnasium envs; this run's game is written in JAX")
    builder, env_factory = settings.build()
    opponent = args.opponent or builder.config.eval_opponent
    try:
        program, params, step, progress = restore_params(
            builder, env_factory, settings.experiment.seed, args.run_dir, args.step)
        outcomes = program.outcomes(params, opponent, jax.random.key(args.seed),
                                    args.episodes)
    except (AnakinError, CheckpointError) as e:
        raise _Error(str(e)) from e
    result = summarize(outcomes.tolist())
    result.update(checkpoint_env_steps=step, learner_steps=progress.get("learner_steps"),
                  opponent=opponent, **outcome_rates(outcomes))
    return result


def evaluate(args: argparse.Namespace) -> dict:
    """Restores, plays, and returns {return_mean, return_min, return_max, episodes, ...}."""
    try:
        settings = load_run(args.run_dir)
        builder, _ = settings.build()
    except (UsageError, ValueError) as e:  # ValueError: an extra the run needs is missing.
        raise _Error(str(e)) from e
    if builder.capabilities.learns_from == SELF_PLAY:
        return _evaluate_self_play(args, settings)
    if settings.options.platform == ANAKIN:
        return _evaluate_anakin(args, settings)
    policy, initial_state, params, env_factory, step, progress = load_policy(args.run_dir,
                                                                             args.step)
    if args.video:
        returns = _record(policy, initial_state, params, env_factory, args.episodes, args.seed,
                          args.video)
    else:
        envs = env_factory.make_vector(args.episodes, seed=args.seed)
        try:
            returns = run_episodes(policy, params, envs, args.episodes,
                                   jax.random.PRNGKey(args.seed), args.seed,
                                   initial_state(args.episodes))
        finally:
            envs.close()
    result = summarize(returns)
    result.update(checkpoint_env_steps=step, learner_steps=progress.get("learner_steps"))
    return result


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
