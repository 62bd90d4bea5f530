"""The session: the one host-side driver of a run, whatever the platform.

`run_experiment` writes config.json, checks the agent can do the run (`check_supported`), and
hands the platform's `Execution` to a `Session`, which owns what every platform shares:
signals (SIGINT, SIGTERM, SIGQUIT stop the run with a final checkpoint), the progress display,
the run directory's metrics (metrics.jsonl, TensorBoard), the checkpoint timer, and the
summary (a typed `Summary`, written as summary.json with learning_curve.png). The stop rule
(`stop.StopRule`) is made here too and given to the platform, which asks it where the counters
live. A platform only runs the program until told to stop, reporting counters:

- `program_run.ProgramRun`: the SEED-style program graph on `local_mt`, `local_mp` or `ray`;
- `in_process.InProcessRun`: a compiled program in this process (`--platform=anakin`): a
  population acting and learning (`anakin_run`), ES's generations (`es_run`), self-play
  (`self_play_run`).

Each kind's entry in `EXECUTIONS` also says how a member of its runs is restored from a
checkpoint for evaluation (launch/evaluate.py).

`launch/run.py` calls `run_experiment` for the registered agents; a notebook may call it with
a builder of its own (on `local_mt`, since a class defined in a notebook cannot be pickled
into processes).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import datetime
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from types import FrameType
from typing import Any

import jax

from trellis.builders.contract.agent import (
    EPISODES,
    REPLAY,
    SELF_PLAY,
    UNROLLS,
    Agent,
    Builder,
    lacking,
)
from trellis.builders.contract.config import ExperimentConfig
from trellis.builders.contract.population import PopulationSearch
from trellis.builders.contract.self_play import SelfPlayAgent
from trellis.builders.experiments import es_run, self_play_run
from trellis.builders.experiments.anakin_run import population_run, restore_gradient_member
from trellis.builders.experiments.checkpointing import latest_checkpoint
from trellis.builders.experiments.curves import finish_run_dir
from trellis.builders.experiments.distributed import group_refusal
from trellis.builders.experiments.execution import Ending, Execution, Report
from trellis.builders.experiments.platforms import (
    ANAKIN,
    Platform,
    PopulationSettings,
    platform_name,
    platform_settings,
)
from trellis.builders.experiments.program_run import ProgramRun
from trellis.builders.experiments.progress import Progress
from trellis.builders.experiments.restore import Member, Wanted, restore_search
from trellis.builders.experiments.rundir import (
    AGENT_CONFIG,
    COMMAND_LINE,
    CONFIG,
    EXPERIMENT,
    RUN_RECORD,
    RunWriter,
    Tracker,
    git_commit,
    read_json,
    versions,
    write_json,
)
from trellis.builders.experiments.schedule import (
    HyperParamsError,
    asked_hparams,
    require_hparams,
)
from trellis.builders.experiments.stop import StopRule
from trellis.envs.contract import EnvFactory, Players
from trellis.envs.objects import as_env_factory
from trellis.envs.specs import EnvSpec
from trellis.launch.runtime.launcher import STOP_SIGNALS

# How long the session waits for a report at most, and by what factor env steps grow between
# the points of the learning curve recorded beside one every `log_every_s` (`Session._advanced`).
POLL_S = 0.1
GROWTH = 1.05


class UnsupportedError(ValueError):
    """The agent cannot do this run (`Capabilities`): one line saying what would work."""


@dataclasses.dataclass(frozen=True)
class Summary:
    """summary.json: how a run went. `fields` are the platform's own (`Ending.fields`)."""

    agent: str
    platform: str
    env: str
    stopped_by: str
    exit_code: int
    env_steps: int  # Per member on anakin: the members step in lockstep.
    wall_time_s: float  # This session and the earlier sessions of a resumed run.
    session_wall_time_s: float
    env_steps_per_s: float  # All members' new env steps per second of this session.
    mean_return: float | None  # Over the last `return_window` episodes (anakin: members' mean).
    return_window: int
    episodes: int
    learner_steps: int
    resumed_from_env_steps: int | None
    stop_at_return: float | None
    total_env_steps: int
    fields: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    error: str | None = None

    def as_json(self) -> dict[str, Any]:
        record = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                  if f.name not in ("fields", "error")}
        record.update(self.fields)
        if self.error is not None:
            record["error"] = self.error
        return record


def check_supported(builder: Agent[Any], platform: str, env_factory: EnvFactory) -> None:
    """Raises UnsupportedError when the agent does not provide its kind's protocol
    (`EXECUTIONS`), or its capabilities do not cover `platform`, or the env: who acts in it,
    as its factory declares (`players`, envs/contract.py): multi-agent envs are for
    multi-agent agents only, two-player games for self-play agents only."""
    capabilities = builder.capabilities
    name = type(builder).__name__
    kind = EXECUTIONS[capabilities.learns_from].protocol
    missing = lacking(builder, kind)
    if missing:
        raise UnsupportedError(
            f"{name} learns from {capabilities.learns_from}, so it must be a {kind.__name__} "
            f"({kind.__module__}); it lacks {', '.join(missing)}")
    env = env_factory.env_id
    multi_agent_env = env_factory.players is Players.MULTI_AGENT
    if multi_agent_env != capabilities.multi_agent:
        raise UnsupportedError(
            f"{env} is a multi-agent env and {name} a single-agent agent (use --agent=ippo or "
            "mappo)" if multi_agent_env else
            f"{name} is a multi-agent agent and {env} a single-agent env (use e.g. "
            "--env=jaxmarl:MPE_simple_spread_v3)")
    if capabilities.multi_agent and multi_agent_env:
        # The builder's networks follow its policy mapping onto the env's agents: a mapping
        # that does not fit them (a pattern matching no agent, agents of different spaces on
        # one policy) raises PolicyMappingError here, in one line, before any node starts.
        builder.make_networks(env_factory.spec())
    game = env_factory.players is Players.TWO_PLAYER_GAME
    if game != (capabilities.learns_from == SELF_PLAY):
        raise UnsupportedError(
            f"{env} is a two-player game, which {name} does not learn (use --agent=alphazero)"
            if game else f"{name} learns by self-play in two-player games, e.g. "
            f"--env=pgx:tic_tac_toe; {env} is not one")
    if capabilities.learns_from == EPISODES:
        spec = env_factory.spec()  # Only a single-agent spec says whether it gives images.
        if isinstance(spec, EnvSpec) and spec.pixels:
            raise UnsupportedError(
                f"{name} evolves an MLP on vector observations; {env} gives images (use an "
                "agent with a conv torso, e.g. --agent=impala)")
    if platform == ANAKIN and capabilities.recurrent:
        raise UnsupportedError(
            f"--platform=anakin runs feed-forward policies only; {name}'s policy is recurrent "
            "(use --platform=local_mp for it)")
    if platform == ANAKIN and not capabilities.anakin:
        raise UnsupportedError(
            f"--platform=anakin runs agents whose learning is pure functions on the device "
            f"(e.g. impala, ppo, sac, td3, es); {name} learns from {capabilities.learns_from} "
            "on the host only (use --platform=local_mp)")


def check_hparams(builder: Agent[Any], settings: Platform, env_factory: EnvFactory) -> None:
    """Raises UnsupportedError when the run sets hyper-parameters (a learning-rate schedule,
    `--member_hparams`, PBT) and the agent's `Training` gives no access to them."""
    population = settings if isinstance(settings, PopulationSettings) else None
    asked = asked_hparams(builder,
                          member_hparams=population is not None and bool(population.hparams),
                          pbt=population is not None and population.pbt is not None)
    if asked is None:
        return
    spec = env_factory.spec()
    try:
        require_hparams(builder, builder.make_training(builder.make_networks(spec), spec), asked)
    except HyperParamsError as e:
        raise UnsupportedError(str(e)) from None


def check_env_buffers(builder: Agent[Any], platform: str, config: ExperimentConfig) -> None:
    """Raises UnsupportedError where `--env_buffers` > 1 has nothing to split: only the host
    platforms' env workers of gradient agents step at central inference."""
    if config.env_buffers == 1:
        return
    if platform == ANAKIN:
        raise UnsupportedError(
            "--env_buffers splits a host env worker's envs between calls to central inference; "
            "--platform=anakin steps its envs inside the compiled program (leave it at 1)")
    if builder.capabilities.learns_from not in (UNROLLS, REPLAY):
        raise UnsupportedError(
            f"--env_buffers splits a host env worker's envs between calls to central "
            f"inference; {type(builder).__name__}'s workers play whole episodes with a policy "
            "of their own (leave it at 1)")


class Session:
    """Drives one session of a run to its end: see the module's docstring.

    Args:
      config: the experiment's settings (log and checkpoint intervals, stop rule).
      run_dir: the run directory.
      quiet: no progress output.
      resume_progress: the progress record of the checkpoint a resumed run continues from.
      extra_metrics: constant fields added to every metrics record (e.g. a sweep's trial).
      on_stats: called with each stats record as it is logged; True stops the run (a signal).
      tracker: where each metrics record goes too (`--track`), or None.
    """

    def __init__(self, config: ExperimentConfig, run_dir: str, *, quiet: bool = False,
                 resume_progress: Mapping[str, Any] | None = None,
                 extra_metrics: Mapping[str, Any] | None = None,
                 on_stats: Callable[[dict[str, Any]], bool] | None = None,
                 tracker: Tracker | None = None):
        self._config = config
        self._run_dir = run_dir
        self._quiet = quiet
        self._resume_steps = None if resume_progress is None else resume_progress["env_steps"]
        self._elapsed_before = float((resume_progress or {}).get("elapsed_s", 0.0))
        self._extra = dict(extra_metrics or {})
        self._on_stats = on_stats
        # tensorboardX takes a second to import: the writer is made beside the platform's
        # start-up (compiling, spawning nodes), not inside the first record.
        self._opening = concurrent.futures.ThreadPoolExecutor(1, "run-writer")
        self._writer = self._opening.submit(RunWriter, run_dir, self._resume_steps, tracker)
        self._opening.shutdown(wait=False)
        self._signalled = threading.Event()

    def run(self, execution: Execution, *, agent: str, platform: str, env: str) -> Summary:
        """Advances `execution` until it stops or is told to; writes the run directory."""
        config = self._config
        progress = Progress(config.total_env_steps, quiet=self._quiet,
                            initial=self._resume_steps or 0)
        last: Report | None = None
        last_record = last_checkpoint = time.monotonic()
        try:
            with self._signals():
                while last is None or last.stopped_by is None:
                    report = execution.advance(min(config.log_every_s, POLL_S))
                    now = time.monotonic()
                    stop = self._signalled.is_set()
                    if report is not None:
                        last = report
                        if (report.stopped_by is not None or report.record_now
                                or now - last_record >= config.log_every_s
                                or self._advanced(report)):
                            progress.update(dict(report.stats))
                            stop |= self._record(report)
                            last_record = now
                    if stop and (last is None or last.stopped_by is None):
                        last = execution.stop()
                        self._record(last)
                    elif now - last_checkpoint >= config.checkpoint_every_s:
                        execution.checkpoint()
                        last_checkpoint = now
        finally:
            progress.close()
        stopped = time.monotonic()
        ending = execution.finish()
        self._writer.result().close()
        return self._summary(last, ending, stopped - ending.started, agent, platform, env)

    def _advanced(self, report: Report) -> bool:
        """Whether env steps grew by 5% since the last record: points evenly spaced on a log
        scale of env steps, so a run of a few seconds still draws its learning curve from
        dozens of points, and a long one adds a few hundred beside one every `log_every_s`."""
        steps = int(report.stats.get("env_steps", 0))
        return steps > 0 and steps >= GROWTH * self._writer.result().env_steps

    def _record(self, report: Report) -> bool:
        """Writes `report` into the run directory; whether `on_stats` asks to stop."""
        stats = dict(report.stats)
        self._writer.result().log(stats, {**self._extra, **report.fields})
        return self._on_stats is not None and bool(self._on_stats(stats))

    @contextlib.contextmanager
    def _signals(self) -> Iterator[None]:
        """The runtime's stop signals (Ctrl-C, SIGTERM, SIGQUIT) only set a flag that the loop
        reads between advances (`runtime.RunningProgram.wait` stops the program on them itself):
        an exception raised at an arbitrary point could leave JAX, orbax or tensorboardX
        holding a lock that the final checkpoint then waits on. A second Ctrl-C interrupts."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def on_signal(signum: int, frame: FrameType | None) -> None:
            if not self._signalled.is_set():
                # The launcher's handler says the same while the loop waits inside the program.
                print(f"[run] {signal.Signals(signum).name}: stopping the run",
                      file=sys.stderr, flush=True)
            self._signalled.set()
            signal.signal(signal.SIGINT, signal.default_int_handler)

        previous = {s: signal.signal(s, on_signal) for s in STOP_SIGNALS}
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _summary(self, last: Report, ending: Ending, session_time: float, agent: str,
                 platform: str, env: str) -> Summary:
        stats = last.stats
        env_steps = int(stats.get("env_steps", self._resume_steps or 0))
        new_steps = (env_steps - (self._resume_steps or 0)) * int(
            ending.fields.get("num_seeds", 1))
        return Summary(
            agent=agent, platform=platform, env=env, stopped_by=str(last.stopped_by),
            exit_code=ending.exit_code, env_steps=env_steps,
            wall_time_s=round(self._elapsed_before + session_time, 3),
            session_wall_time_s=round(session_time, 3),
            env_steps_per_s=round(new_steps / session_time, 1) if session_time > 0 else 0.0,
            mean_return=stats.get("mean_return"), return_window=self._config.return_window,
            episodes=int(stats.get("episodes", 0)),
            learner_steps=int(stats.get("learner_steps", 0)),
            resumed_from_env_steps=self._resume_steps,
            stop_at_return=self._config.stop_at_return,
            total_env_steps=self._config.total_env_steps, fields=ending.fields,
            error=ending.error)


def _gradient_execution(builder: Builder[Any], env_factory: EnvFactory, config: ExperimentConfig,
                        run_dir: str, settings: Platform,
                        resume_from: tuple[int, Mapping[str, Any]] | None,
                        quiet: bool) -> Execution:
    """Gradient learners: a population in one jitted program on anakin
    (`anakin_run.population_run`), else the SEED-style program graph (`ProgramRun`)."""
    if isinstance(settings, PopulationSettings):
        rule = StopRule.of(config, every_member=settings.pbt is None)
        return population_run(builder, env_factory, config, run_dir, settings, rule,
                              resume_from, quiet=quiet)
    return ProgramRun(builder, env_factory, config, run_dir, settings, StopRule.of(config),
                      None if resume_from is None else resume_from[0])


@dataclasses.dataclass(frozen=True)
class Kind:
    """A kind of agent: the protocol its builders provide; its execution, which builds its
    in-process program or its program graph for the host platforms, typed by that protocol
    and called with (builder, env_factory, config, run_dir, platform settings, resume_from,
    quiet) once `check_supported` has checked the builder provides the protocol; and how a
    member of its runs is restored for evaluation, called with (builder, env_factory, config,
    `restore.Wanted`) and giving a `restore.Member`."""

    protocol: type
    execution: Callable[..., Execution]
    restore: Callable[..., Member]


# The kinds, by what the agent learns from (`Capabilities.learns_from`).
EXECUTIONS: dict[str, Kind] = {
    UNROLLS: Kind(Builder, _gradient_execution, restore_gradient_member),
    REPLAY: Kind(Builder, _gradient_execution, restore_gradient_member),
    EPISODES: Kind(PopulationSearch, es_run.execution, restore_search),
    SELF_PLAY: Kind(SelfPlayAgent, self_play_run.execution, self_play_run.restore_match),
}


def restore_run_member(builder: Agent[Any], env_factory: EnvFactory, config: ExperimentConfig,
                       wanted: Wanted) -> Member:
    """A member of the run `wanted` names, restored from its checkpoint as its agent's kind
    says (`EXECUTIONS`), to be played (launch/evaluate.py).

    Raises:
      builders.experiments.restore.RestoreError: the run has no checkpoints.
      builders.experiments.checkpointing.CheckpointError: no such checkpoint, or unreadable.
      builders.experiments.anakin_run.AnakinError: no such member.
    """
    kind = EXECUTIONS[builder.capabilities.learns_from]
    return kind.restore(builder, env_factory, config, wanted)


def run_experiment(
    builder: Agent[Any],
    env_factory: EnvFactory | object,
    config: ExperimentConfig,
    run_dir: str,
    *,
    platform: str | Platform = "local_mt",
    quiet: bool = False,
    resume: bool = False,
    options: dict[str, Any] | None = None,
    argv: list[str] | None = None,
    extra_metrics: dict[str, Any] | None = None,
    on_stats: Callable[[dict[str, Any]], bool] | None = None,
    tracker: Tracker | None = None,
) -> dict[str, Any]:
    """Trains `builder` on `env_factory`'s envs until `config` says stop; returns the summary.

    Args:
      builder: the agent, of any kind (`EXECUTIONS`: builders.contract.agent.Builder,
        .population.PopulationSearch, .self_play.SelfPlayAgent).
      env_factory: the env's factory (envs.EnvFactory, e.g. `envs.make_env_factory(ID)`), or
        what `envs.as_env_factory` makes one of: an env id, a Gymnasium env constructor, a
        gymnax, Brax, Playground or JaxMARL-API env object.
      config: the experiment settings; checkpoints go to RUN_DIR/checkpoints.
      run_dir: the run directory (created if missing).
      platform: "local_mt", "local_mp", "ray" or "anakin", or a platform's typed settings
        (`HostPlatform`, e.g. with a Ray address; `PopulationSettings` for anakin).
      quiet: no progress output.
      resume: continue from the newest checkpoint in `run_dir`: counters, metrics and curves
        go on from there.
      options: the command line's options, for config.json's command_line section (default:
        the env's id only).
      argv: the command line of this session, recorded in config.json's run record.
      extra_metrics: constant fields added to every metrics record (e.g. a sweep's trial;
        the learning rate in effect is logged by every execution, `learning_rate`).
      on_stats: called with each stats record as it is logged (e.g. to report to Ray Tune);
        returning True stops the run (stopped_by "signal").
      tracker: a tracked run (builders/experiments/tracking.py's `tracked`) that gets
        config.json once written and every metrics record; the caller ends it.

    Returns:
      summary.json's content (`Summary.as_json`).

    Raises:
      builders.experiments.checkpointing.CheckpointError: `resume` and no readable checkpoint.
      UnsupportedError: the agent cannot run on this platform, or lacks what its kind or the
        run's hyper-parameters need (one line).
      builders.experiments.anakin_run.AnakinError: the env or hyper-parameters do not fit
        the anakin platform.
      TypeError: `env_factory` is neither a factory nor what `envs.as_env_factory` takes.
    """
    env_factory = as_env_factory(env_factory)
    settings = platform_settings(platform)
    name = platform_name(settings)
    check_supported(builder, name, env_factory)
    refusal = group_refusal(builder, config, name)  # Every kind: ES's and self-play's too.
    if refusal is not None:
        raise UnsupportedError(refusal)
    check_hparams(builder, settings, env_factory)
    check_env_buffers(builder, name, config)
    os.makedirs(run_dir, exist_ok=True)
    resume_from = latest_checkpoint(run_dir) if resume else None  # Errors before anything.
    resume_progress = resume_from[1] if resume_from else None
    options = options or {"env": env_factory.env_id}
    session = Session(config, run_dir, quiet=quiet, resume_progress=resume_progress,
                      extra_metrics=extra_metrics, on_stats=on_stats, tracker=tracker)
    execution = EXECUTIONS[builder.capabilities.learns_from].execution(
        builder, env_factory, config, run_dir, settings, resume_from, quiet)
    # Once the execution has its state (an in-process one restored it, a program graph checked
    # the checkpoint fits): a resume that cannot go on keeps the run's settings, not its own.
    _write_config(run_dir, builder, config, options, argv,
                  None if resume_progress is None else resume_progress["env_steps"])
    if tracker is not None:
        tracker.start(read_json(os.path.join(run_dir, CONFIG)))
    summary = session.run(execution, agent=options.get("agent", type(builder).__name__),
                          platform=name, env=env_factory.env_id)
    return finish_run_dir(run_dir, summary.as_json())



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


def _asdict(obj: Any) -> Any:
    # A dataclass instance as its fields; anything else (a dataclass type too) as its repr.
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    return repr(obj)


def _write_config(run_dir: str, builder: Agent[Any], config: ExperimentConfig,
                  options: Mapping[str, Any], argv: list[str] | None,
                  resume_steps: int | None) -> None:
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
    write_json(path, {COMMAND_LINE: dict(options), EXPERIMENT: _asdict(config),
                      AGENT_CONFIG: _asdict(getattr(builder, "config", None)),
                      RUN_RECORD: record})
