"""The anakin platform: `population_run` drives `anakin.Population` for the session.

The session (builders/experiments/session.py) logs, shows progress, handles signals and times
checkpoints as on the other platforms; the in-process skeleton (`in_process.InProcessRun`)
makes the compiled calls of a `PopulationProgram` (`updates_per_call` updates of every member
each) and asks the stop rule with every member's counters: the env-step budget (per member:
the members step in lockstep), or the mean return over the last `return_window` episodes at
`stop_at_return` for every member (independent seeds: the population stops once each has
solved) or, with PBT, for any member (exploits restart the windows of the members they
replace).

summary.json's `wall_time_s` counts from the process's start (interpreter, imports and
compilation included) to the moment the stop rule fired, plus the time of earlier sessions of
a resumed run; `members` lists each member's result.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from trellis.builders.contract.agent import REPLAY, Builder
from trellis.builders.contract.config import ExperimentConfig
from trellis.builders.contract.hparams import LINEAR
from trellis.builders.experiments.anakin import (
    Anakin,
    Population,
    ReplaySettings,
    population_mesh,
    shards_members,
)
from trellis.builders.experiments.counter import CounterSnapshot
from trellis.builders.experiments.in_process import Called, InProcessRun
from trellis.builders.experiments.platforms import ANAKIN, PopulationSettings
from trellis.builders.experiments.restore import (
    PolicyMember,
    Wanted,
    policy_member,
    restore_state,
)
from trellis.builders.experiments.schedule import (
    LEARNING_RATE,
    NO_HPARAMS,
    asked_hparams,
    require_hparams,
)
from trellis.builders.experiments.stop import StopRule
from trellis.builders.experiments.xla_flags import xla_flags_unless_set
from trellis.envs import EnvFactory
from trellis.envs.contract import Players, is_jax
from trellis.envs.jax_multi_agent import TeamEnv


class AnakinError(ValueError):
    """The run cannot go on the anakin platform (agent, env or hyper-parameters): one line."""


def use_cpu_cores() -> contextlib.AbstractContextManager[None]:
    """Inside, JAX's CPU backend, if it starts there, makes one device of each usable core,
    each running its programs on one thread, unless XLA_FLAGS already says otherwise. XLA_FLAGS
    is restored on leaving: the backend keeps its devices, and processes started afterwards do
    not inherit the flags.

    XLA's default on a CPU is one device that splits each operation over a thread pool: for
    the anakin program's many small operations the threads' synchronisation costs more than
    they gain. One device per core runs whole members side by side instead
    (`population_mesh`; docs/anakin.md, figures in docs/benchmarks.md). No effect on GPUs and
    TPUs, where the CPU devices hold nothing.
    """
    return xla_flags_unless_set({
        "xla_force_host_platform_device_count": str(len(os.sched_getaffinity(0))),
        "xla_cpu_multi_thread_eigen": "false"})


def make_anakin(builder: Builder[Any], env_factory: EnvFactory, seed: int, return_window: int,
                hparam_names: Sequence[str] = (), num_members: int = 1,
                total_env_steps: int | None = None) -> tuple[Anakin, Any]:
    """The agent's anakin functions for `num_members` members and the device mesh they run on;
    with `total_env_steps`, a member's budget, the agent's `learning_rate_schedule` over it.

    Raises:
      AnakinError: an env that is not written in JAX, a recurrent policy, an agent whose
        learner does not learn from unrolls directly (replay agents), or unknown
        hyper-parameter names.
    """
    if not is_jax(env_factory):
        raise AnakinError(f"--platform=anakin needs an env written in JAX, e.g. "
                          f"gymnax:CartPole-v1; {env_factory.env_id!r} is a Gymnasium id "
                          "(use --platform=local_mp for it)")
    spec = env_factory.spec()
    config = builder.config
    networks = builder.make_networks(spec)
    training = builder.make_training(networks, spec)
    root = jax.random.key(seed)
    asked = asked_hparams(builder, member_hparams=bool(hparam_names))
    hparams = require_hparams(builder, training, asked) if asked else (
        training.hparams or NO_HPARAMS)
    known = sorted(hparams.get(jax.eval_shape(training.init, root)))
    unknown = sorted(set(hparam_names) - set(known))
    if unknown:
        raise AnakinError(f"--member_hparams: {', '.join(unknown)} is not a hyper-parameter "
                          f"of this agent (it has: {', '.join(known)})")
    mesh = population_mesh(num_members, jax.local_devices())
    # Split whole, each member's update runs on one device (no mesh inside); otherwise the
    # update constrains its minibatches over the whole mesh.
    update = training.make_update(None if shards_members(num_members, mesh) else mesh)
    env = env_factory.make()
    if env_factory.players is Players.MULTI_AGENT:  # Stepped as one env: the team's reward.
        env = TeamEnv(env)
    replay = (ReplaySettings.of(config) if builder.capabilities.learns_from == REPLAY
              else None)
    anakin = Anakin(env=env, policy=builder.make_policy(networks),
                    init=training.init, update=update, initial_state={},
                    num_envs=config.batch_size, unroll_length=config.unroll_length,
                    return_window=return_window, acting_params=training.acting_params,
                    replay=replay,
                    decay_env_steps=(total_env_steps if config.learning_rate_schedule == LINEAR
                                     else None),
                    hparams=hparams)
    return anakin, mesh


def _member_keys(seed: int, num_seeds: int) -> jax.Array:
    return jax.random.split(jax.random.fold_in(jax.random.key(seed), 1), num_seeds)


def make_population(builder: Builder[Any], env_factory: EnvFactory, seed: int, return_window: int,
                    settings: PopulationSettings,
                    total_env_steps: int | None = None) -> Population:
    """The agent's anakin program for `settings.num_seeds` members, compiled here
    (`total_env_steps`: as for `make_anakin`).

    Raises:
      AnakinError: see `make_anakin`.
    """
    names = [*settings.hparams, *(settings.pbt.search if settings.pbt else ())]
    anakin, mesh = make_anakin(builder, env_factory, seed, return_window, names,
                               settings.num_seeds, total_env_steps)
    return Population(anakin, mesh, _member_keys(seed, settings.num_seeds), settings.hparams,
                      settings.updates_per_call, settings.pbt)


def restore_member(builder: Builder[Any], env_factory: EnvFactory, config: ExperimentConfig,
                   num_seeds: int, run_dir: str, step: int | None, member: int
                   ) -> tuple[Anakin, Any, int, dict[str, Any]]:
    """One member's params from an anakin run's checkpoint (for evaluate.py).

    Returns:
      (the run's anakin functions, the member's params, the checkpoint's step, its progress).

    Raises:
      builders.experiments.checkpointing.CheckpointError: no such checkpoint, or unreadable.
      AnakinError: see `make_anakin`; or no such member.
    """
    if not 0 <= member < num_seeds:
        raise AnakinError(f"--member must be in [0, {num_seeds}) for this run, got {member}")
    anakin, _ = make_anakin(builder, env_factory, config.seed, config.return_window)
    target = jax.jit(jax.vmap(anakin.init_member))(_member_keys(config.seed, num_seeds), {})
    state, step, progress = restore_state(run_dir, target, step)
    params = anakin.acting_params(jax.tree.map(lambda x: x[member], state.train))
    return anakin, params, step, progress


def restore_gradient_member(builder: Builder[Any], env_factory: EnvFactory,
                            config: ExperimentConfig, wanted: Wanted) -> PolicyMember:
    """A gradient agent's member (`session.EXECUTIONS`' restore): one member of an anakin
    run's population, playing in the run's JAX env, or the learner's params of a run on the
    host platforms, playing in the factory's envs.

    Raises:
      builders.experiments.restore.RestoreError: the run has no checkpoints.
      builders.experiments.checkpointing.CheckpointError: no such checkpoint, or unreadable.
      AnakinError: see `restore_member`.
    """
    spec = env_factory.spec()
    networks = builder.make_networks(spec)
    if wanted.platform != ANAKIN:
        # The learner's checkpointed state is its Training's; a learner itself is not made:
        # one that learns from a replay node (R2D2) needs that node's client.
        training = builder.make_training(networks, spec)
        target = jax.jit(training.init)(jax.random.PRNGKey(0))
        state, step, progress = restore_state(wanted.run_dir, target, wanted.step)
        return policy_member(builder, env_factory, networks, training.acting_params(state),
                             step, progress)
    anakin, params, step, progress = restore_member(builder, env_factory, config,
                                                    wanted.num_seeds, wanted.run_dir,
                                                    wanted.step, wanted.member)
    return policy_member(builder, env_factory, networks, params, step, progress, anakin.env,
                         {"member": wanted.member})


def _member_hparams(population: Population) -> list[dict[str, float]]:
    values = jax.device_get(population.anakin.hparams.get(population.state.train))
    return [{name: float(v[m]) for name, v in values.items()}
            for m in range(population.num_members)]


class PopulationProgram:
    """A population on the anakin platform, as `in_process.InProcessRun` drives it.

    Each call is `updates_per_call` updates of every member; a report's fields are, for a
    population, each member's mean return and hyper-parameters, and its learning rate in
    effect (its own times the schedule's factor, which the program sets per member).

    Args:
      population: the members, compiled (`make_population`).
      settings: members, their hyper-parameters, updates per compiled call, PBT.
      config: the experiment's settings (the return target a member solves at).
      learning_rate: the agent's configured learning rate (a member's, where its training
        state holds no rate of its own), or None for an agent without one.
      quiet: no lines for PBT's exploits.
    """

    def __init__(self, population: Population, settings: PopulationSettings,
                 config: ExperimentConfig, learning_rate: float | None, quiet: bool = False):
        self._population, self._settings, self._quiet = population, settings, quiet
        self._config = config
        self._learning_rate = learning_rate
        self._steps_per_update = population.anakin.unroll_length * population.anakin.num_envs
        self._hparams = _member_hparams(population)
        self._factors = [1.0] * population.num_members  # The schedule's, of the last call.
        self._exploits = 0

    @property
    def state(self) -> Any:
        return self._population.state

    @property
    def num_members(self) -> int:
        return self._population.num_members

    def restore(self, state: Any, progress: Mapping[str, Any]) -> None:
        del progress  # The counters are the state's own (on the device).
        self._population.restore(state)
        self._hparams = _member_hparams(self._population)

    def call(self) -> Called:
        metrics, exploits = self._population.step()
        if exploits:
            self._exploits += len(exploits)
            self._hparams = _member_hparams(self._population)
            for event in exploits if not self._quiet else ():
                print(describe_exploit(event), flush=True)
        host = jax.device_get(metrics)
        if "learning_rate_factor" in host:
            self._factors = [float(f) for f in np.asarray(host["learning_rate_factor"])]
        averaged = {name: float(np.mean(v)) for name, v in host.items()}
        rates = self._learning_rates()
        if rates and len(set(rates)) == 1:  # Else each member's: `fields`.
            averaged[LEARNING_RATE] = rates[0]
        # Every round's exploits are in the record after it.
        return Called(averaged, {"pbt_exploits": exploits} if exploits else {},
                      record_now=bool(exploits))

    def _learning_rates(self) -> list[float]:
        """Each member's learning rate in effect; none for an agent without one."""
        bases = [h.get(LEARNING_RATE, self._learning_rate) for h in self._hparams]
        return [base * factor for base, factor in zip(bases, self._factors, strict=True)
                if base is not None]

    def snapshots(self, elapsed_s: float, resumes: int) -> list[CounterSnapshot]:
        """Every member's counters (waits for the compiled call: they are on the device)."""
        population = self._population
        learner_steps = int(np.asarray(jax.device_get(population.state.updates))[0])
        return population.snapshots(learner_steps * self._steps_per_update, elapsed_s, resumes)

    def fields(self, snapshots: Sequence[CounterSnapshot]) -> dict[str, Any]:
        """A population's `member/<i>/return_mean`, each member's hyper-parameters, and, where
        the members' differ, its learning rate in effect (else `call` reports the one rate);
        one member's: none."""
        if len(snapshots) == 1:
            return {}
        fields: dict[str, Any] = {}
        rates = self._learning_rates()
        for i, (s, h) in enumerate(zip(snapshots, self._hparams, strict=True)):
            mean = s.stats()["mean_return"]
            if mean is not None:
                fields[f"member/{i}/return_mean"] = mean
            fields.update({f"member/{i}/{name}": value for name, value in h.items()
                           if name != LEARNING_RATE})  # Configured: in effect, below.
            if len(set(rates)) > 1:
                fields[f"member/{i}/{LEARNING_RATE}"] = rates[i]
        return fields

    def summary(self, snapshots: Sequence[CounterSnapshot]) -> dict[str, Any]:
        solved = [_solved(s, self._config) for s in snapshots]
        return {
            "num_seeds": self.num_members,
            "solved_fraction": (None if self._config.stop_at_return is None
                                else sum(bool(x) for x in solved) / len(solved)),
            # This session's exploits (None without --pbt); metrics.jsonl lists them.
            "pbt_exploits": self._exploits if self._settings.pbt else None,
            "members": [{"mean_return": s.stats()["mean_return"], "episodes": s.episodes,
                         "solved": x, "hparams": dict(h)}
                        for s, x, h in zip(snapshots, solved, self._hparams, strict=True)],
        }


def population_run(builder: Builder[Any], env_factory: EnvFactory, config: ExperimentConfig,
                   run_dir: str, settings: PopulationSettings, stop_rule: StopRule,
                   resume: tuple[int, Mapping[str, Any]] | None,
                   quiet: bool = False) -> InProcessRun:
    """The session's `Execution` of a population on the anakin platform.

    Args:
      builder, env_factory, config, run_dir: as for `session.run_experiment`.
      settings: members, their hyper-parameters, updates per compiled call, PBT.
      stop_rule: the session's rule.
      resume: (step, progress) of the checkpoint to continue from, or None.
      quiet: no lines for PBT's exploits.

    Raises:
      AnakinError: see `make_anakin`.
    """
    population = make_population(builder, env_factory, config.seed, config.return_window,
                                 settings, config.total_env_steps)
    program = PopulationProgram(population, settings, config, builder.config.learning_rate,
                                quiet)
    return InProcessRun(program, config, run_dir, stop_rule, resume)


def describe_exploit(event: Mapping[str, Any]) -> str:
    """One line for an exploit (`builders.experiments.device_pbt.exploits`): who copied whom,
    and the hyper-parameters before and after."""
    changes = ", ".join(f"{name} {event['before'][name]:.3g} -> {after:.3g} (donor's "
                        f"{event['donor_hparams'][name]:.3g})"
                        for name, after in event["after"].items()
                        if after != event["before"][name])
    return (f"pbt at {event['env_steps']:,d} env steps: member {event['member']} (return "
            f"{_shown(event['member_return'])}) copies member {event['donor']} (return "
            f"{_shown(event['donor_return'])}); {changes or 'hyper-parameters unchanged'}")


def _shown(value: float | None) -> str:
    return "none" if value is None else f"{value:.1f}"


def _solved(snapshot: CounterSnapshot, config: ExperimentConfig) -> bool | None:
    if config.stop_at_return is None:
        return None
    mean = snapshot.window_mean(config.return_window)
    return mean is not None and mean >= config.stop_at_return
