"""Two-player self-play on the anakin platform: `SelfPlayIterations` (driven by
`in_process.InProcessRun`) runs an agent whose learning is self-play with search on the device
(`Capabilities(learns_from=SELF_PLAY)`: AlphaZero).

Each call is one compiled call of the agent's `iterate` (its `make_self_play`): moves of
all games chosen by the search, positions into the replay on the device, SGD steps. Every
`eval_every_updates` SGD steps (and once at the start of a session) the agent's search plays
`eval_games` games against the agent's `eval_opponent` (the builder's `make_match`; AlphaZero's
baselines are agents/common/baselines.py), half with each side moving first;
metrics.jsonl gets the win, draw and loss rates, and the games' outcomes (1, 0, -1 for the
agent) are the run's episode returns, so `mean_return`, the learning curve and
`--stop_at_return` speak of the score against the baseline.

The session's signals, run directory, checkpoints (the whole loop's state: params, optimizer,
replay, games in progress), resume and stop rule are those of every platform; env steps are
moves played.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from trellis.builders.contract.config import ExperimentConfig
from trellis.builders.contract.self_play import Match, SelfPlayAgent
from trellis.builders.experiments.anakin_run import AnakinError
from trellis.builders.experiments.counter import CounterSnapshot, ReturnWindow
from trellis.builders.experiments.evaluation import summarize
from trellis.builders.experiments.execution import Execution
from trellis.builders.experiments.in_process import Called, InProcessRun
from trellis.builders.experiments.platforms import Platform, PopulationSettings
from trellis.builders.experiments.restore import RestoreError, Wanted, restore_state
from trellis.builders.experiments.schedule import LearningRateSchedule
from trellis.builders.experiments.stop import StopRule
from trellis.envs import EnvFactory
from trellis.envs.contract import is_jax
from trellis.envs.specs import EnvSpec


def _check(builder: SelfPlayAgent, settings: Platform) -> None:
    if not isinstance(settings, PopulationSettings):
        raise AnakinError(f"{type(builder).__name__} self-plays on the device: use "
                          "--platform=anakin")
    if settings.num_seeds != 1 or settings.pbt is not None:
        raise AnakinError(f"{type(builder).__name__} trains one member: --num_seeds=1, no --pbt")
    # agents/common/self_play_config.py's PLATFORM_DEFAULTS says why.
    if settings.updates_per_call != 1:
        raise AnakinError(f"{type(builder).__name__}'s compiled call is one self-play iteration "
                          "(--updates_per_iteration sets its SGD steps): --updates_per_call "
                          f"must be 1, got {settings.updates_per_call}")


class SelfPlayProgram:
    """The agent's jitted self-play pieces for one game: `init`, `iterate` (the builder's
    `make_self_play`, with `params` and `counts` of its state), and `match` (its search
    against a baseline, the builder's `make_match`)."""

    def __init__(self, builder: SelfPlayAgent, env_factory: EnvFactory):
        # `session.check_supported` runs self-play agents on two-player games only: pgx's,
        # JAX envs with an EnvSpec (envs/contract.py: a MultiAgentSpec is MULTI_AGENT's).
        assert is_jax(env_factory), env_factory.env_id
        self.env = env = env_factory.make()
        spec = env_factory.spec()
        assert isinstance(spec, EnvSpec), spec
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
      builders.experiments.restore.RestoreError: the run has no checkpoints.
      builders.experiments.checkpointing.CheckpointError: no such checkpoint, or unreadable.
    """
    program = SelfPlayProgram(builder, env_factory)
    state, step, progress = restore_state(run_dir, program.init(jax.random.key(seed)), step)
    return program, program.params(state), step, progress


@dataclasses.dataclass(frozen=True)
class MatchMember:
    """A self-play run's player restored from a checkpoint (`restore.Member`): its search
    plays games against a baseline, half moving first; the returns are the outcomes (1 win,
    0 draw, -1 loss).

    Attributes:
      program: the run's self-play pieces.
      params: the checkpoint's params.
      step, progress: the checkpoint's.
      opponent: the baseline.
    """

    program: SelfPlayProgram
    params: Any
    step: int
    progress: Mapping[str, Any]
    opponent: str

    def play(self, episodes: int, seed: int) -> dict[str, Any]:
        try:
            outcomes = self.program.outcomes(self.params, self.opponent, jax.random.key(seed),
                                             episodes)
        except AnakinError as e:
            raise RestoreError(str(e)) from None
        return {**summarize(outcomes.tolist()), "opponent": self.opponent,
                **outcome_rates(outcomes)}

    def record(self, episodes: int, seed: int, video_dir: str) -> dict[str, Any]:
        raise RestoreError("--video records single-agent envs whose factory renders "
                           "(envs/contract.py); pgx's games do not render here")


def restore_match(builder: SelfPlayAgent, env_factory: EnvFactory, config: ExperimentConfig,
                  wanted: Wanted) -> MatchMember:
    """A self-play run's player (`session.EXECUTIONS`' restore), against `wanted.opponent`
    (default: the agent's `eval_opponent`).

    Raises:
      builders.experiments.checkpointing.CheckpointError: no such checkpoint, or unreadable.
    """
    program, params, step, progress = restore_params(builder, env_factory, config.seed,
                                                     wanted.run_dir, wanted.step)
    return MatchMember(program, params, step, progress,
                       wanted.opponent or builder.config.eval_opponent)


class SelfPlayIterations:
    """Self-play as `in_process.InProcessRun` drives it (see the module's docstring): each
    call is one self-play iteration, after the evaluation games when due.

    Args:
      builder, env_factory, config: as for `session.run_experiment`.

    Raises:
      AnakinError: the agent's `eval_opponent` cannot play this game.
    """

    num_members = 1

    def __init__(self, builder: SelfPlayAgent, env_factory: EnvFactory,
                 config: ExperimentConfig):
        self._agent = builder.config
        self._program = SelfPlayProgram(builder, env_factory)
        spec = env_factory.spec()
        assert isinstance(spec, EnvSpec), spec  # As SelfPlayProgram's.
        self._schedule = LearningRateSchedule.of(
            builder, builder.make_training(self._program.networks, spec), config.total_env_steps)
        if builder.config.eval_every_updates:  # A baseline that cannot play: before the start.
            self._program.match(builder.config.eval_opponent, builder.config.eval_games)
        self._state = self._program.init(jax.random.key(config.seed))
        self._episodes = ReturnWindow(config.return_window)  # The evaluations' outcomes.
        self._eval_key = jax.random.fold_in(jax.random.key(config.seed), 2)
        self._next_eval = 0  # Learner steps: an evaluation at the start of every session.
        self._games = 0  # Self-play games finished, at the last call.

    @property
    def state(self) -> Any:
        return self._state

    def restore(self, state: Any, progress: Mapping[str, Any]) -> None:
        self._state = state
        self._episodes = ReturnWindow(self._episodes.size, progress)

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
        self._episodes.add(float(o) for o in outcomes)
        return {"eval/opponent": agent.eval_opponent, "eval/learner_steps": learner_steps,
                **{f"eval/{name}": rate for name, rate in outcome_rates(outcomes).items()}}

    def call(self) -> Called:
        before = jax.device_get(self._program.counts(self._state))
        fields = self._evaluate(int(before.learner_steps))
        schedule: dict[str, float] = {}
        if self._schedule is not None:  # The self-play state holds the training state.
            self._state = self._schedule.apply(self._state, int(before.moves))
            schedule = self._schedule.metrics()
        self._state, metrics = self._program.iterate(self._state)
        self._games = int(jax.device_get(self._program.counts(self._state).games_finished))
        return Called({**{k: float(np.asarray(v)) for k, v in metrics.items()}, **schedule,
                       "self_play_games": self._games}, fields, record_now=bool(fields))

    def snapshots(self, elapsed_s: float, resumes: int) -> list[CounterSnapshot]:
        counts = jax.device_get(self._program.counts(self._state))
        episodes = self._episodes
        return [CounterSnapshot(int(counts.moves), int(counts.learner_steps), episodes.episodes,
                                episodes.returns, episodes.lengths, elapsed_s, resumes)]

    def fields(self, snapshots: Sequence[CounterSnapshot]) -> dict[str, Any]:
        return {}

    def summary(self, snapshots: Sequence[CounterSnapshot]) -> dict[str, Any]:
        return {"self_play_games": self._games}


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
    return InProcessRun(SelfPlayIterations(builder, env_factory, config), config, run_dir,
                        StopRule.of(config), resume)
