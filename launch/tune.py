"""Sweeps and PBT on Ray Tune: `python launch/tune.py --agent=impala --num_trials=4
--search learning_rate=loguniform:1e-5:1e-1 --scheduler=pbt`.

Each trial is a Trellis run (threads by default, `--platform=ray` for its nodes as Ray actors)
with the settings of the flags (as for run.py) and a draw of the `--search` space; Tune's
scheduler (fifo, asha, pbt) and search algorithm decide which trials run, stop early or copy
another. The sweep's directory (--logdir, default sweeps/AGENT-ENV-TIME) holds Tune's own
results (tune/), one run directory per trial (trials/TRIAL_ID), sweep.json and sweep.png.
With --track=wandb|mlflow, each trial is tracked as a run named by its trial id, grouped under
the sweep's directory name (wandb's group; MLflow's tag trellis.group).
`--restore=SWEEP_DIR` resumes an interrupted sweep. docs/tuning.md has the details.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import signal
import sys
import types
from collections.abc import Sequence
from typing import TYPE_CHECKING

import psutil

if not __package__:  # Run as a file from a clone: docs/architecture.md.
    _root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p) != os.path.join(_root, "launch")]
    sys.modules["trellis"] = types.ModuleType("trellis", f"Trellis from the clone at {_root}")
    sys.modules["trellis"].__path__ = [_root]

from trellis.builders.contract.config import Config, setting, settings  # noqa: E402
from trellis.builders.experiments.pbt import SearchSpecError, parse_search  # noqa: E402
from trellis.builders.experiments.rundir import new_run_dir  # noqa: E402
from trellis.builders.experiments.tracking import TrackingError, backend  # noqa: E402
from trellis.launch.flags import (  # noqa: E402
    ANAKIN,
    UsageError,
    parse,
    parse_groups,
    read_search,
)

if TYPE_CHECKING:  # Ray Tune is imported only once the command line is read.
    from trellis.builders.experiments.tuning import SweepSpec

_PROG = "tune.py"


@dataclasses.dataclass(frozen=True)
class TuneOptions(Config):
    """tune.py's own settings; the trials' are run.py's flags."""

    search: str | None = setting(
        None, "a searched setting, NAME=loguniform:LOW:HIGH, uniform:LOW:HIGH, randint:LOW:HIGH,"
        " choice:V1,V2,... or grid:V1,V2,...; give --search once per setting (or a search "
        "section in the --config file, NAME: KIND:ARGS)")
    scheduler: str = setting("fifo", "Tune's trial scheduler", choices=("fifo", "asha", "pbt"))
    search_alg: str = setting(
        "random", "how trials draw from the search space (grid: every grid point once; optuna "
        "needs the optuna extra)", choices=("random", "grid", "optuna"))
    num_trials: int = setting(4, "trials (samples of the search space)", ge=1)
    max_concurrent: int | None = setting(
        None, "trials running at once; none: as many as Ray's CPUs allow", ge=1)
    metric: str = setting(
        "mean_return", "the trials' reported stat that ranks them (mean_return: over the last "
        "return_window episodes)")
    mode: str = setting("max", "whether a larger or smaller metric is better",
                        choices=("max", "min"))
    restore: str | None = setting(
        None, "resume the interrupted sweep in this directory (Tune's restore), with the "
        "settings given here")


def split_search(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """The `--search` specs (repeatable, so not parsed as a setting) and the other arguments.

    Raises:
      UsageError: --search without a value.
    """
    specs, rest = [], []
    args = iter(argv)
    for arg in args:
        if arg.startswith("--search="):
            specs.append(arg.split("=", 1)[1])
        elif arg == "--search":
            value = next(args, None)
            if value is None:
                raise UsageError("--search needs a value, e.g. --search learning_rate="
                                 "loguniform:1e-4:1e-2")
            specs.append(value)
        else:
            rest.append(arg)
    return specs, rest


def parse_sweep(argv: Sequence[str]) -> tuple[SweepSpec, bool]:
    """(SweepSpec, restore) from tune.py's command line.

    Raises:
      UsageError: bad input, one line.
    """
    from trellis.builders.experiments.tuning import (  # Ray Tune: only once the line is read.
        TUNE_DIR,
        SweepSpec,
    )

    specs, rest = split_search(argv)
    (options,), rest = parse_groups(rest, _PROG, [("tune", TuneOptions)])
    if any(arg == "--resume" or arg.startswith("--resume=") for arg in rest):
        raise UsageError("--resume continues one run; a sweep resumes with --restore=SWEEP_DIR")
    run = parse(rest, prog=_PROG, description=__doc__.splitlines()[0],
                defaults={"platform": "local_mt"})
    if run.options.platform == ANAKIN:
        raise UsageError(f"--platform={ANAKIN} is not a trial platform of tune.py; use "
                         "local_mt, local_mp or ray")
    if run.options.track is not None:  # Each trial is tracked as a run of the sweep's group.
        try:
            backend(run.options.track)
        except TrackingError as e:
            raise UsageError(str(e)) from None
    config_types: tuple[type, ...] = (type(run.experiment), type(run.agent))
    known = {s.name: s for cls in config_types for s in settings(cls)}
    # The --config file's search section first: --search flags override it, name by name.
    from_file = read_search(run.options.config) if run.options.config else {}
    search = {}
    for text in [f"{name}={spec}" for name, spec in from_file.items()] + specs:
        try:
            name, dimension = parse_search(text)
        except SearchSpecError as e:
            raise UsageError(str(e)) from None
        if name not in known:
            raise UsageError(f"--search {text!r}: {name} is not a setting of the experiment or "
                             f"of --agent={run.options.agent}")
        search[name] = dimension
    if not search and options.scheduler == "pbt":
        raise UsageError("--scheduler=pbt needs at least one --search setting to perturb")
    logdir = run.options.logdir
    if (options.restore is None and logdir is not None
            and os.path.exists(os.path.join(logdir, TUNE_DIR))):  # Its trials would mix.
        raise UsageError(f"--logdir={logdir} holds a sweep already ({TUNE_DIR}/): "
                         f"--restore={logdir} resumes it; a new sweep needs a new directory")
    try:
        _, env_factory = run.build()
    except ValueError as e:
        raise UsageError(str(e)) from None
    sweep_dir = options.restore or run.options.logdir or new_run_dir(
        run.options.agent, run.options.env, root="sweeps")
    return SweepSpec(
        agent=run.options.agent, platform=run.options.platform,
        env_factory=env_factory, options=run.saved_options(),
        experiment=run.experiment, agent_config=run.agent, search=search,
        sweep_dir=os.path.abspath(sweep_dir), scheduler=options.scheduler,
        search_alg=options.search_alg, num_trials=options.num_trials,
        max_concurrent=options.max_concurrent, metric=options.metric, mode=options.mode,
        pbt=run.pbt, ray_address=run.options.ray_address), options.restore is not None


def _exit_now(sweep_dir: str, signum: int, frame: types.FrameType | None) -> None:
    # Every process of the sweep is below this one: Ray's services, their agents and workers
    # (the trials) and the trials' own node processes. Some of Ray's agents outlive the
    # raylet when it is killed alone, so all of them go first.
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            child.kill()
    print(f"{_PROG}: interrupted; resume with --restore={sweep_dir}", file=sys.stderr,
          flush=True)
    os._exit(130)


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: parses `argv` (default: sys.argv), runs the sweep; the exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        spec, restore = parse_sweep(argv)
    except UsageError as e:
        print(f"{_PROG}: error: {e}", file=sys.stderr)
        return 2
    from trellis.builders.experiments.tuning import run_sweep

    # Ctrl-C and SIGTERM end the sweep at once, not with Tune's graceful stop (a last
    # snapshot while every trial stops: tens of seconds on a busy machine). Tune snapshots
    # the sweep as it goes, so --restore resumes from the latest snapshot.
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, functools.partial(_exit_now, spec.sweep_dir))
    summary = run_sweep(spec, restore=restore)
    failed = sum(t["status"] == "failed" for t in summary["trials"])
    best = summary["best"]
    print(f"{len(summary['trials'])} trials, {failed} failed; best: "
          + (f"{best['trial_id']} {spec.metric}={best['metric']} {best['hparams']}" if best
             else "none"))
    print(f"sweep: {os.path.join(spec.sweep_dir, 'sweep.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

