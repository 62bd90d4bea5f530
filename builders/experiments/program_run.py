"""A run's program graph on one of the runtime's platforms, as the session drives it.

`ProgramRun` builds the SEED-style program (`program.make_program`) and launches it on
`local_mt`, `local_mp` or `ray` at its first `advance`, inside the session's signal handling,
so a Ctrl-C during start-up stops it like any other. Its reports are the learner node's
`stats()`, fetched without blocking the session; the learner node asks the stop rule between
updates and stops the program, and checkpoints when the session's timer asks.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

import jax

from trellis.builders.contract.agent import Agent
from trellis.builders.contract.config import ExperimentConfig
from trellis.builders.experiments.checkpointing import (
    Checkpoints,
    check_resumable,
    checkpoint_dir,
)
from trellis.builders.experiments.execution import CHECKPOINT_NOT_WRITTEN, Ending, Report
from trellis.builders.experiments.platforms import HostPlatform
from trellis.builders.experiments.program import make_program
from trellis.builders.experiments.rundir import VIDEOS
from trellis.builders.experiments.stop import StopRule
from trellis.envs.contract import EnvFactory
from trellis.launch import runtime


class ProgramRun:
    """The session's `Execution` of a program graph (builders/experiments/session.py).

    Args:
      builder, env_factory, config: the agent, its envs and the experiment's settings.
      run_dir: checkpoints go to RUN_DIR/checkpoints, videos (`config.video`) to RUN_DIR/videos.
      platform: where the program runs.
      stop_rule: asked by the learner node between updates.
      resume_step: the checkpoint to resume from, or None.
      make: builds the program graph, with `make_program`'s arguments (another kind of
        agent's graph, e.g. evolution strategies' `es_node.make_es_program`); its "learner"
        group's node answers `stats()` and `checkpoint()`.

    Raises:
      CheckpointError: `resume_step`'s checkpoint does not fit the state the builder's
        `make_training(...).init` makes (the learner node's).
    """

    def __init__(self, builder: Agent[Any], env_factory: EnvFactory, config: ExperimentConfig,
                 run_dir: str, platform: HostPlatform, stop_rule: StopRule,
                 resume_step: int | None, make: Callable[..., runtime.Program] = make_program):
        if resume_step is not None:
            # Here, before any node starts: a misfit is then the launcher's one-line error.
            spec = env_factory.spec()
            init = builder.make_training(builder.make_networks(spec), spec).init
            check_resumable(run_dir, resume_step,
                            jax.eval_shape(init, jax.random.PRNGKey(config.seed)))
        name = env_factory.env_id
        self._program = make(
            builder, env_factory, config, name=f"{type(builder).__name__}-{name}",
            checkpoints=Checkpoints(checkpoint_dir(run_dir), resume_step), stop_rule=stop_rule,
            video_dir=os.path.join(run_dir, VIDEOS) if config.video else None)
        self._platform = platform
        self._shutdown_timeout_s = config.shutdown_timeout_s
        self._running: runtime.RunningProgram | None = None
        self._learner: Any = None
        self._pending: Any = None  # The stats() call in flight.
        self._stats: dict[str, Any] = {}
        self._result: runtime.LaunchResult | None = None
        self._launched_at = self._started = 0.0  # Set at the launch, in the first advance.

    def advance(self, timeout_s: float) -> Report | None:
        if self._running is None:
            self._launched_at, self._started = time.time(), time.monotonic()
            running = runtime.launch(self._program, platform=self._platform.platform,
                                     block=False, stop_timeout_s=self._shutdown_timeout_s,
                                     **self._platform.launch_options())
            assert isinstance(running, runtime.RunningProgram)  # What `block=False` returns.
            self._running = running
            self._learner = self._program.handles("learner")[0].dereference()
        result = self._running.wait(timeout=timeout_s)
        if result is not None:
            return self._last(result)
        fresh = None
        if self._pending is not None and self._pending.done():
            if self._pending.exception() is None:
                fresh = self._stats = self._pending.result()
            self._pending = None
        if self._pending is None:
            self._pending = self._learner.futures.stats()
        return None if fresh is None else Report(fresh)

    def checkpoint(self) -> None:
        if self._learner is not None:
            self._learner.futures.checkpoint()  # The learner thread saves between updates.

    def stop(self) -> Report:
        assert self._running is not None
        return self._last(self._running.stop())

    def _last(self, result: runtime.LaunchResult) -> Report:
        self._result = result
        if result.info:  # The learner's final counts, those of its final checkpoint.
            self._stats = dict(result.info)
        if result.stopped_by == "requested":  # By the stop rule.
            return Report(self._stats, stopped_by=result.reason)
        return Report(self._stats, stopped_by=result.stopped_by)  # "error", "signal", ...

    def finish(self) -> Ending:
        assert self._running is not None and self._result is not None
        stats, result = self._stats, self._result
        fields = {
            "last_evaluation": stats.get("evaluation"),
            "node_restarts": self._running.restarts,  # Label -> restarts (env workers).
            # Seconds from the launch to this session's first env step and learner update.
            "startup_s": {name: None if t is None else round(t - self._launched_at, 3)
                          for name, t in stats.get("startup", {}).items()},
        }
        exit_code = result.exit_code
        if result.stopped_by != "error" and self._program.handles("learner")[0].label in (
                result.forced):
            print(f"[run] the final checkpoint was not written: the learner did not end within "
                  f"--shutdown_timeout_s={self._shutdown_timeout_s:g} s; the run resumes from "
                  f"its newest checkpoint before", file=sys.stderr, flush=True)
            exit_code = CHECKPOINT_NOT_WRITTEN
        return Ending(exit_code, self._started, fields,
                      result.reason if result.stopped_by == "error" else None)
