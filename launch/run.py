"""Trains an agent: `python launch/run.py --agent=impala --platform=local_mp --env=CartPole-v1`.

Builds the agent's program graph, launches it on the chosen platform, shows progress while
it runs, and keeps a run directory (`runs/AGENT-ENV-TIME/` or --logdir; see
builders/experiments/rundir.py):
config.json, metrics.jsonl, TensorBoard events and checkpoints while it runs, summary.json
and learning_curve.png when it stops (budget reached, return target reached, Ctrl-C/SIGTERM,
or a node's error). `--resume RUN_DIR` continues a run from its newest checkpoint.

Every field of the experiment's and the agent's config is a flag (launch/flags.py;
`--agent=X --help` lists them); `--config=FILE` sets them from a JSON or YAML file.
`--list_presets` lists the env families and the presets each agent has for them.
"""

from __future__ import annotations

import contextlib
import os
import sys
import types
from collections.abc import Sequence
from typing import Any

if not __package__:  # Run as a file from a clone, also in spawned nodes: docs/architecture.md.
    _root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p) != os.path.join(_root, "launch")]
    sys.modules["trellis"] = types.ModuleType("trellis", f"Trellis from the clone at {_root}")
    sys.modules["trellis"].__path__ = [_root]

# Only light imports at module level: multiprocessing re-runs this module's top level in each
# node process of local_mp (spawned or forked), and env workers must not pay for importing JAX. The
# agents and the experiment layer are imported in `build` and `train`, in the launcher only.
from trellis.builders.experiments.rundir import (  # noqa: E402
    CONFIG,
    RunDirInUse,
    claim,
    new_run_dir,
)
from trellis.launch.flags import (  # noqa: E402
    ANAKIN,
    RunSettings,
    UsageError,
    list_presets,
    parse,
    platform_of,
    preset_line,
)


class RunError(Exception):
    """A run that cannot start or resume as asked: one line for the user, exit code 2."""


def execute(run: RunSettings, argv: Sequence[str]) -> tuple[str, dict[str, Any]]:
    """Runs the experiment of `run` (parsed from `argv`) in its run directory: the command
    line's and `trellis.train`'s one path (launch/api.py).

    Returns:
      (the run directory, the run's summary).

    Raises:
      RunError: bad input found once the agent or env is built, or a run directory that cannot
        be used (holds a run, is in use, has no checkpoint to resume).
    """
    from trellis.builders.contract.policy_mapping import PolicyMappingError
    from trellis.builders.experiments.anakin_run import AnakinError
    from trellis.builders.experiments.checkpointing import CheckpointError
    from trellis.builders.experiments.recording import check_recordable
    from trellis.builders.experiments.session import (
        UnsupportedError,
        compile_cache,
        compile_cache_dir,
        run_experiment,
    )
    from trellis.builders.experiments.tracking import backend, tracked
    from trellis.envs.errors import UnknownEnvError

    try:
        builder, env_factory = run.build()
        # Before anything starts (ValueErrors both): a tracker's or the video's extra missing,
        # an env that does not render.
        if run.options.track is not None:
            backend(run.options.track)
        if run.experiment.video:
            check_recordable(env_factory)
    except ValueError as e:
        raise RunError(str(e)) from e
    options = run.options
    if (options.logdir is not None and options.resume is None
            and os.path.exists(os.path.join(options.logdir, CONFIG))):
        # Its metrics, checkpoints and summary would mix with this run's.
        raise RunError(f"--logdir={options.logdir} holds a run already ({CONFIG}): "
                       f"--resume={options.logdir} continues it; a new run needs a new directory")
    run_dir = options.logdir or new_run_dir(options.agent, options.env)
    cache = None if options.no_compile_cache else compile_cache_dir(run_dir)
    try:
        with claim(run_dir), compile_cache(cache), tracked(options.track, run_dir) as tracker:
            summary = run_experiment(
                builder, env_factory, run.experiment, run_dir, platform=run.platform(),
                quiet=options.quiet,
                resume=options.resume is not None, options=run.saved_options(),
                argv=list(argv), tracker=tracker)
            if run.experiment.video and summary["exit_code"] == 0:
                final_video(run, builder, env_factory, run_dir)
    except CheckpointError as e:
        raise RunError(f"--resume: {e}") from e
    # UnknownEnvError: a package an env's module needs (pettingzoo's pistonball: pymunk) is
    # found missing only when the checks make an env.
    except (RunDirInUse, AnakinError, UnsupportedError, PolicyMappingError,
            UnknownEnvError) as e:
        raise RunError(str(e)) from e
    return run_dir, summary


def final_video(run: RunSettings, builder: Any, env_factory: Any, run_dir: str) -> None:
    """Records one episode of the run's final checkpoint (its first member's) into
    RUN_DIR/videos/ (`--video`), with the evaluator's seed: every platform and kind, the
    anakin platform's too, which has no evaluator node."""
    from trellis.builders.experiments.evaluation import evaluation_seed
    from trellis.builders.experiments.restore import Wanted
    from trellis.builders.experiments.rundir import VIDEOS
    from trellis.builders.experiments.session import restore_run_member

    wanted = Wanted(run_dir, run.options.platform, run.options.num_seeds)
    member = restore_run_member(builder, env_factory, run.experiment, wanted)
    member.record(1, evaluation_seed(run.experiment.seed), os.path.join(run_dir, VIDEOS))


def train(run: RunSettings, argv: Sequence[str]) -> int:
    """Runs the experiment of `run` (parsed from `argv`); returns the exit code (2: bad input)."""
    line = preset_line(run.options.agent, run.options.preset)
    if line is not None and not run.options.quiet:
        print(line)
    try:
        run_dir, summary = execute(run, argv)
    except RunError as e:
        print(f"run.py: error: {e}", file=sys.stderr)
        return 2
    print(
        f"stopped by {summary['stopped_by']} after {summary['env_steps']:,d} env steps in "
        f"{summary['session_wall_time_s']:.1f} s ({summary['env_steps_per_s']:,.0f} steps/s), "
        f"mean return (last {summary['return_window']} episodes) {summary['mean_return']}"
    )
    print(f"summary: {os.path.join(run_dir, 'summary.json')}")
    return int(summary["exit_code"])


def launching(argv: Sequence[str]) -> contextlib.ExitStack:
    """What a run of `argv` is parsed and launched within: anakin's CPU cores where the platform
    is anakin, and JAX's GPU autotuning flags unless set (for the command line and
    `trellis.train`)."""
    from trellis.builders.experiments.xla_flags import FAST_GPU_AUTOTUNE, xla_flags_unless_set

    stack = contextlib.ExitStack()
    if platform_of(argv) == ANAKIN:
        from trellis.builders.experiments.anakin_run import use_cpu_cores

        stack.enter_context(use_cpu_cores())
    stack.enter_context(xla_flags_unless_set(FAST_GPU_AUTOTUNE))
    return stack


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: parses `argv` (default: sys.argv), trains; returns the exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--list_presets" in argv:  # Not a run: nothing to parse.
        print(list_presets())
        return 0
    # Entered before parsing: checking a gymnax id starts JAX.
    with launching(argv):
        try:
            run = parse(argv, prog="run.py", description=__doc__.splitlines()[0])
        except UsageError as e:
            print(f"run.py: error: {e}", file=sys.stderr)
            return 2
        return train(run, argv)


if __name__ == "__main__":
    sys.exit(main())
