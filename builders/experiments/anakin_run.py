"""One anakin run: the host loop around `builders.anakin.Population`, with its run directory.

The host calls the compiled step (`updates_per_call` updates of every member) and between
calls logs (metrics.jsonl and TensorBoard every `log_every_s`), shows progress, checkpoints
(orbax, every `checkpoint_every_s` and at stop) and checks the stop rule: the env-step budget
(per member: the members step in lockstep) or every member's mean return over its last
`return_window` episodes at `stop_at_return` (all members, so a population stops once each
member has solved). Ctrl-C and SIGTERM stop it with a checkpoint and a summary, as on the
other platforms.

summary.json's `wall_time_s` counts from the process's start (interpreter, imports and
compilation included) to the moment the stop rule fired, plus the time of earlier sessions of
a resumed run; `members` lists each member's result.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import signal
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from trellis.agents.common import get_hparams
from trellis.builders.experiments.anakin import Anakin, Population, population_mesh, shards_members
from trellis.builders.experiments.checkpointing import Checkpointer, checkpoint_dir
from trellis.builders.experiments.curves import finish_run_dir
from trellis.builders.experiments.pbt import PopulationPBT
from trellis.builders.experiments.progress import Progress
from trellis.builders.experiments.rundir import RunWriter
from trellis.builders.experiments.stop import StopRule

ANAKIN = "anakin"


class AnakinError(ValueError):
    """The run cannot go on the anakin platform (agent, env or hyper-parameters): one line."""


@dataclasses.dataclass(frozen=True)
class PopulationSettings:
    """What the anakin platform adds to a run's settings.

    Attributes:
      num_seeds: M, members trained in one program.
      hparams: {name: M values}, the members' starting hyper-parameters (others: the config's).
      updates_per_call: updates of every member per compiled call.
      pbt: population-based training inside the program (`--pbt`), or None.
    """

    num_seeds: int = 1
    hparams: Mapping[str, Sequence[float]] = dataclasses.field(default_factory=dict)
    updates_per_call: int = 32
    pbt: PopulationPBT | None = None


@contextlib.contextmanager
def use_cpu_cores() -> Iterator[None]:
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
    previous = os.environ.get("XLA_FLAGS")
    flags = previous or ""
    if "xla_force_host_platform_device_count" not in flags:
        flags += f" --xla_force_host_platform_device_count={len(os.sched_getaffinity(0))}"
    if "xla_cpu_multi_thread_eigen" not in flags:
        flags += " --xla_cpu_multi_thread_eigen=false"
    os.environ["XLA_FLAGS"] = flags.strip()
    try:
        yield
    finally:
        if previous is None:
            del os.environ["XLA_FLAGS"]
        else:
            os.environ["XLA_FLAGS"] = previous


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


def make_anakin(builder: Any, env_factory: Any, seed: int, return_window: int,
                hparam_names: Sequence[str] = (), num_members: int = 1) -> tuple[Anakin, Any]:
    """The agent's anakin functions for `num_members` members and the device mesh they run on.

    Raises:
      AnakinError: an env that is not written in JAX, a recurrent policy, an agent whose
        learner does not learn from unrolls directly (replay agents), or unknown
        hyper-parameter names.
    """
    if not getattr(env_factory, "jax_native", False):
        raise AnakinError(f"--platform=anakin needs an env written in JAX, e.g. "
                          f"gymnax:CartPole-v1; {env_factory.env_id!r} is a Gymnasium id "
                          "(use --platform=local_mp for it)")
    capabilities = builder.capabilities
    if not capabilities.anakin:
        raise AnakinError(f"--platform=anakin runs agents whose learning is pure functions of "
                          f"unrolls (impala, ppo); {type(builder).__name__} learns from "
                          f"{capabilities.learns_from} on the host (use --platform=local_mp)")
    if capabilities.recurrent:
        raise AnakinError("--platform=anakin runs feed-forward policies only; this agent's "
                          "policy is recurrent (use --platform=local_mp for it)")
    spec = env_factory.spec()
    config = builder.config
    networks = builder.make_networks(spec)
    training = builder.make_training(networks, spec)
    root = jax.random.key(seed)
    known = sorted(get_hparams(jax.eval_shape(training.init, root)))
    unknown = sorted(set(hparam_names) - set(known))
    if unknown:
        raise AnakinError(f"--member_hparams: {', '.join(unknown)} is not a hyper-parameter "
                          f"of this agent (it has: {', '.join(known)})")
    mesh = population_mesh(num_members, jax.local_devices())
    # Split whole, each member's update runs on one device (no mesh inside); otherwise the
    # update constrains its minibatches over the whole mesh.
    update = training.make_update(None if shards_members(num_members, mesh) else mesh)
    anakin = Anakin(env=env_factory.make(), policy=builder.make_policy(networks),
                    init=training.init, update=update, initial_state={},
                    num_envs=config.batch_size, unroll_length=config.unroll_length,
                    return_window=return_window)
    return anakin, mesh


def _member_keys(seed: int, num_seeds: int) -> jax.Array:
    return jax.random.split(jax.random.fold_in(jax.random.key(seed), 1), num_seeds)


def make_population(builder: Any, env_factory: Any, seed: int, return_window: int,
                    settings: PopulationSettings) -> Population:
    """The agent's anakin program for `settings.num_seeds` members, compiled here.

    Raises:
      AnakinError: see `make_anakin`.
    """
    names = [*settings.hparams, *(settings.pbt.search if settings.pbt else ())]
    anakin, mesh = make_anakin(builder, env_factory, seed, return_window, names,
                               settings.num_seeds)
    return Population(anakin, mesh, _member_keys(seed, settings.num_seeds), settings.hparams,
                      settings.updates_per_call, settings.pbt)


def restore_member(builder: Any, env_factory: Any, config: Any, num_seeds: int, run_dir: str,
                   step: int | None, member: int) -> tuple[Anakin, Any, int, dict[str, Any]]:
    """One member's params from an anakin run's checkpoint (for evaluate.py).

    Returns:
      (the run's anakin functions, the member's params, the checkpoint's step, its progress).

    Raises:
      builders.checkpointing.CheckpointError: no such checkpoint, or unreadable.
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
    return anakin, jax.tree.map(lambda x: x[member], state.train.params), step, progress


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
    values = jax.device_get(get_hparams(population.state.train))
    return [{name: float(v[m]) for name, v in values.items()}
            for m in range(population.num_members)]


def run_anakin(builder: Any, env_factory: Any, config: Any, run_dir: str,
               settings: PopulationSettings, *, quiet: bool = False,
               resume: tuple[int, dict[str, Any]] | None = None,
               options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Trains on the anakin platform until `config` says stop; returns the summary.

    Args:
      builder, env_factory, config, run_dir: as for `builders.experiment.run_experiment`
        (which writes config.json and calls this for --platform=anakin).
      settings: members, their hyper-parameters, updates per compiled call.
      quiet: no progress output.
      resume: (step, progress) of the checkpoint to continue from
        (`builders.checkpointing.latest_checkpoint`).
      options: the command line's options (for the summary's agent name).

    Raises:
      AnakinError: see `make_population`.
    """
    process_age = seconds_since_process_start()
    session_start = time.monotonic() - (process_age or 0.0)
    resume_steps = resume[1]["env_steps"] if resume else None
    elapsed_before = float(resume[1].get("elapsed_s", 0.0)) if resume else 0.0
    resumes = int(resume[1].get("resumes", 0)) + 1 if resume else 0
    population = make_population(builder, env_factory, config.seed, config.return_window,
                                 settings)
    # orbax and tensorboardX take a second or two to import: they are opened at their first
    # use, so a short run reaches its target without waiting for them.
    checkpoints = functools.cache(
        lambda: Checkpointer(checkpoint_dir(run_dir), config.keep_checkpoints))
    writer = functools.cache(lambda: RunWriter(run_dir, resume_steps))
    if resume:
        state, _ = checkpoints().restore(population.state, resume[0])
        population.restore(state)
    steps_per_update = population.anakin.unroll_length * population.anakin.num_envs
    hparams = _member_hparams(population)
    rule = StopRule(config.total_env_steps, config.stop_at_return, config.return_window)
    progress_bar = Progress(config.total_env_steps, quiet=quiet, initial=resume_steps or 0)
    # Ctrl-C and SIGTERM only set a flag that the loop reads between calls: an exception
    # raised at an arbitrary point could leave JAX or orbax holding a lock that the final
    # checkpoint then waits on. A second Ctrl-C interrupts at once.
    signalled = threading.Event()

    def on_signal(signum, frame):
        signalled.set()
        signal.signal(signal.SIGINT, signal.default_int_handler)

    in_main = threading.current_thread() is threading.main_thread()
    previous = ({s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
                if in_main else {})

    def snapshots():
        elapsed = elapsed_before + time.monotonic() - session_start
        learner_steps = int(np.asarray(jax.device_get(population.state.train.step))[0])
        return population.snapshots(learner_steps * steps_per_update, elapsed, resumes)

    stopped_by, exit_code, stop_time = None, 0, None
    steady_start = steady_steps = None
    last_log = last_checkpoint = time.monotonic()
    metrics: dict[str, Any] = {}
    num_exploits = 0
    try:
        while stopped_by is None:
            metrics, exploits = population.step()
            member_snapshots = snapshots()  # Waits for the call: the counters are on the device.
            if exploits:
                num_exploits += len(exploits)
                hparams = _member_hparams(population)
                for event in exploits if not quiet else ():
                    print(describe_exploit(event), flush=True)
            now = time.monotonic()
            if steady_start is None:  # After the first call, which compiled the program.
                steady_start, steady_steps = now, member_snapshots[0].env_steps
            decisions = [rule(s) for s in member_snapshots]
            if any(d == "budget" for d in decisions):
                stopped_by = "budget"
            elif all(d == "return_target" for d in decisions):
                stopped_by = "return_target"
            elif signalled.is_set():
                stopped_by, exit_code = "signal", 130
            if stopped_by is not None:
                stop_time = now
            if stopped_by is not None or now - last_log >= config.log_every_s or exploits:
                stats, fields = population_stats(member_snapshots, hparams)
                if exploits:  # Every round's exploits are in the record after it.
                    fields["pbt_exploits"] = exploits
                stats.update(_metrics(metrics), env_steps_per_s=_rate(
                    member_snapshots[0].env_steps - steady_steps, now - steady_start,
                    population.num_members))
                progress_bar.update(stats)
                writer().log(stats, fields)
                last_log = now
            if now - last_checkpoint >= config.checkpoint_every_s:
                _save(checkpoints(), population, member_snapshots[0])
                last_checkpoint = now
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        progress_bar.close()
    member_snapshots = snapshots()
    _save(checkpoints(), population, member_snapshots[0])
    checkpoints().close()
    stats, fields = population_stats(member_snapshots, hparams)
    stats.update(_metrics(metrics))
    writer().log(stats, fields)
    writer().close()

    session_time = stop_time - session_start
    env_steps = member_snapshots[0].env_steps
    new_steps = env_steps - (resume_steps or 0)
    steady_time = stop_time - steady_start if steady_start is not None else 0.0
    summary = {
        "agent": (options or {}).get("agent", type(builder).__name__),
        "platform": ANAKIN,
        "env": env_factory.env_id,
        "stopped_by": stopped_by,
        "exit_code": exit_code,
        "env_steps": env_steps,  # Per member.
        "wall_time_s": round(elapsed_before + session_time, 3),
        "session_wall_time_s": round(session_time, 3),
        # All members' env steps per second of the session, compilation included...
        "env_steps_per_s": _rate(new_steps, session_time, population.num_members),
        # ... and after the first call (compiled): learning's steady rate.
        "steady_env_steps_per_s": _rate(env_steps - (steady_steps or env_steps), steady_time,
                                        population.num_members),
        "mean_return": stats["mean_return"],  # Mean over members of their window means.
        "return_window": config.return_window,
        "episodes": stats["episodes"],
        "learner_steps": stats["learner_steps"],
        "resumed_from_env_steps": resume_steps,
        "stop_at_return": config.stop_at_return,
        "total_env_steps": config.total_env_steps,
        "num_seeds": population.num_members,
        "solved_fraction": _solved_fraction(member_snapshots, config),
        # This session's exploits (None without --pbt); metrics.jsonl lists them.
        "pbt_exploits": num_exploits if settings.pbt else None,
        "members": [_member_summary(s, h, config) for s, h in zip(member_snapshots, hparams,
                                                                  strict=True)],
    }
    return finish_run_dir(run_dir, summary)


def describe_exploit(event: Mapping[str, Any]) -> str:
    """One line for an exploit (`builders.anakin.exploits`): who copied whom, and the
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

