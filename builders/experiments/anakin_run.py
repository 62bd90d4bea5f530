"""The anakin platform: `AnakinRun` drives `anakin.Population` for the session.

The session (builders/experiments/session.py) logs, shows progress, handles signals and times
checkpoints as on the other platforms; `AnakinRun` makes the compiled calls (`updates_per_call`
updates of every member each) and asks the stop rule with every member's counters: the
env-step budget (per member: the members step in lockstep), or the mean return over the last
`return_window` episodes at `stop_at_return` for every member (independent seeds: the
population stops once each has solved) or, with PBT, for any member (exploits restart the
windows of the members they replace).

summary.json's `wall_time_s` counts from the process's start (interpreter, imports and
compilation included) to the moment the stop rule fired, plus the time of earlier sessions of
a resumed run; `members` lists each member's result.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from trellis.builders.contract.agent import REPLAY, Builder
from trellis.builders.contract.hparams import LINEAR
from trellis.builders.experiments.anakin import (
    Anakin,
    Population,
    ReplaySettings,
    population_mesh,
    shards_members,
)
from trellis.builders.experiments.checkpointing import Checkpointer, checkpoint_dir
from trellis.builders.experiments.execution import Ending, Report
from trellis.builders.experiments.platforms import PopulationSettings
from trellis.builders.experiments.schedule import NO_HPARAMS, asked_hparams, require_hparams
from trellis.builders.experiments.stop import SIGNAL, StopRule
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


def seconds_since_process_start() -> float | None:
    """How long this process has run (Linux's /proc), or None where that cannot be read."""
    try:
        with open("/proc/self/stat") as f:
            # Field 22 (after the parenthesised name, which may hold spaces): start time in
            # clock ticks since boot.
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        return time.clock_gettime(time.CLOCK_BOOTTIME) - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def make_anakin(builder: Builder, env_factory: EnvFactory, seed: int, return_window: int,
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


def make_population(builder: Builder, env_factory: EnvFactory, seed: int, return_window: int,
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


def restore_member(builder: Builder, env_factory: EnvFactory, config: Any, num_seeds: int,
                   run_dir: str, step: int | None, member: int
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
    checkpointer = Checkpointer(checkpoint_dir(run_dir))
    try:
        step = checkpointer.latest_step() if step is None else step
        state, progress = checkpointer.restore(target, step)
    finally:
        checkpointer.close()
    params = anakin.acting_params(jax.tree.map(lambda x: x[member], state.train))
    return anakin, params, step, progress


def population_stats(snapshots: Sequence[Any], hparams: Sequence[Mapping[str, float]]
                     ) -> tuple[dict[str, Any], dict[str, float]]:
    """(stats, per-member fields) of the members' counters.

    stats are as the learner node reports them, aggregated over members: the mean of their
    mean returns, the min and max over all their windows, episodes summed. The per-member
    fields are `member/<i>/return_mean` and each member's hyper-parameters, for metrics.
    """
    per_member = [s.stats() for s in snapshots]
    means = [s["mean_return"] for s in per_member if s["mean_return"] is not None]
    returns = [r for s in snapshots for r in s.returns]
    lengths = [n for s in snapshots for n in s.lengths]
    stats = {
        "env_steps": snapshots[0].env_steps,
        "learner_steps": snapshots[0].learner_steps,
        "episodes": sum(s.episodes for s in snapshots),
        "mean_return": float(np.mean(means)) if means else None,
        "min_return": float(np.min(returns)) if returns else None,
        "max_return": float(np.max(returns)) if returns else None,
        "returns_in_window": min(s["returns_in_window"] for s in per_member),
        "mean_episode_length": float(np.mean(lengths)) if lengths else None,
        "elapsed_s": snapshots[0].elapsed_s,
        "resumes": snapshots[0].resumes,
    }
    fields: dict[str, float] = {}
    if len(snapshots) > 1:
        for i, (s, h) in enumerate(zip(per_member, hparams, strict=True)):
            if s["mean_return"] is not None:
                fields[f"member/{i}/return_mean"] = s["mean_return"]
            fields.update({f"member/{i}/{name}": value for name, value in h.items()})
    return stats, fields


def _member_hparams(population: Population) -> list[dict[str, float]]:
    values = jax.device_get(population.anakin.hparams.get(population.state.train))
    return [{name: float(v[m]) for name, v in values.items()}
            for m in range(population.num_members)]


class AnakinRun:
    """The session's `Execution` of a population on the anakin platform.

    Each `advance` makes one compiled call (`updates_per_call` updates of every member) and
    reports the members' counters, aggregated (`population_stats`) with per-member fields;
    the stop rule is asked with every member's counters (`StopRule.decide`). Checkpoints
    (orbax) are opened at first use: orbax takes a second or two to import, and a short run
    reaches its target without waiting for it.

    Args:
      builder, env_factory, config, run_dir: as for `session.run_experiment`.
      settings: members, their hyper-parameters, updates per compiled call, PBT.
      stop_rule: the session's rule.
      resume: (step, progress) of the checkpoint to continue from, or None.
      quiet: no lines for PBT's exploits.

    Raises:
      AnakinError: see `make_anakin`.
    """

    def __init__(self, builder: Builder, env_factory: EnvFactory, config: Any, run_dir: str,
                 settings: PopulationSettings, stop_rule: StopRule,
                 resume: tuple[int, Mapping[str, Any]] | None, quiet: bool = False):
        # The session's clock starts with the process: imports and compilation count.
        self._started = time.monotonic() - (seconds_since_process_start() or 0.0)
        self._elapsed_before = float(resume[1].get("elapsed_s", 0.0)) if resume else 0.0
        self._resumes = int(resume[1].get("resumes", 0)) + 1 if resume else 0
        self._config, self._settings, self._rule, self._quiet = config, settings, stop_rule, quiet
        self._population = population = make_population(
            builder, env_factory, config.seed, config.return_window, settings,
            config.total_env_steps)
        self._checkpoints = functools.cache(
            lambda: Checkpointer(checkpoint_dir(run_dir), config.keep_checkpoints))
        if resume:
            state, _ = self._checkpoints().restore(population.state, resume[0])
            population.restore(state)
        self._steps_per_update = population.anakin.unroll_length * population.anakin.num_envs
        self._hparams = _member_hparams(population)
        self._metrics: Mapping[str, Any] = {}
        self._exploits = 0
        self._steady: tuple[float, int] | None = None  # (time, env steps) after compiling.
        self._last: tuple[Report, list[Any], float] | None = None  # And when it came.

    def _snapshots(self) -> list[Any]:
        """Every member's counters (waits for the compiled call: they are on the device)."""
        population = self._population
        elapsed = self._elapsed_before + time.monotonic() - self._started
        learner_steps = int(np.asarray(jax.device_get(population.state.updates))[0])
        return population.snapshots(learner_steps * self._steps_per_update, elapsed,
                                    self._resumes)

    def _report(self, snapshots: list[Any], stopped_by: str | None,
                exploits: Sequence[Mapping[str, Any]] = ()) -> Report:
        stats, fields = population_stats(snapshots, self._hparams)
        if exploits:  # Every round's exploits are in the record after it.
            fields["pbt_exploits"] = list(exploits)
        steady_time, steady_steps = self._steady or (time.monotonic(), snapshots[0].env_steps)
        stats.update(_metrics(self._metrics), env_steps_per_s=_rate(
            snapshots[0].env_steps - steady_steps, time.monotonic() - steady_time,
            self._population.num_members))
        report = Report(stats, fields, stopped_by, record_now=bool(exploits))
        self._last = (report, snapshots, time.monotonic())
        return report

    def advance(self, timeout_s: float) -> Report:
        del timeout_s  # One compiled call: its length is the program's.
        self._metrics, exploits = self._population.step()
        snapshots = self._snapshots()
        if exploits:
            self._exploits += len(exploits)
            self._hparams = _member_hparams(self._population)
            for event in exploits if not self._quiet else ():
                print(describe_exploit(event), flush=True)
        if self._steady is None:  # After the first call, which compiled the program.
            self._steady = (time.monotonic(), snapshots[0].env_steps)
        return self._report(snapshots, self._rule.decide(snapshots), exploits)

    def checkpoint(self) -> None:
        _save(self._checkpoints(), self._population, self._snapshots()[0])

    def stop(self) -> Report:
        return self._report(self._snapshots(), SIGNAL)

    def finish(self) -> Ending:
        assert self._last is not None
        report, snapshots, stopped = self._last
        _save(self._checkpoints(), self._population, snapshots[0])
        self._checkpoints().close()
        config, members = self._config, self._population.num_members
        steady_time, steady_steps = self._steady or (stopped, snapshots[0].env_steps)
        fields = {
            # After the first call (compiled) until the stop, the final checkpoint not
            # included: learning's steady rate, all members.
            "steady_env_steps_per_s": _rate(snapshots[0].env_steps - steady_steps,
                                            stopped - steady_time, members),
            "num_seeds": members,
            "solved_fraction": _solved_fraction(snapshots, config),
            # This session's exploits (None without --pbt); metrics.jsonl lists them.
            "pbt_exploits": self._exploits if self._settings.pbt else None,
            "members": [_member_summary(s, h, config)
                        for s, h in zip(snapshots, self._hparams, strict=True)],
        }
        return Ending(130 if report.stopped_by == SIGNAL else 0, self._started, fields)


def describe_exploit(event: Mapping[str, Any]) -> str:
    """One line for an exploit (`builders.experiments.anakin.exploits`): who copied whom, and the
    hyper-parameters before and after."""
    changes = ", ".join(f"{name} {event['before'][name]:.3g} -> {after:.3g} (donor's "
                        f"{event['donor_hparams'][name]:.3g})"
                        for name, after in event["after"].items()
                        if after != event["before"][name])
    return (f"pbt at {event['env_steps']:,d} env steps: member {event['member']} (return "
            f"{_shown(event['member_return'])}) copies member {event['donor']} (return "
            f"{_shown(event['donor_return'])}); {changes or 'hyper-parameters unchanged'}")


def _shown(value: float | None) -> str:
    return "none" if value is None else f"{value:.1f}"


def _rate(steps: int, seconds: float, members: int) -> float:
    return round(steps * members / seconds, 1) if seconds > 0 else 0.0


def _metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The learner's metrics of the last call, averaged over members."""
    return {name: float(np.mean(jax.device_get(v))) for name, v in metrics.items()}


def _solved(snapshot: Any, config: Any) -> bool | None:
    if config.stop_at_return is None:
        return None
    window = snapshot.returns[-config.return_window:]
    return (len(window) == config.return_window
            and float(np.mean(window)) >= config.stop_at_return)


def _solved_fraction(snapshots: Sequence[Any], config: Any) -> float | None:
    if config.stop_at_return is None:
        return None
    return sum(bool(_solved(s, config)) for s in snapshots) / len(snapshots)


def _member_summary(snapshot: Any, hparams: Mapping[str, float], config: Any) -> dict[str, Any]:
    stats = snapshot.stats()
    return {"mean_return": stats["mean_return"], "episodes": stats["episodes"],
            "solved": _solved(snapshot, config), "hparams": dict(hparams)}


def _save(checkpoints: Checkpointer, population: Population, snapshot: Any) -> None:
    checkpoints.save(snapshot.env_steps, population.state, snapshot.progress())

