"""Evolution strategies' executions: one generation per jitted call on anakin, and the program
graph of es_node.py on the host platforms.

On anakin (`GenerationProgram`, driven by `in_process.InProcessRun`) a generation is one
compiled call: ask (the members as flat params, drawn from the search state's common random
numbers) -> every member plays whole episodes of the JAX env, vmapped -> tell (the agent's pure
update on the fitnesses). The host only counts the episodes (`counter.ReturnWindow`, as the
learner node's counter does), asks the stop rule, and writes checkpoints of the search state,
which has the same structure as the host learner's, so `launch/evaluate.py` and `--resume`
treat both alike.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from trellis.builders.contract.config import ExperimentConfig
from trellis.builders.contract.population import MemberPolicy, PopulationSearch, Search
from trellis.builders.experiments.anakin_run import AnakinError
from trellis.builders.experiments.counter import CounterSnapshot, ReturnWindow
from trellis.builders.experiments.es_node import make_es_program
from trellis.builders.experiments.execution import Execution
from trellis.builders.experiments.in_process import Called, InProcessRun
from trellis.builders.experiments.platforms import Platform, PopulationSettings
from trellis.builders.experiments.program_run import ProgramRun
from trellis.builders.experiments.schedule import LearningRateSchedule
from trellis.builders.experiments.stop import StopRule
from trellis.envs import EnvFactory, JaxEnvFactory
from trellis.envs.contract import is_jax
from trellis.envs.specs import EnvSpec

# play_population's loop state: (env states, timesteps, returns, lengths, running, key), the
# first two as the env's own pytrees.
_Carry = tuple[Any, Any, jax.Array, jax.Array, jax.Array, jax.Array]


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

    def body(carry: _Carry) -> _Carry:
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
    spec = env_factory.spec()
    # `session.check_supported` runs population searches on single-agent envs only.
    assert isinstance(spec, EnvSpec), spec
    networks = builder.make_networks(spec)
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


class GenerationProgram:
    """Evolution strategies on the anakin platform, as `in_process.InProcessRun` drives it:
    each call is one generation (one compiled call: `--updates_per_call` other than 1 is
    refused). A population of populations is not what ES means by a population:
    `--num_seeds`, `--member_hparams` and `--pbt` are refused.

    Args:
      builder, env_factory, config: as for `session.run_experiment`.
      settings: anakin's settings (only the defaults are accepted).

    Raises:
      AnakinError: an env that is not written in JAX, or population settings of anakin.
    """

    num_members = 1  # One search: its members are one population's.

    def __init__(self, builder: PopulationSearch, env_factory: EnvFactory,
                 config: ExperimentConfig, settings: PopulationSettings):
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
        generation, search = make_generation(builder, env_factory)
        spec = env_factory.spec()
        assert isinstance(spec, EnvSpec), spec  # As make_generation's.
        self._schedule = LearningRateSchedule.of(
            builder, builder.make_training(builder.make_networks(spec), spec),
            config.total_env_steps)
        self._state = jax.jit(search.init)(jax.random.PRNGKey(config.seed))
        self._generation = jax.jit(generation).lower(self._state).compile()
        self._episodes = ReturnWindow(config.return_window)
        self._env_steps = self._generations = 0

    @property
    def state(self) -> Any:
        return self._state

    def restore(self, state: Any, progress: Mapping[str, Any]) -> None:
        self._state = state
        self._episodes = ReturnWindow(self._episodes.size, progress)
        self._env_steps = int(progress["env_steps"])
        self._generations = int(progress["learner_steps"])

    def call(self) -> Called:
        schedule: dict[str, float] = {}
        if self._schedule is not None:
            self._state = self._schedule.apply(self._state, self._env_steps)
            schedule = self._schedule.metrics()
        self._state, returns, lengths, metrics = self._generation(self._state)
        returns, lengths, metrics = jax.device_get((returns, lengths, metrics))
        self._episodes.add(returns.ravel().tolist(), lengths.ravel().tolist())
        self._env_steps += int(lengths.sum())
        self._generations += 1
        return Called({**{name: float(value) for name, value in metrics.items()}, **schedule,
                       "generation": self._generations})

    def snapshots(self, elapsed_s: float, resumes: int) -> list[CounterSnapshot]:
        episodes = self._episodes
        return [CounterSnapshot(self._env_steps, self._generations, episodes.episodes,
                                episodes.returns, episodes.lengths, elapsed_s, resumes)]

    def fields(self, snapshots: Sequence[CounterSnapshot]) -> dict[str, Any]:
        return {}

    def summary(self, snapshots: Sequence[CounterSnapshot]) -> dict[str, Any]:
        return {"generations": snapshots[0].learner_steps}


def execution(builder: PopulationSearch, env_factory: EnvFactory, config: ExperimentConfig,
              run_dir: str, settings: Platform, resume: tuple[int, Mapping[str, Any]] | None,
              quiet: bool = False) -> Execution:
    """ES on `settings`' platform: a `GenerationProgram` on anakin, else the program graph of
    `es_node.make_es_program` (env workers send fitnesses, the learner node tells them).
    Nothing to be quiet about: `quiet` is the session's table's common argument."""
    del quiet
    rule = StopRule.of(config)
    if isinstance(settings, PopulationSettings):
        return InProcessRun(GenerationProgram(builder, env_factory, config, settings), config,
                            run_dir, rule, resume)
    return ProgramRun(builder, env_factory, config, run_dir, settings, rule,
                      None if resume is None else resume[0], make=make_es_program)

