"""Evolution strategies' executions: one generation per jitted call on anakin, and the program
graph of es_node.py on the host platforms.

On anakin (`ESAnakinRun`) a generation is one compiled call: ask (the members as flat params,
drawn from the search state's common random numbers) -> every member plays whole episodes of
the JAX env, vmapped -> tell (the agent's pure update on the fitnesses). The host only counts
the episodes (`counter.Counter`, as the learner node does), asks the stop rule, and writes
checkpoints of the search state, which has the same structure as the host learner's, so
`launch/evaluate.py` and `--resume` treat both alike.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp

from trellis.builders.contract.config import ExperimentConfig
from trellis.builders.contract.population import MemberPolicy, PopulationSearch, Search
from trellis.builders.experiments.anakin_run import AnakinError, seconds_since_process_start
from trellis.builders.experiments.checkpointing import Checkpointer, checkpoint_dir
from trellis.builders.experiments.counter import Counter, CounterSnapshot
from trellis.builders.experiments.es_node import count_generation, make_es_program
from trellis.builders.experiments.execution import Ending, Execution, Report
from trellis.builders.experiments.platforms import Platform, PopulationSettings
from trellis.builders.experiments.program_run import ProgramRun
from trellis.builders.experiments.schedule import LearningRateSchedule
from trellis.builders.experiments.stop import SIGNAL, StopRule
from trellis.envs import EnvFactory, JaxEnvFactory
from trellis.envs.contract import is_jax


def play_population(env: Any, act: MemberPolicy, population: jax.Array, episodes: int,
                    key: jax.Array
                    ) -> tuple[jax.Array, jax.Array]:
    """Every member plays `episodes` whole episodes in fresh envs of its own (jittable).

    Args:
      env: a `JaxEnv`; its time limit ends every episode.
      act: `act(flat_params [D], obs [E, ...]) -> actions [E, ...]`, deterministic.
      population: [N, D] the members' flat params.
      episodes: E, episodes per member.
      key: for the envs' resets and steps.

    Returns:
      (returns [N, E], lengths [N, E]): undiscounted returns and env steps of each episode.
    """
    size = population.shape[0]
    reset_key, key = jax.random.split(key)
    reset = jax.vmap(jax.vmap(env.reset))
    step = jax.vmap(jax.vmap(env.step))
    env_state, timestep = reset(jax.random.split(reset_key, (size, episodes)))

    def body(carry):
        env_state, timestep, returns, lengths, running, key = carry
        key, step_key = jax.random.split(key)
        actions = jax.vmap(act)(population, timestep.obs)  # [N, E, ...]
        env_state, timestep = step(jax.random.split(step_key, (size, episodes)), env_state,
                                   actions)
        returns = returns + jnp.where(running, timestep.reward, 0.0)
        lengths = lengths + running.astype(jnp.int32)
        running = running & ~(timestep.terminated | timestep.truncated)
        return env_state, timestep, returns, lengths, running, key

    carry = (env_state, timestep, jnp.zeros((size, episodes), jnp.float32),
             jnp.zeros((size, episodes), jnp.int32), jnp.ones((size, episodes), bool), key)
    _, _, returns, lengths, _, _ = jax.lax.while_loop(lambda c: jnp.any(c[4]), body, carry)
    return returns, lengths


def make_generation(builder: PopulationSearch, env_factory: JaxEnvFactory
                    ) -> tuple[Callable[[Any], tuple[Any, jax.Array, jax.Array, Any]], Search]:
    """The agent's generation on a JAX env, and its search.

    Returns:
      (`generation(state) -> (state, returns [N, E], lengths [N, E], metrics)`, pure and
      jittable; the search).
    """
    networks = builder.make_networks(env_factory.spec())
    search = builder.make_search(networks)
    act = builder.make_member_policy(networks)
    env = env_factory.make()
    episodes = builder.config.episodes_per_member

    def generation(state: Any) -> tuple[Any, jax.Array, jax.Array, Any]:
        population = search.ask(state)
        returns, lengths = play_population(env, act, population, episodes,
                                           search.episode_key(state))
        state, metrics = search.update(state, {"fitness": jnp.mean(returns, axis=1)})
        return state, returns, lengths, metrics

    return generation, search


def generation_stats(snapshot: CounterSnapshot, metrics: Mapping[str, Any]) -> dict[str, Any]:
    """A report's stats: the counters, and the last generation's fitness and search metrics."""
    stats = snapshot.stats()
    stats.update({name: float(value) for name, value in metrics.items()})
    stats["generation"] = snapshot.learner_steps
    return stats


class ESAnakinRun:
    """The session's `Execution` of evolution strategies on the anakin platform.

    Each `advance` is one generation (one compiled call: `--updates_per_call` other than 1 is
    refused). A population of populations is not what ES means by a population: `--num_seeds`,
    `--member_hparams` and `--pbt` are refused.

    Args:
      builder, env_factory, config, run_dir: as for `session.run_experiment`.
      settings: anakin's settings (only the defaults are accepted).
      stop_rule: the session's rule, asked after every generation.
      resume: (step, progress) of the checkpoint to continue from, or None.

    Raises:
      AnakinError: an env that is not written in JAX, or population settings of anakin.
    """

    def __init__(self, builder: PopulationSearch, env_factory: EnvFactory,
                 config: ExperimentConfig, run_dir: str, settings: PopulationSettings,
                 stop_rule: StopRule,
                 resume: tuple[int, Mapping[str, Any]] | None):
        # The session's clock starts with the process: imports and compilation count.
        self._started = time.monotonic() - (seconds_since_process_start() or 0.0)
        if not is_jax(env_factory):
            raise AnakinError(f"--platform=anakin needs an env written in JAX, e.g. "
                              f"gymnax:CartPole-v1; {env_factory.env_id!r} is a Gymnasium id")
        if settings.num_seeds != 1 or settings.hparams or settings.pbt is not None:
            raise AnakinError("ES's population is --population_size (its members share one "
                              "search): --num_seeds must be 1, without --member_hparams or --pbt")
        if settings.updates_per_call != 1:  # agents/es/config.py's PLATFORM_DEFAULTS says why.
            raise AnakinError(f"ES's compiled call is one generation (--population_size sets "
                              f"its size): --updates_per_call must be 1, got "
                              f"{settings.updates_per_call}")
        self._rule = stop_rule
        generation, search = make_generation(builder, env_factory)
        spec = env_factory.spec()
        self._schedule = LearningRateSchedule.of(
            builder, builder.make_training(builder.make_networks(spec), spec),
            config.total_env_steps)
        self._checkpointer: Checkpointer | None = None
        self._checkpoint_args = (checkpoint_dir(run_dir), config.keep_checkpoints)
        state = jax.jit(search.init)(jax.random.PRNGKey(config.seed))
        if resume is None:
            self._counter = Counter(config.return_window)
        else:
            state, progress = self._checkpoints().restore(state, resume[0])
            self._counter = Counter.restore(progress, config.return_window)
        self._state = state
        self._generation = jax.jit(generation).lower(state).compile()
        self._metrics: Mapping[str, Any] = {}
        self._steady: tuple[float, int] | None = None  # (time, env steps) after compiling.
        self._last: tuple[Report, CounterSnapshot, float] | None = None
        self._counter.start_session()

    def _checkpoints(self) -> Checkpointer:
        # orbax takes a second or two to import: opened at first use (a short run's end).
        if self._checkpointer is None:
            self._checkpointer = Checkpointer(*self._checkpoint_args)
        return self._checkpointer

    def _report(self, stopped_by: str | None = None) -> Report:
        snapshot = self._counter.snapshot()
        stats = generation_stats(snapshot, self._metrics)
        since, steps = self._steady or (time.monotonic(), snapshot.env_steps)
        elapsed = time.monotonic() - since
        stats["env_steps_per_s"] = round((snapshot.env_steps - steps) / elapsed, 1) if (
            elapsed > 0) else 0.0
        report = Report(stats, stopped_by=stopped_by)
        self._last = (report, snapshot, time.monotonic())
        return report

    def advance(self, timeout_s: float) -> Report:
        del timeout_s  # One generation: its length is the program's.
        schedule = {}
        if self._schedule is not None:
            self._state = self._schedule.apply(self._state, self._counter.env_steps())
            schedule = self._schedule.metrics()
        self._state, returns, lengths, metrics = self._generation(self._state)
        returns, lengths, metrics = jax.device_get((returns, lengths, metrics))
        self._metrics = {**metrics, **schedule}
        count_generation(self._counter, returns, lengths)
        if self._steady is None:  # After the first call, which waited for the compilation.
            self._steady = (time.monotonic(), self._counter.env_steps())
        return self._report(self._rule(self._counter.snapshot()))

    def checkpoint(self) -> None:
        snapshot = self._counter.snapshot()
        self._checkpoints().save(snapshot.env_steps, self._state, snapshot.progress())

    def stop(self) -> Report:
        return self._report(SIGNAL)

    def finish(self) -> Ending:
        assert self._last is not None
        report, snapshot, stopped = self._last
        self._checkpoints().save(snapshot.env_steps, self._state, snapshot.progress())
        self._checkpoints().close()
        since, steps = self._steady or (stopped, snapshot.env_steps)
        fields = {"generations": snapshot.learner_steps,
                  # After the first call (compiled) until the stop: the steady rate.
                  "steady_env_steps_per_s": round((snapshot.env_steps - steps)
                                                  / (stopped - since), 1) if stopped > since
                  else 0.0}
        return Ending(130 if report.stopped_by == SIGNAL else 0, self._started, fields)


def execution(builder: PopulationSearch, env_factory: EnvFactory, config: ExperimentConfig,
              run_dir: str, settings: Platform, resume: tuple[int, Mapping[str, Any]] | None,
              quiet: bool = False) -> Execution:
    """ES on `settings`' platform: `ESAnakinRun` on anakin, else the program graph of
    `es_node.make_es_program` (env workers send fitnesses, the learner node tells them).
    Nothing to be quiet about: `quiet` is the session's table's common argument."""
    del quiet
    rule = StopRule.of(config)
    if isinstance(settings, PopulationSettings):
        return ESAnakinRun(builder, env_factory, config, run_dir, settings, rule, resume)
    return ProgramRun(builder, env_factory, config, run_dir, settings, rule,
                      None if resume is None else resume[0], make=make_es_program)

