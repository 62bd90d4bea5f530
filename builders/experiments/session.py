"""`run_experiment`: one training run of any builder, with its run directory.

It builds the program (`builders.make_program`), launches it, shows progress, writes the run
directory (builders/experiments/rundir.py) as it goes, and learning_curve.png and summary.json
at the end.
`launch/run.py` calls it for the registered agents; a notebook may call it with a builder of
its own (on `local_mt`, since a class defined in a notebook cannot be pickled into processes).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax

from trellis.builders.experiments.anakin_run import ANAKIN, PopulationSettings, run_anakin
from trellis.builders.experiments.checkpointing import (
    Checkpoints,
    checkpoint_dir,
    latest_checkpoint,
)
from trellis.builders.experiments.curves import finish_run_dir
from trellis.builders.experiments.program import make_program
from trellis.builders.experiments.progress import Progress
from trellis.builders.experiments.rundir import (
    AGENT_CONFIG,
    COMMAND_LINE,
    CONFIG,
    EXPERIMENT,
    RUN_RECORD,
    RunWriter,
    git_commit,
    read_json,
    versions,
    write_json,
)
from trellis.launch import runtime


def _asdict(obj: Any) -> Any:
    return dataclasses.asdict(obj) if dataclasses.is_dataclass(obj) else repr(obj)


def run_experiment(
    builder: Any,
    env_factory: Any,
    config: Any,
    run_dir: str,
    *,
    platform: str = "local_mt",
    quiet: bool = False,
    resume: bool = False,
    options: dict[str, Any] | None = None,
    argv: list[str] | None = None,
    extra_metrics: dict[str, Any] | None = None,
    platform_options: dict[str, Any] | None = None,
    on_stats: Callable[[dict[str, Any]], bool] | None = None,
) -> dict[str, Any]:
    """Trains `builder` on `env_factory`'s envs until `config` says stop; returns the summary.

    Args:
      builder: the agent (builders.base.Builder).
      env_factory: envs.EnvFactory.
      config: the experiment settings (builders.config.ExperimentConfig); the learner
        checkpoints into RUN_DIR/checkpoints.
      run_dir: the run directory (created if missing).
      platform: "local_mt", "local_mp", "ray" or "anakin" (builders/experiments/anakin_run.py).
      quiet: no progress output.
      resume: continue from the newest checkpoint in `run_dir`: counters, metrics and curves
        go on from there.
      options: the command line's options, for config.json's command_line section (default:
        the env's id only).
      argv: the command line of this session, recorded in config.json's run record.
      extra_metrics: constant fields added to every metrics record (e.g. learning_rate).
      platform_options: passed on to `runtime.launch` (e.g. `ray_address`); for anakin, the
        fields of `PopulationSettings`.
      on_stats: called with each stats record of the learner node as it is logged (e.g. to
        report to Ray Tune); returning True stops the run (stopped_by "signal").

    Returns:
      The summary (also in RUN_DIR/summary.json), with "exit_code": 0 when the run stopped
      at its budget or target, 1 on a node's error, 130 on a signal.

    Raises:
      builders.checkpointing.CheckpointError: `resume` and no readable checkpoint.
    """
    os.makedirs(run_dir, exist_ok=True)
    step, resume_steps, resume_elapsed = None, None, 0.0
    if resume:
        step, progress = latest_checkpoint(run_dir)  # A clear error before anything starts.
        resume_steps, resume_elapsed = progress["env_steps"], float(progress.get("elapsed_s", 0))
    options = options or {"env": getattr(env_factory, "env_id", repr(env_factory))}
    _write_config(run_dir, builder, config, options, argv, resume_steps)
    if platform == ANAKIN:  # One jitted program, no program graph (anakin_run.py).
        return run_anakin(builder, env_factory, config, run_dir,
                          PopulationSettings(**(platform_options or {})), quiet=quiet,
                          resume=(step, progress) if resume else None, options=options)

    name = getattr(env_factory, "env_id", "env")
    program = make_program(builder, env_factory, config, name=f"{type(builder).__name__}-{name}",
                           checkpoints=Checkpoints(checkpoint_dir(run_dir), step))
    progress_bar = Progress(config.total_env_steps, quiet=quiet, initial=resume_steps or 0)
    writer = RunWriter(run_dir, resume_steps)
    stats: dict[str, Any] = {}
    in_main = threading.current_thread() is threading.main_thread()
    # SIGTERM ends the run like Ctrl-C: nodes stopped, summary written.
    previous = signal.signal(signal.SIGTERM, _raise_keyboard_interrupt) if in_main else None
    start, launched_at = time.monotonic(), time.time()
    running = runtime.launch(program, platform=platform, block=False,
                            **(platform_options or {}))
    try:
        # Ctrl-C and SIGTERM stop the program through the launcher's flag for the whole loop: a
        # KeyboardInterrupt raised inside the writer's tensorboardX calls hung run.py (issue 14).
        with running.stop_on_signals():
            learner = program.handles("learner")[0].dereference()
            pending = None
            result = None
            while result is None:
                result = running.wait(timeout=config.log_every_s)
                if pending is not None and pending.done():
                    if pending.exception() is None:
                        stats = pending.result()
                        progress_bar.update(stats)
                        writer.log(stats, extra_metrics)
                        if on_stats is not None and on_stats(stats):
                            result = running.stop()
                    pending = None
                if result is None and pending is None:
                    pending = learner.futures.stats()
    except KeyboardInterrupt:
        result = running.stop()
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, previous)
        progress_bar.close()
    session_time = time.monotonic() - start

    if result.stopped_by == "requested":
        stats, stopped_by = dict(result.info), result.reason
        writer.log(stats, extra_metrics)  # The final counters.
    else:
        stopped_by = result.stopped_by
    writer.close()
    env_steps = int(stats.get("env_steps", resume_steps or 0))
    new_steps = env_steps - (resume_steps or 0)
    summary = {
        "agent": options.get("agent", type(builder).__name__),
        "platform": platform,
        "env": name,
        "stopped_by": stopped_by,
        "exit_code": result.exit_code,
        "env_steps": env_steps,
        "wall_time_s": round(resume_elapsed + session_time, 3),
        "session_wall_time_s": round(session_time, 3),
        "env_steps_per_s": round(new_steps / session_time, 1) if session_time > 0 else 0.0,
        "mean_return": stats.get("mean_return"),  # Over the last `return_window` episodes.
        "return_window": config.return_window,
        "last_evaluation": stats.get("evaluation"),
        "episodes": stats.get("episodes", 0),
        "learner_steps": stats.get("learner_steps", 0),
        "resumed_from_env_steps": resume_steps,
        "node_restarts": running.restarts,  # Label -> restarts after failures (env workers).
        "stop_at_return": config.stop_at_return,
        "total_env_steps": config.total_env_steps,
        # Seconds from the launch to this session's first env step and first learner update.
        "startup_s": {name: None if t is None else round(t - launched_at, 3)
                      for name, t in stats.get("startup", {}).items()},
    }
    if result.stopped_by == "error":
        summary["error"] = result.reason
    return finish_run_dir(run_dir, summary)


# Where runs side by side share JAX's persistent compilation cache: in their parent directory.
COMPILE_CACHE_SUBDIR = ".jax_cache"


def compile_cache_dir(run_dir: str) -> str:
    """The compilation cache of the runs beside `run_dir` (e.g. runs/.jax_cache)."""
    return os.path.join(os.path.dirname(os.path.abspath(run_dir)), COMPILE_CACHE_SUBDIR)


@contextlib.contextmanager
def compile_cache(directory: str | None) -> Iterator[None]:
    """Inside, JAX's persistent compilation cache in `directory` is used by the node processes
    started (they read it from the environment when they import JAX) and by this process if it
    has not compiled anything yet (JAX decides once per process). A run of a config compiled
    before then loads its programs instead of compiling them. None: changes nothing.
    """
    if directory is None:
        yield
        return
    # Every program is kept, however fast it compiled: JAX's defaults skip those under 1 s,
    # which are most of ours.
    settings = {"jax_compilation_cache_dir": directory,
                "jax_persistent_cache_min_compile_time_secs": 0.0,
                "jax_persistent_cache_min_entry_size_bytes": 0}
    saved_config = {name: getattr(jax.config, name) for name in settings}
    saved_env = {name.upper(): os.environ.get(name.upper()) for name in settings}
    for name, value in settings.items():
        jax.config.update(name, value)
        os.environ[name.upper()] = str(value)
    try:
        yield
    finally:
        for name, value in saved_config.items():
            jax.config.update(name, value)
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _write_config(run_dir, builder, config, options, argv, resume_steps) -> None:
    """config.json: the run's settings (launch/flags.py reads them back) and its record."""
    path = os.path.join(run_dir, CONFIG)
    now = datetime.datetime.now().isoformat(timespec="seconds")
    session = {"started": now, "git_commit": git_commit(), "versions": versions(),
               "resumed_from_env_steps": resume_steps, "argv": argv}
    if resume_steps is not None and os.path.exists(path):
        record = read_json(path).get(RUN_RECORD, {})  # This session joins the run's list.
        record.setdefault("sessions", []).append(session)
    else:
        record = {"created": now, "git_commit": session["git_commit"],
                  "versions": session["versions"], "sessions": [session]}
    # The settings are those of the newest session: a resumed run goes on with them.
    write_json(path, {COMMAND_LINE: options, EXPERIMENT: _asdict(config),
                      AGENT_CONFIG: _asdict(getattr(builder, "config", None)),
                      RUN_RECORD: record})


def _raise_keyboard_interrupt(signum, frame):
    raise KeyboardInterrupt
