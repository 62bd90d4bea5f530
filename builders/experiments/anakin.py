"""The anakin platform: act and learn in one jitted program, for envs written in JAX.

Podracer's "Anakin" architecture (Hessel et al., 2021): the envs (gymnax, envs/jax_env.py)
are vmapped over the batch and scanned over the unroll inside the same compiled program as
the agent's policy and update, so no env step waits on Python. The agent's pieces are reused
unchanged: its networks and policy (`builder.make_policy`), its pure `update(state, batch)`
and `init(key)` (`Builder.make_training`, which its `DataParallelLearner` also jits), on the
same time-major unrolls {field: [T + 1, B, ...]} that the inference server records
(`inference.step_specs`): the last step of an unroll is the first of the next, and one update
takes T * B env steps.

A population (`num_seeds` = M members) is the member step vmapped over M: each member has its
own params, optimizer state, envs, RNG and hyper-parameters (set through the agent's
`Training.hparams`: the learning rate and the loss weights the update reads from its state), in
one program. The env batch axis is
sharded over the local devices, as the learner's batch is; everything else is replicated.
With PBT (`PopulationPBT`), every K updates the bottom members copy top members' training
states by a gather over the member axis and perturb their hyper-parameters, in the same
program (`device_pbt`).

The host only calls the compiled step (`updates_per_call` updates of every member) and, in
between, logs, shows progress, checkpoints and checks the stop rule on each member's return
window (kept on the device: `device_episodes`), with the same statistics as the Gymnasium
path. Greedy episodes on JAX envs, for evaluation, are `device_evaluation`'s.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from trellis.agents.common.replay import DeviceReplay
from trellis.builders.contract.agent import Policy, State, Tree, Update
from trellis.builders.contract.hparams import HyperParams, learning_rate_factor
from trellis.builders.experiments.counter import CounterSnapshot
from trellis.builders.experiments.device_episodes import Episodes, track_episodes, window_in_order
from trellis.builders.experiments.device_pbt import PBTEvent, exploits, pbt_round
from trellis.builders.experiments.pbt import PopulationPBT
from trellis.builders.experiments.schedule import NO_HPARAMS

# --- One member's act-and-learn step ----------------------------------------------------


@flax.struct.dataclass
class MemberState:
    """Everything one population member carries from call to call.

    Attributes:
      train: the agent's training state (params, optimizer state, key, step, hparams).
      env: the envs' states, [B].
      pending: the step recorded at the envs' current observations, whose action is chosen
        but not applied yet; it becomes the first step of the next unroll. {field: [B, ...]}.
      policy_state: the policy's state per env ({} for feed-forward agents).
      episodes: the return window.
      key: for acting and env steps.
      updates: the member's updates so far, each T * B env steps (an off-policy agent's
        training state counts its SGD steps instead).
      replay: the member's transitions on the device (off-policy agents; else None).
    """

    train: Any
    env: Any
    pending: dict[str, jax.Array]
    policy_state: State
    episodes: Episodes
    key: jax.Array
    updates: jax.Array
    replay: DeviceReplay | None = None


# What an unroll's scan carries from env step to env step: (envs' states, pending step,
# policy state, episodes, key).
_Carry = tuple[Any, dict[str, Tree], State, Episodes, jax.Array]


@dataclasses.dataclass(frozen=True)
class ReplaySettings:
    """How an off-policy agent learns on anakin (its `ReplayConfig`): each update's unrolls
    become n-step transitions in a `DeviceReplay` of `capacity`; once it holds `min_size`,
    `updates_per_step` minibatches of `sample_batch_size` are sampled and learned from."""

    n_step: int
    discount: float
    capacity: int
    min_size: int
    updates_per_step: int
    sample_batch_size: int

    @classmethod
    def of(cls, config: Any) -> ReplaySettings:
        """From a `ReplayConfig`; with its `replay_ratio`, the updates of each iteration's
        batch_size x unroll_length env steps (at least one)."""
        updates = config.updates_per_step if config.replay_ratio is None else max(
            1, round(config.replay_ratio * config.batch_size * config.unroll_length))
        return cls(config.n_step, config.discount, config.replay_size, config.min_replay_size,
                   updates, config.sample_batch_size)


@dataclasses.dataclass(frozen=True)
class Anakin:
    """The pure functions of the anakin program for one agent on one JAX env.

    Args:
      env: a `JaxEnv` (one env; vmapped here over `num_envs`).
      policy: the agent's `policy(params, key, obs, state, first) -> (actions, extras, state)`.
      init: the agent's `init(key) -> training state`.
      update: the agent's pure `update(state, batch) -> (state, metrics)`.
      initial_state: the policy state of `num_envs` env slots ({} for feed-forward agents).
      num_envs: B, envs per member (the agent's batch_size: one update takes every env's unroll).
      unroll_length: T.
      return_window: W, episodes in each member's return window.
      acting_params: `acting_params(train state)`, what the policy reads
        (`Training.acting_params`).
      replay: for an off-policy agent (`Capabilities.learns_from == REPLAY`), how it learns
        from a replay on the device; None: every update learns from the unrolls just played.
      decay_env_steps: a member's env steps over which its learning rate falls linearly to 0
        (`learning_rate_factor`, set before each update); None: no schedule.
      hparams: how the members' hyper-parameters are read and set (`Training.hparams`;
        none by default).
    """

    env: Any
    policy: Policy
    init: Callable[[jax.Array], Any]
    update: Update
    initial_state: Mapping[str, np.ndarray]
    num_envs: int
    unroll_length: int
    return_window: int
    acting_params: Callable[[Any], Any] = operator.attrgetter("params")
    replay: ReplaySettings | None = None
    decay_env_steps: int | None = None
    hparams: HyperParams = dataclasses.field(default_factory=lambda: NO_HPARAMS)

    def _act(self, params: Any, key: jax.Array, timestep: Any, policy_state: State
             ) -> tuple[dict[str, Tree], State]:
        """The one policy call: the recorded step at `timestep` and the next policy state."""
        actions, extras, policy_state = self.policy(
            params, key, timestep.obs, policy_state, timestep.first)
        record = {"obs": timestep.obs, "reward": timestep.reward,
                  "terminated": timestep.terminated, "truncated": timestep.truncated,
                  "first": timestep.first, "action": actions, **extras}
        return record, policy_state

    def init_member(self, key: jax.Array, hparams: Mapping[str, jax.Array]) -> MemberState:
        """A fresh member: the agent's initial state with `hparams` set, reset envs, and the
        first action chosen."""
        train_key, env_key, act_key, key = jax.random.split(key, 4)
        train = self.hparams.set(self.init(train_key), hparams)
        env, timestep = jax.vmap(self.env.reset)(jax.random.split(env_key, self.num_envs))
        policy_state = jax.tree.map(jnp.asarray, dict(self.initial_state))
        pending, policy_state = self._act(self.acting_params(train), act_key, timestep,
                                          policy_state)
        episodes = Episodes.zeros(self.num_envs, self.return_window)
        replay = None if self.replay is None else DeviceReplay.create(
            self.replay.capacity, jax.ShapeDtypeStruct(timestep.obs.shape[1:], timestep.obs.dtype),
            jax.ShapeDtypeStruct(pending["action"].shape[1:], pending["action"].dtype))
        return MemberState(train, env, pending, policy_state, episodes, key,
                           jnp.zeros((), jnp.int32), replay)

    def _env_step(self, params: Any, carry: _Carry, _: None) -> tuple[_Carry, dict[str, Tree]]:
        env, pending, policy_state, episodes, key = carry
        key, env_key, act_key = jax.random.split(key, 3)
        env, timestep = jax.vmap(self.env.step)(
            jax.random.split(env_key, self.num_envs), env, pending["action"])
        episodes = track_episodes(episodes, timestep.reward,
                                  timestep.terminated | timestep.truncated, timestep.first)
        record, policy_state = self._act(params, act_key, timestep, policy_state)
        return (env, record, policy_state, episodes, key), record

    def unroll(self, member: MemberState) -> tuple[MemberState, dict[str, jax.Array]]:
        """T env steps of every env: the batch {field: [T + 1, B, ...]} (the pending step
        first) and the member with its envs advanced."""
        carry = (member.env, member.pending, member.policy_state, member.episodes, member.key)
        carry, records = jax.lax.scan(functools.partial(self._env_step,
                                                        self.acting_params(member.train)),
                                      carry, None, length=self.unroll_length)
        env, pending, policy_state, episodes, key = carry
        batch = jax.tree.map(lambda first, rest: jnp.concatenate([first[None], rest]),
                             member.pending, records)
        return dataclasses.replace(member, env=env, pending=pending, policy_state=policy_state,
                                   episodes=episodes, key=key), batch

    def member_update(self, member: MemberState, _: None = None
                      ) -> tuple[MemberState, dict[str, jax.Array]]:
        """One unroll, then one update of the agent on it (or, off-policy, on minibatches
        sampled from the member's replay once it holds enough)."""
        member, batch = self.unroll(member)
        member = dataclasses.replace(member, updates=member.updates + 1)
        train, schedule = member.train, {}
        if self.decay_env_steps is not None:
            # In float32: int32 env steps would overflow at 2^31.
            env_steps = member.updates.astype(jnp.float32) * (self.unroll_length * self.num_envs)
            schedule = {"learning_rate_factor": learning_rate_factor(env_steps,
                                                                     self.decay_env_steps)}
            train = self.hparams.set_learning_rate_factor(train,
                                                          schedule["learning_rate_factor"])
        if self.replay is None:
            train, metrics = self.update(train, batch)
            return dataclasses.replace(member, train=train), {**metrics, **schedule}
        r = self.replay
        assert member.replay is not None  # init_member makes one where `self.replay` is set.
        replay = member.replay.add(batch, r.n_step, r.discount)
        key, sample_key = jax.random.split(member.key)

        def learn(train: Any) -> tuple[Any, dict[str, jax.Array]]:
            return self.update(train, replay.sample(sample_key, r.updates_per_step,
                                                    r.sample_batch_size))

        def wait(train: Any) -> tuple[Any, dict[str, jax.Array]]:
            # The update's metrics as zeros: both branches give one structure.
            metrics = jax.eval_shape(learn, train)[1]
            return train, jax.tree.map(lambda m: jnp.zeros(m.shape, m.dtype), metrics)

        train, metrics = jax.lax.cond(replay.size >= r.min_size, learn, wait, train)
        metrics = {**metrics, **schedule, "replay_size": replay.size.astype(jnp.float32)}
        return dataclasses.replace(member, train=train, replay=replay, key=key), metrics

    def population_steps(self, population: MemberState, num_updates: int,
                         pbt: PopulationPBT | None = None
                         ) -> tuple[MemberState, dict[str, jax.Array], PBTEvent | None]:
        """`num_updates` updates of every member of `population` (its leaves [M, ...]), with
        a PBT round (`exploit_and_explore`) after every K-th update of the members' count.

        Returns:
          (population, metrics {name: [M]} (means over the updates), the updates' `PBTEvent`s
          stacked, leaves [num_updates, ...]; None without PBT).
        """
        interval = pbt.interval_updates(self.unroll_length * self.num_envs) if pbt else 0

        def body(population: MemberState, _: None
                 ) -> tuple[MemberState, tuple[dict[str, jax.Array], PBTEvent | None]]:
            population, metrics = jax.vmap(self.member_update)(population)
            if pbt is None:
                return population, (metrics, None)
            due = population.updates[0] % interval == 0  # Members update in lockstep.
            train, episodes, event = pbt_round(population.train, population.episodes,
                                               population.key[0], due, pbt, self.hparams)
            population = dataclasses.replace(population, train=train, episodes=episodes)
            return population, (metrics, event)

        population, (metrics, events) = jax.lax.scan(body, population, None,
                                                     length=num_updates)
        return population, jax.tree.map(lambda m: jnp.mean(m, axis=0), metrics), events


# --- The population on the devices -------------------------------------------------------


def population_mesh(num_members: int, devices: Sequence[jax.Device]) -> Mesh:
    """The devices a population of `num_members` runs on, axis "data".

    Members are split whole over the largest number of the devices that divides them (no
    gradient crosses devices). A lone member on accelerators splits its env batch over all of
    them instead, data-parallel as the learner is; on CPUs it stays on one: CPU devices are
    threads of one host (`use_cpu_cores`), where splitting one member's small steps costs far
    more in synchronisation than it gains (docs/benchmarks.md).
    """
    devices = list(devices)
    if num_members == 1 and devices[0].platform != "cpu":
        return Mesh(np.array(devices), ("data",))
    count = max(d for d in range(1, len(devices) + 1) if num_members % d == 0)
    return Mesh(np.array(devices[:count]), ("data",))


def shards_members(num_members: int, mesh: Mesh) -> bool:
    """Whether `mesh` holds whole members ([M, ...] split on M) rather than splitting each
    member's env batch."""
    return mesh.size > 1 and num_members % mesh.size == 0


def _sharding_of(mesh: Mesh, state: MemberState) -> Any:
    """Whole members ([M, ...] split on M) over the mesh (`shards_members`); otherwise per-env
    leaves [M, B, ...] split on B and the rest replicated."""
    if shards_members(state.key.shape[0], mesh):
        return jax.tree.map(lambda _: NamedSharding(mesh, PartitionSpec("data")), state)
    replicated = NamedSharding(mesh, PartitionSpec())
    per_env = NamedSharding(mesh, PartitionSpec(None, "data"))
    env_sharded = (state.env, state.pending, state.policy_state,
                   (state.episodes.episode_return, state.episodes.episode_length))
    shardings = jax.tree.map(lambda _: replicated, state)
    env_shardings = jax.tree.map(lambda _: per_env, env_sharded)
    episodes = shardings.episodes.replace(episode_return=env_shardings[3][0],
                                          episode_length=env_shardings[3][1])
    return shardings.replace(env=env_shardings[0], pending=env_shardings[1],
                             policy_state=env_shardings[2], episodes=episodes)


class Population:
    """M members of an `Anakin` program, compiled once, stepped by the host.

    Args:
      anakin: the program's functions; its `update` is built for `mesh`, or for no mesh when
        the members are sharded over it (`shards_members`).
      mesh: the local devices, axis "data" (the env batch is sharded over it).
      keys: [M] member keys.
      hparams: {name: [M] values} the members start with (others: the config's).
      updates_per_call: updates of every member per compiled call.
      pbt: population-based training inside the program, or None.
    """

    def __init__(self, anakin: Anakin, mesh: Mesh, keys: jax.Array,
                 hparams: Mapping[str, Sequence[float]], updates_per_call: int,
                 pbt: PopulationPBT | None = None):
        self.anakin = anakin
        self.num_members = int(keys.shape[0])
        start = {k: jnp.asarray(v, jnp.float32) for k, v in hparams.items()}
        abstract = jax.eval_shape(jax.vmap(anakin.init_member), keys, start)
        self._sharding = _sharding_of(mesh, abstract)
        replicated = NamedSharding(mesh, PartitionSpec())
        step = jax.jit(
            functools.partial(anakin.population_steps, num_updates=updates_per_call, pbt=pbt),
            in_shardings=(self._sharding,),
            # No donation: a checkpoint may still be writing the previous state.
            out_shardings=(self._sharding, replicated, replicated))
        # XLA compiles without the GIL: the step compiles on a second core while the
        # initial state is compiled and computed here (seconds off a run's start).
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            compiled = pool.submit(lambda: step.lower(abstract).compile())
            init = jax.jit(jax.vmap(anakin.init_member), out_shardings=self._sharding)
            self.state = init(keys, start)
            self._step = compiled.result()
        self.env_steps_per_call = updates_per_call * anakin.unroll_length * anakin.num_envs

    def step(self) -> tuple[dict[str, jax.Array], list[dict[str, Any]]]:
        """One compiled call: the members' metrics {name: [M]} (means over the call), and the
        exploits of its PBT rounds (`exploits`; none without PBT)."""
        self.state, metrics, events = self._step(self.state)
        steps_per_update = self.anakin.unroll_length * self.anakin.num_envs
        return metrics, [] if events is None else exploits(
            jax.device_get(events), int(np.asarray(jax.device_get(self.state.updates))[0]),
            steps_per_update)

    def restore(self, state: Any) -> None:
        """Replaces the population's state (e.g. a checkpoint's, restored onto `self.state`)."""
        self.state = jax.device_put(state, self._sharding)

    def snapshots(self, env_steps: int, elapsed_s: float, resumes: int) -> list[CounterSnapshot]:
        """Each member's counters as the Gymnasium path's `Counter` would give them."""
        episodes = jax.device_get(self.state.episodes)
        learner_steps = np.asarray(jax.device_get(self.state.updates))
        out = []
        for m in range(self.num_members):
            count, start = int(episodes.count[m]), int(episodes.window_start[m])
            out.append(CounterSnapshot(
                env_steps=env_steps, learner_steps=int(learner_steps[m]), episodes=count,
                returns=tuple(float(r) for r in
                              window_in_order(episodes.returns[m], count, start)),
                lengths=tuple(int(n) for n in
                              window_in_order(episodes.lengths[m], count, start)),
                elapsed_s=elapsed_s, resumes=resumes))
        return out
