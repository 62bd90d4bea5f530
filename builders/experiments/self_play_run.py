"""Two-player self-play on the anakin platform: `SelfPlayRun` drives an agent whose learning
is self-play with search on the device (`Capabilities(learns_from=SELF_PLAY)`: AlphaZero).

Each `advance` is one compiled call of the agent's `iterate` (its `make_self_play`): moves of
all games chosen by the search, positions into the replay on the device, SGD steps. Every
`eval_every_updates` SGD steps (and once at the start of a session) the agent's search plays
`eval_games` games against the agent's `eval_opponent` (the builder's `make_match`; AlphaZero's
baselines are agents/alphazero/baselines.py), half with each side moving first;
metrics.jsonl gets the win, draw and loss rates, and the games' outcomes (1, 0, -1 for the
agent) are the run's episode returns, so `mean_return`, the learning curve and
`--stop_at_return` speak of the score against the baseline.

The session's signals, run directory, checkpoints (the whole loop's state: params, optimizer,
replay, games in progress), resume and stop rule are those of every platform; env steps are
moves played.
"""

from __future__ import annotations

import collections
import functools
import time
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from trellis.builders.contract.config import ExperimentConfig
from trellis.builders.contract.self_play import Match, SelfPlayAgent
from trellis.builders.experiments.anakin_run import AnakinError, seconds_since_process_start
from trellis.builders.experiments.checkpointing import Checkpointer, checkpoint_dir
from trellis.builders.experiments.counter import CounterSnapshot
from trellis.builders.experiments.execution import Ending, Execution, Report
from trellis.builders.experiments.platforms import Platform, PopulationSettings
from trellis.builders.experiments.schedule import LearningRateSchedule
from trellis.builders.experiments.stop import SIGNAL, StopRule
from trellis.envs import EnvFactory


def _check(builder: SelfPlayAgent, settings: Platform) -> None:
    if not isinstance(settings, PopulationSettings):
        raise AnakinError(f"{type(builder).__name__} self-plays on the device: use "
                          "--platform=anakin")
    if settings.num_seeds != 1 or settings.pbt is not None:
        raise AnakinError(f"{type(builder).__name__} trains one member: --num_seeds=1, no --pbt")
    if settings.updates_per_call != 1:  # agents/alphazero/config.py's PLATFORM_DEFAULTS: why.
        raise AnakinError(f"{type(builder).__name__}'s compiled call is one self-play iteration "
                          "(--updates_per_iteration sets its SGD steps): --updates_per_call "
                          f"must be 1, got {settings.updates_per_call}")


class SelfPlayProgram:
    """The agent's jitted self-play pieces for one game: `init`, `iterate` (the builder's
    `make_self_play`, with `params` and `counts` of its state), and `match` (its search
    against a baseline, the builder's `make_match`)."""

    def __init__(self, builder: SelfPlayAgent, env_factory: EnvFactory):
        self.env = env = env_factory.make()
        spec = env_factory.spec()
        self.builder, self.networks = builder, builder.make_networks(spec)
        self_play = builder.make_self_play(self.networks, spec, env)
        self.init, self.iterate = jax.jit(self_play.init), jax.jit(self_play.iterate)
        self.params, self.counts = self_play.params, self_play.counts
        self._matches: dict[tuple[str, int], Match] = {}

    def match(self, opponent: str, num_games: int) -> Match:
        """`play(params, key) -> outcomes [num_games]` (jitted, made once): the search
        against the agent's baseline `opponent`, half moving first.

        Raises:
          AnakinError: the agent has no such baseline for this game.
        """
        play = self._matches.get((opponent, num_games))
        if play is None:
            try:
                play = jax.jit(self.builder.make_match(self.networks, self.env, opponent,
                                                       num_games))
            except ValueError as e:
                raise AnakinError(str(e)) from None
            self._matches[(opponent, num_games)] = play
        return play

    def outcomes(self, params: Any, opponent: str, key: jax.Array, num_games: int
                 ) -> np.ndarray:
        """The search's outcomes (1 win, 0 draw, -1 loss) in `num_games` against
        `opponent` (`match`)."""
        return np.asarray(self.match(opponent, num_games)(params, key))


def outcome_rates(outcomes: np.ndarray) -> dict[str, float]:
    """{"win", "draw", "loss"}: the fractions of outcomes 1, 0 and -1."""
    outcomes = np.asarray(outcomes)
    return {"win": float(np.mean(outcomes > 0)), "draw": float(np.mean(outcomes == 0)),
            "loss": float(np.mean(outcomes < 0))}


def restore_params(builder: SelfPlayAgent, env_factory: EnvFactory, seed: int, run_dir: str,
                   step: int | None = None) -> tuple[SelfPlayProgram, Any, int, dict[str, Any]]:
    """A self-play run's params from its checkpoint `step` (default: the newest).

    Returns:
      (the program, the params, the checkpoint's step, its progress).

    Raises:
      builders.experiments.checkpointing.CheckpointError: no such checkpoint, or unreadable.
    """
    program = SelfPlayProgram(builder, env_factory)
    checkpointer = Checkpointer(checkpoint_dir(run_dir))
    try:
        step = checkpointer.latest_step() if step is None else step
        state, progress = checkpointer.restore(program.init(jax.random.key(seed)), step)
    finally:
        checkpointer.close()
    return program, program.params(state), step, progress


class SelfPlayRun:
    """The session's `Execution` of self-play (see the module's docstring).

    Args:
      builder, env_factory, config, run_dir: as for `session.run_experiment`.
      stop_rule: the session's rule.
      resume: (step, progress) of the checkpoint to continue from, or None.
    """

    def __init__(self, builder: SelfPlayAgent, env_factory: EnvFactory, config: ExperimentConfig,
                 run_dir: str, stop_rule: StopRule,
                 resume: tuple[int, Mapping[str, Any]] | None):
        # The session's clock starts with the process: imports and compilation count.
        self._started = time.monotonic() - (seconds_since_process_start() or 0.0)
        self._agent, self._rule = builder.config, stop_rule
        self._program = SelfPlayProgram(builder, env_factory)
        spec = env_factory.spec()
        self._schedule = LearningRateSchedule.of(
            builder, builder.make_training(self._program.networks, spec), config.total_env_steps)
        if builder.config.eval_every_updates:  # A baseline that cannot play: before the start.
            self._program.match(builder.config.eval_opponent, builder.config.eval_games)
        self._state = self._program.init(jax.random.key(config.seed))
        progress: Mapping[str, Any] = {}
        self._checkpoints = functools.cache(
            lambda: Checkpointer(checkpoint_dir(run_dir), config.keep_checkpoints))
        if resume:
            self._state, progress = self._checkpoints().restore(self._state, resume[0])
        self._elapsed_before = float(progress.get("elapsed_s", 0.0))
        self._resumes = int(progress.get("resumes", 0)) + 1 if resume else 0
        self._episodes = int(progress.get("episodes", 0))
        self._returns = collections.deque(progress.get("returns", []),
                                          maxlen=config.return_window)
        self._eval_key = jax.random.fold_in(jax.random.key(config.seed), 2)
        self._next_eval = 0  # Learner steps: an evaluation at the start of every session.
        self._metrics: Mapping[str, Any] = {}
        self._steady: tuple[float, int] | None = None  # (time, moves) after compiling.
        self._last: tuple[Report, CounterSnapshot, float] | None = None

    def _snapshot(self) -> CounterSnapshot:
        counts = jax.device_get(self._program.counts(self._state))
        return CounterSnapshot(
            env_steps=int(counts.moves), learner_steps=int(counts.learner_steps),
            episodes=self._episodes,
            returns=tuple(self._returns), lengths=(),
            elapsed_s=self._elapsed_before + time.monotonic() - self._started,
            resumes=self._resumes)

    def _evaluate(self, learner_steps: int) -> dict[str, Any]:
        """Evaluation games if due: their outcomes join the returns; the record's fields."""
        agent = self._agent
        if not agent.eval_every_updates or learner_steps < self._next_eval:
            return {}
        self._next_eval = (learner_steps // agent.eval_every_updates + 1) * (
            agent.eval_every_updates)
        outcomes = self._program.outcomes(
            self._program.params(self._state), agent.eval_opponent,
            jax.random.fold_in(self._eval_key, learner_steps), agent.eval_games)
        self._returns.extend(float(o) for o in outcomes)
        self._episodes += len(outcomes)
        return {"eval/opponent": agent.eval_opponent, "eval/learner_steps": learner_steps,
                **{f"eval/{name}": rate for name, rate in outcome_rates(outcomes).items()}}

    def _report(self, snapshot: CounterSnapshot, stopped_by: str | None,
                fields: Mapping[str, Any]) -> Report:
        now = time.monotonic()
        steady_time, steady_moves = self._steady or (now, snapshot.env_steps)
        stats = {**snapshot.stats(),
                 **{k: float(np.asarray(v)) for k, v in self._metrics.items()},
                 "env_steps_per_s": _rate(snapshot.env_steps - steady_moves, now - steady_time),
                 "self_play_games": int(jax.device_get(
                     self._program.counts(self._state).games_finished))}
        report = Report(stats, fields, stopped_by, record_now=bool(fields))
        self._last = (report, snapshot, now)
        return report

    def advance(self, timeout_s: float) -> Report:
        del timeout_s  # One compiled call: its length is the program's.
        before = self._snapshot()
        fields = self._evaluate(before.learner_steps)
        schedule = {}
        if self._schedule is not None:  # The self-play state holds the training state.
            self._state = self._schedule.apply(self._state, before.env_steps)
            schedule = self._schedule.metrics()
        self._state, metrics = self._program.iterate(self._state)
        self._metrics = {**metrics, **schedule}
        snapshot = self._snapshot()  # Waits for the call.
        if self._steady is None:  # After the first call, which compiled the program.
            self._steady = (time.monotonic(), snapshot.env_steps)
        return self._report(snapshot, self._rule(snapshot), fields)

    def checkpoint(self) -> None:
        snapshot = self._snapshot()
        self._checkpoints().save(snapshot.env_steps, self._state, snapshot.progress())

    def stop(self) -> Report:
        return self._report(self._snapshot(), SIGNAL, {})

    def finish(self) -> Ending:
        assert self._last is not None
        report, snapshot, stopped = self._last
        self._checkpoints().save(snapshot.env_steps, self._state, snapshot.progress())
        self._checkpoints().close()
        steady_time, steady_moves = self._steady or (stopped, snapshot.env_steps)
        fields = {"steady_env_steps_per_s": _rate(snapshot.env_steps - steady_moves,
                                                  stopped - steady_time),
                  "self_play_games": report.stats["self_play_games"]}
        return Ending(130 if report.stopped_by == SIGNAL else 0, self._started, fields)


def _rate(steps: int, seconds: float) -> float:
    return round(steps / seconds, 1) if seconds > 0 else 0.0


def execution(builder: SelfPlayAgent, env_factory: EnvFactory, config: ExperimentConfig,
              run_dir: str, settings: Platform, resume: tuple[int, Mapping[str, Any]] | None,
              quiet: bool = False) -> Execution:
    """Self-play on anakin (the session's table's signature; nothing to be quiet about).

    Raises:
      AnakinError: another platform, a population, or `--updates_per_call` other than 1
        (`session.check_supported` has checked the env is a two-player game).
    """
    del quiet
    _check(builder, settings)
    return SelfPlayRun(builder, env_factory, config, run_dir, StopRule.of(config), resume)
