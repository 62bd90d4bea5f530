"""Evolution strategies on the host platforms (local_mt, local_mp, ray): the ES learner node and
its env workers, after Salimans et al. (2017), section 2.1.

Only seeds and scalars cross the wire. Every env worker holds a copy of the search state
(`agents.es.learner.ESLearner`), fetched once when it starts (`ESLearnerNode.search_state`).
Each generation it draws the members from the state's common random numbers (its noise key and
generation count: no parameter vector is sent), plays its own members' episodes on its CPU,
and reports their returns and lengths, O(members) scalars, with a checksum of its state. The
learner node gathers all N fitnesses, tells them to its search, and hands them back
(`ESLearnerNode.fitness`, N scalars) to every worker, which tells them to its own copy: the
same jitted update on the same device kind and dtype (the CPU), so the copies stay equal bit
for bit. A worker whose checksum differs from the learner's (another CPU's floating point, a
bug) has its report refused and fetches the state again: one full copy, counted as a resync
(docs/es.md).

A generation is a barrier: the learner tells it once every member has a fitness. A worker
that dies is restarted by the runtime, fetches the state and plays its members again.
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import numpy as np

from trellis.builders.contract.config import ExperimentConfig
from trellis.builders.contract.population import PopulationSearch
from trellis.builders.experiments.checkpointing import Checkpointer, Checkpoints
from trellis.builders.experiments.counter import Counter, CounterSnapshot, StepRate
from trellis.builders.experiments.env_worker import drawn_seed
from trellis.builders.experiments.evaluation import Evaluator
from trellis.builders.experiments.schedule import LearningRateSchedule, require_hparams
from trellis.builders.experiments.stop import StopRule
from trellis.envs.contract import EnvFactory, HostEnvFactory
from trellis.envs.specs import EnvSpec
from trellis.launch import runtime

# Told generations' fitnesses kept for workers still to fetch them (one behind at most: the
# learner cannot tell generation g + 1 before every worker has reported its members of it).
_KEPT_GENERATIONS = 4
# How long one `fitness` call waits at most, so that a worker notices the program's stop.
_WAIT_S = 1.0


def state_checksum(state: Any) -> int:
    """CRC-32 of a search state's bytes (every leaf, in order): equal copies, equal sums."""
    crc = 0
    for leaf in jax.tree.leaves(jax.device_get(state)):
        crc = zlib.crc32(np.ascontiguousarray(leaf).tobytes(), crc)
    return crc


def worker_members(worker_id: int, num_workers: int, population_size: int) -> np.ndarray:
    """The members env worker `worker_id` plays: every `num_workers`-th from `worker_id`."""
    return np.arange(worker_id, population_size, num_workers)


def play_members(act: Callable[[np.ndarray, np.ndarray], Any], population: np.ndarray,
                 envs: Any, episodes: int, seed: int,
                 should_stop: Callable[[], bool] = lambda: False
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Each of k members plays `episodes` whole episodes, one per env of a vector env.

    Args:
      act: `act(params [K, D], obs [K, ...]) -> actions [K, ...]`, one member per row.
      population: [k, D] the members' flat params.
      envs: a Gymnasium vector env of K = k * episodes envs with next-step autoreset (env
        m * episodes + e plays member m; after its episode it is ignored).
      episodes: episodes per member.
      seed: the envs' reset seed.
      should_stop: polled every step; True cuts the episodes short.

    Returns:
      (returns [k, episodes], lengths [k, episodes]).
    """
    params = np.repeat(population, episodes, axis=0)
    obs, _ = envs.reset(seed=seed)
    returns = np.zeros(params.shape[0], np.float64)
    lengths = np.zeros(params.shape[0], np.int64)
    running = np.ones(params.shape[0], bool)
    while running.any() and not should_stop():
        obs, reward, terminated, truncated, _ = envs.step(np.asarray(act(params, obs)))
        returns += np.where(running, reward, 0.0)
        lengths += running
        running &= ~(np.asarray(terminated) | np.asarray(truncated))
    shape = (population.shape[0], episodes)
    return returns.reshape(shape), lengths.reshape(shape)


class Told(NamedTuple):
    """What the learner told a generation: every member's fitness [N], and the learning-rate
    factor it set first (None without a schedule), which every worker's copy sets too."""

    fitness: np.ndarray
    learning_rate_factor: float | None


def count_generation(counter: Counter, returns: np.ndarray, lengths: np.ndarray) -> None:
    """Counts a generation's episodes ([N, E] returns and lengths) and its update."""
    counter.add_env_steps(int(lengths.sum()),
                          zip(returns.ravel().tolist(), lengths.ravel().tolist(), strict=True))
    counter.add_learner_step()


class ESLearnerNode:
    """Service node: the search state, the generation barrier, counting, stopping, checkpoints.

    RPCs: `search_state()` and `report(...)` / `fitness(...)` for env workers (see the
    module's docstring), `stats()`, `checkpoint()`, and for the evaluator `env_steps()`,
    `get_params()` and `record_evaluation(...)`.

    Args:
      builder: the population-search agent (`make_learner` gives the search's host shell).
      env_factory: the envs (their spec sizes the policy).
      config: the experiment's settings (with the agent's, its learning-rate schedule).
      checkpoints: where to checkpoint and what to resume from; None: no checkpoints.
      stop_rule: asked after every generation (default: the config's).
    """

    def __init__(self, builder: PopulationSearch, env_factory: EnvFactory,
                 config: ExperimentConfig, checkpoints: Checkpoints | None = None,
                 stop_rule: StopRule | None = None):
        spec = env_factory.spec()
        # `session.check_supported` runs population searches on single-agent envs only.
        assert isinstance(spec, EnvSpec), spec
        networks = builder.make_networks(spec)
        self._learner = builder.make_learner(networks, spec, jax.random.PRNGKey(config.seed))
        self._schedule = LearningRateSchedule.of(
            builder, builder.make_training(networks, spec), config.total_env_steps)
        self._checkpointer = None
        progress = None
        if checkpoints is not None:
            self._checkpointer = Checkpointer(checkpoints.directory, config.keep_checkpoints)
            if checkpoints.resume_step is not None:
                state, progress = self._checkpointer.restore(self._learner.state,
                                                             checkpoints.resume_step)
                self._learner.restore(state)
        self._counter = (Counter(config.return_window) if progress is None
                         else Counter.restore(progress, config.return_window))
        self._stop_rule = stop_rule or StopRule.of(config)
        self._rate = StepRate(self._counter.env_steps())
        self._stop = runtime.stop_event()
        self._checkpoint_due = threading.Event()
        # The generation under way: who has reported, and what (guarded by the condition).
        self._told = threading.Condition()
        shape = (self._learner.num_members, builder.config.episodes_per_member)  # [N, E]
        self._returns = np.zeros(shape)
        self._lengths = np.zeros(shape, np.int64)
        self._reported = np.zeros(shape[0], bool)
        self._told_by_generation: dict[int, Told] = {}
        self._generation = self._learner.generation
        self._checksum = state_checksum(self._learner.state)
        self._resyncs = 0
        self._metrics: dict[str, float] = {}
        self._evaluation: dict[str, Any] | None = None

    # --- RPCs for env workers ---------------------------------------------------------

    def search_state(self) -> Any:
        """The search state as host arrays: what a (re)starting env worker fetches, once."""
        with self._told:
            return jax.device_get(self._learner.state)

    def report(self, generation: int, members: np.ndarray, returns: np.ndarray,
               lengths: np.ndarray, checksum: int) -> bool:
        """A worker's episodes of its `members` in `generation` ([k, E] returns and lengths),
        played from a search state whose `state_checksum` is `checksum`.

        Returns:
          True if kept; False if the worker's state is not this generation's learner state
          (it then fetches `search_state` and plays again).
        """
        with self._told:
            if generation != self._generation or checksum != self._checksum:
                self._resyncs += 1
                return False
            self._returns[members] = returns
            self._lengths[members] = lengths
            self._reported[members] = True
            self._told.notify_all()
            return True

    def fitness(self, generation: int, timeout_s: float = _WAIT_S) -> Told | None:
        """What the learner told `generation` (every member's fitness [N], the learning-rate
        factor), once told, waiting at most `timeout_s`; None if not told by then.

        Raises:
          LookupError: a generation told too long ago to be kept (the worker is out of step).
        """
        with self._told:
            self._told.wait_for(lambda: generation < self._generation or self._stop.is_set(),
                                timeout_s)
            if generation < self._generation and generation not in self._told_by_generation:
                raise LookupError(f"generation {generation} was told long ago (now at "
                                  f"{self._generation}); fetch search_state()")
            return self._told_by_generation.get(generation)

    # --- RPCs for the session and the evaluator ---------------------------------------

    def stats(self) -> dict[str, Any]:
        """Counters, the return window, the last generation's fitness and search metrics."""
        return self._stats(self._counter.snapshot())

    def _stats(self, snapshot: CounterSnapshot) -> dict[str, Any]:
        stats = snapshot.stats()
        stats.update(self._metrics, generation=snapshot.learner_steps,
                     env_steps_per_s=self._rate.update(snapshot.env_steps),
                     resyncs=self._resyncs, evaluation=self._evaluation)
        return stats

    def checkpoint(self) -> None:
        """Checkpoints between two generations."""
        self._checkpoint_due.set()

    def env_steps(self) -> int:
        return self._counter.env_steps()

    def get_params(self) -> Any:
        """The search mean as the policy's params (host arrays)."""
        with self._told:
            return jax.device_get(self._learner.params)

    def record_evaluation(self, result: dict[str, Any]) -> None:
        self._evaluation = dict(result)

    # --- The generation loop ----------------------------------------------------------

    def run(self) -> None:
        """Tells generations until the stop rule or the program says stop; checkpoints last."""
        self._counter.start_session()
        try:
            reason = self._generations()
            final = self._counter.snapshot()
            self._save(final)
            if reason is not None:
                runtime.request_stop(reason, info=self._stats(final))
            else:  # Stopped from outside: the final counts go with that stop's result.
                runtime.report_final(self._stats(final))
        finally:
            with self._told:
                self._told.notify_all()  # Workers waiting on `fitness` see the stop.
            if self._checkpointer is not None:
                self._checkpointer.close()

    def _generations(self) -> str | None:
        while not self._stop.is_set():
            reason = self._stop_rule(self._counter.snapshot())
            if reason is not None:
                return reason
            if self._checkpoint_due.is_set():
                self._checkpoint_due.clear()
                self._save(self._counter.snapshot())
            with self._told:
                if not self._told.wait_for(self._reported.all, 0.05):
                    continue
                self._tell()
        return None

    def _tell(self) -> None:
        """Tells the complete generation and counts its episodes (under the condition, so a
        checkpoint's counters always match its state)."""
        fitness = self._returns.mean(axis=1).astype(np.float32)
        factor = None
        if self._schedule is not None:
            self._learner.restore(self._schedule.apply(self._learner.state,
                                                       self._counter.env_steps()))
            factor = self._schedule.factor
        metrics = self._learner.step({"fitness": fitness})
        self._told_by_generation[self._generation] = Told(fitness, factor)
        self._told_by_generation.pop(self._generation - _KEPT_GENERATIONS, None)
        self._generation += 1
        self._checksum = state_checksum(self._learner.state)
        count_generation(self._counter, self._returns, self._lengths)
        self._reported[:] = False
        self._metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
        if self._schedule is not None:
            self._metrics.update(self._schedule.metrics())
        self._told.notify_all()

    def _save(self, snapshot: CounterSnapshot) -> None:
        if self._checkpointer is None:
            return
        with self._told:
            progress = snapshot.progress()
            self._checkpointer.save(progress["env_steps"], self._learner.state, progress)


class ESWorker:
    """Run-loop node: plays its members of each generation and tells the fitnesses to its own
    copy of the search (see the module's docstring).

    Args:
      builder: the population-search agent.
      env_factory: builds this worker's envs (one per member and episode).
      learner: client of the ES learner node.
      worker_id: which members it plays (`worker_members`).
      num_workers: how many env workers share the population.
      seed: this worker's envs' seed; a generation's resets use `drawn_seed(seed, generation)`
        (seed + generation would replay all but one of the previous generation's starts).
    """

    def __init__(self, builder: PopulationSearch, env_factory: HostEnvFactory, learner: Any,
                 worker_id: int, num_workers: int, seed: int):
        self._builder = builder
        self._factory = env_factory
        self._learner = learner
        self._worker_id = worker_id
        self._num_workers = num_workers
        self._seed = seed

    def run(self) -> None:
        builder, learner = self._builder, self._learner
        spec = self._factory.spec()
        assert isinstance(spec, EnvSpec), spec  # As ESLearnerNode's.
        networks = builder.make_networks(spec)
        search = builder.make_learner(networks, spec, jax.random.PRNGKey(0))
        training = builder.make_training(networks, spec)
        member_act = builder.make_member_policy(networks)
        act = jax.jit(jax.vmap(lambda flat, obs: member_act(flat, obs[None])[0]))
        members = worker_members(self._worker_id, self._num_workers, search.num_members)
        episodes = builder.config.episodes_per_member
        # A worker without members (more workers than members) only keeps its copy in step.
        envs = (self._factory.make_vector(members.size * episodes, seed=self._seed)
                if members.size else None)
        stop = runtime.stop_event()
        try:
            search.restore(learner.search_state())
            while not stop.is_set():
                generation = search.generation
                if members.size:
                    returns, lengths = play_members(
                        act, search.population()[members], envs, episodes,
                        drawn_seed(self._seed, generation), stop.is_set)
                    if stop.is_set():
                        return
                    if not learner.report(generation, members, returns, lengths,
                                          state_checksum(search.state)):
                        search.restore(learner.search_state())
                        continue
                told = None
                while told is None and not stop.is_set():
                    told = learner.fitness(generation)
                if told is None:
                    continue
                if told.learning_rate_factor is not None:  # The learner's, bit for bit.
                    hparams = require_hparams(builder, training, "the learning-rate schedule")
                    search.restore(hparams.set_learning_rate_factor(
                        search.state, np.float32(told.learning_rate_factor)))
                search.step({"fitness": told.fitness})
        finally:
            if envs is not None:
                envs.close()


def make_es_program(builder: PopulationSearch, env_factory: EnvFactory,
                    config: ExperimentConfig, name: str = "es",
                    checkpoints: Checkpoints | None = None,
                    stop_rule: StopRule | None = None,
                    video_dir: str | None = None) -> runtime.Program:
    """The ES graph: one learner node, `num_actors` env workers, and an evaluator with
    `config.eval_every > 0` (as `program.make_program`'s, which it mirrors, `video_dir` too).

    Returns:
      The program; its "learner" group holds the `ESLearnerNode`.
    """
    program = runtime.Program(name)
    with program.group("learner", resources={"CPU": 1, "accelerator": 1}):
        learner = program.add_node(runtime.CourierNode(
            ESLearnerNode, builder, env_factory, config, checkpoints, stop_rule))
    with program.group("actor", max_restarts=config.max_actor_restarts, resources={"CPU": 1},
                       nice=config.actor_nice):
        for i in range(config.num_actors):
            seed = config.seed * 10_007 + i + 1  # Distinct per worker, reproducible per run.
            program.add_node(runtime.CourierNode(
                ESWorker, builder, env_factory, learner, i, config.num_actors, seed))
    if config.eval_every > 0:
        with program.group("evaluator"):
            program.add_node(runtime.CourierNode(Evaluator, builder, env_factory, learner, config,
                                                 video_dir))
    return program
