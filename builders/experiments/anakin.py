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
program (`exploit_and_explore`).

The host only calls the compiled step (`updates_per_call` updates of every member) and, in
between, logs, shows progress, checkpoints and checks the stop rule on each member's return
window (kept on the device: `Episodes`), with the same statistics as the Gymnasium path.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import math
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from trellis.agents.common.replay import DeviceReplay
from trellis.builders.contract.hparams import HyperParams, learning_rate_factor
from trellis.builders.experiments.counter import CounterSnapshot
from trellis.builders.experiments.pbt import LISTS, Dimension, PopulationPBT, quantile_size
from trellis.builders.experiments.schedule import NO_HPARAMS

# --- Episode statistics on the device ---------------------------------------------------


@flax.struct.dataclass
class Episodes:
    """Running episodes of B envs and the window of the last W finished ones.

    Attributes:
      episode_return, episode_length: [B] of the episodes under way.
      returns, lengths: [W] ring buffers of finished episodes; slot `i % W` holds the i-th.
      count: episodes finished so far.
      window_start: the first episode the window counts (0; a PBT exploit restarts it, so a
        member's window holds only episodes it played after its latest copy).
    """

    episode_return: jax.Array
    episode_length: jax.Array
    returns: jax.Array
    lengths: jax.Array
    count: jax.Array
    window_start: jax.Array

    @classmethod
    def zeros(cls, num_envs: int, window: int) -> Episodes:
        return cls(jnp.zeros(num_envs, jnp.float32), jnp.zeros(num_envs, jnp.int32),
                   jnp.zeros(window, jnp.float32), jnp.zeros(window, jnp.int32),
                   jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32))


def track_episodes(episodes: Episodes, reward: jax.Array, done: jax.Array,
                   first: jax.Array) -> Episodes:
    """Adds one step of B envs, as `builders.env_worker.EpisodeTracker` does on the host.

    A `first` step starts an episode (return and length 0); a `done` step ends one, which
    enters the window. When more than W end at once, the window keeps the last W of them.
    """
    window = episodes.returns.shape[0]
    episode_return = jnp.where(first, 0.0, episodes.episode_return + reward)
    episode_length = jnp.where(first, 0, episodes.episode_length + 1)
    rank = jnp.cumsum(done) - 1  # Order of the episodes ending on this step.
    ended = jnp.sum(done)
    keep = done & (rank >= ended - window)
    slot = jnp.where(keep, (episodes.count + rank) % window, window)  # window: dropped.
    return Episodes(
        episode_return, episode_length,
        episodes.returns.at[slot].set(episode_return, mode="drop"),
        episodes.lengths.at[slot].set(episode_length, mode="drop"),
        episodes.count + ended.astype(jnp.int32), episodes.window_start)


def window_in_order(values: np.ndarray, count: int, start: int = 0) -> np.ndarray:
    """A ring buffer's window oldest first: the last min(count - start, W) episodes."""
    window = values.shape[0]
    held = min(count - start, window)
    return values[np.arange(count - held, count) % window]


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
    policy_state: dict[str, jax.Array]
    episodes: Episodes
    key: jax.Array
    updates: jax.Array
    replay: DeviceReplay | None = None


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
        return cls(config.n_step, config.discount, config.replay_size, config.min_replay_size,
                   config.updates_per_step, config.sample_batch_size)


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
    policy: Callable
    init: Callable
    update: Callable
    initial_state: Mapping[str, np.ndarray]
    num_envs: int
    unroll_length: int
    return_window: int
    acting_params: Callable[[Any], Any] = operator.attrgetter("params")
    replay: ReplaySettings | None = None
    decay_env_steps: int | None = None
    hparams: HyperParams = dataclasses.field(default_factory=lambda: NO_HPARAMS)

    def _act(self, params, key, timestep, policy_state):
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

    def _env_step(self, params, carry, _):
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
        return member.replace(env=env, pending=pending, policy_state=policy_state,
                              episodes=episodes, key=key), batch

    def member_update(self, member: MemberState, _=None) -> tuple[MemberState, dict]:
        """One unroll, then one update of the agent on it (or, off-policy, on minibatches
        sampled from the member's replay once it holds enough)."""
        member, batch = self.unroll(member)
        member = member.replace(updates=member.updates + 1)
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
            return member.replace(train=train), {**metrics, **schedule}
        r = self.replay
        replay = member.replay.add(batch, r.n_step, r.discount)
        key, sample_key = jax.random.split(member.key)

        def learn(train):
            return self.update(train, replay.sample(sample_key, r.updates_per_step,
                                                    r.sample_batch_size))

        def wait(train):  # The update's metrics as zeros: both branches give one structure.
            metrics = jax.eval_shape(learn, train)[1]
            return train, jax.tree.map(lambda m: jnp.zeros(m.shape, m.dtype), metrics)

        train, metrics = jax.lax.cond(replay.size >= r.min_size, learn, wait, train)
        metrics = {**metrics, **schedule, "replay_size": replay.size.astype(jnp.float32)}
        return member.replace(train=train, replay=replay, key=key), metrics

    def population_steps(self, population: MemberState, num_updates: int,
                         pbt: PopulationPBT | None = None) -> tuple[MemberState, dict, dict]:
        """`num_updates` updates of every member of `population` (its leaves [M, ...]), with
        a PBT round (`exploit_and_explore`) after every K-th update of the members' count.

        Returns:
          (population, metrics {name: [M]} (means over the updates), the updates' `PBTEvent`s
          stacked, leaves [num_updates, ...]; None without PBT).
        """
        interval = pbt.interval_updates(self.unroll_length * self.num_envs) if pbt else 0

        def body(population, _):
            population, metrics = jax.vmap(self.member_update)(population)
            if pbt is None:
                return population, (metrics, None)
            # Member 0's acting key, folded with a constant: a stream of its own that is part
            # of the state, so a resumed run draws what an uninterrupted one would.
            key = jax.random.fold_in(population.key[0], _PBT_STREAM)
            due = population.updates[0] % interval == 0  # Members update in lockstep.
            # Only what a round changes goes through the cond: its operands may be copied.
            train, episodes, event = jax.lax.cond(
                due, functools.partial(exploit_and_explore, key=key, pbt=pbt,
                                       hparams=self.hparams),
                functools.partial(no_pbt_round, hparams=self.hparams),
                population.train, population.episodes)
            return population.replace(train=train, episodes=episodes), (metrics, event)

        population, (metrics, events) = jax.lax.scan(body, population, None,
                                                     length=num_updates)
        return population, jax.tree.map(lambda m: jnp.mean(m, axis=0), metrics), events


# --- Population-based training on the device --------------------------------------------

_PBT_STREAM = 0x504254  # "PBT".


def window_means(episodes: Episodes) -> jax.Array:
    """Each member's mean return over its window ([M]); -inf before its first episode ends,
    so a member without a score ranks last."""
    window = episodes.returns.shape[-1]
    held = jnp.minimum(episodes.count - episodes.window_start, window)
    # Slot i holds the episode finished `age` episodes before the newest one.
    age = (episodes.count[..., None] - 1 - jnp.arange(window)) % window
    total = jnp.sum(jnp.where(age < held[..., None], episodes.returns, 0.0), axis=-1)
    return jnp.where(held > 0, total / jnp.maximum(held, 1), -jnp.inf)


def sample(dimension: Dimension, key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """Draws from a search dimension (float32): loguniform and uniform ranges, or one of a
    choice's or grid's values.

    Raises:
      ValueError: a kind PBT on the device does not resample (randint).
    """
    kind, values = dimension.kind, dimension.values
    if kind in LISTS:
        return jnp.asarray(values, jnp.float32)[jax.random.randint(key, shape, 0, len(values))]
    if kind == "loguniform":
        return jnp.exp(jax.random.uniform(key, shape, minval=math.log(values[0]),
                                          maxval=math.log(values[1])))
    if kind == "uniform":
        return jax.random.uniform(key, shape, minval=values[0], maxval=values[1])
    raise ValueError(f"PBT on the device resamples loguniform, uniform and list dimensions, "
                     f"not {kind}")


def explore(hparams: Mapping[str, jax.Array], key: jax.Array,
            pbt: PopulationPBT) -> dict[str, jax.Array]:
    """Tune's explore, per member ({name: [M]}): each searched hyper-parameter is drawn afresh
    from its dimension with probability `pbt_resample_probability`, else multiplied by one of
    the two `pbt_perturb` factors, each with probability 1/2. Others are kept."""
    out = dict(hparams)
    for name, name_key in zip(sorted(pbt.search), jax.random.split(key, len(pbt.search)),
                              strict=True):
        resample_key, factor_key, draw_key = jax.random.split(name_key, 3)
        value = hparams[name]
        factor = jnp.asarray(pbt.config.pbt_perturb, value.dtype)[
            jax.random.randint(factor_key, value.shape, 0, 2)]
        resample = jax.random.uniform(resample_key, value.shape) < (
            pbt.config.pbt_resample_probability)
        out[name] = jnp.where(resample, sample(pbt.search[name], draw_key, value.shape),
                              value * factor).astype(value.dtype)
    return out


@flax.struct.dataclass
class PBTEvent:
    """One update's PBT round, [M] per member: `donor` is the member each one copied (itself
    if it did not), `score` the mean returns it was ranked by, `before` and `after` the
    hyper-parameters {name: [M]} before and after the round; `round` whether one ran."""

    round: jax.Array
    donor: jax.Array
    score: jax.Array
    before: dict[str, jax.Array]
    after: dict[str, jax.Array]


def exploit_and_explore(train: Any, episodes: Episodes, key: jax.Array, pbt: PopulationPBT,
                        hparams: HyperParams) -> tuple[Any, Episodes, PBTEvent]:
    """A PBT round over the members' training states and return windows (leaves [M, ...]),
    as Tune's PopulationBasedTraining does it between trials: the members are ranked by their
    window's mean return; each one in the bottom `pbt_quantile` copies a member of the top
    quantile drawn at random (its training state: params, optimizer state, RNG key, step
    counter), empties its own return window, and takes that member's hyper-parameters
    through `explore`. A gather over the member axis: nothing leaves the device.

    Returns:
      (train, episodes, the round's event).
    """
    score = window_means(episodes)
    num_members = score.shape[0]
    size = quantile_size(num_members, pbt.config.pbt_quantile)
    order = jnp.argsort(score)  # Worst first; ties in member order.
    donor_key, explore_key = jax.random.split(key)
    chosen = order[num_members - size + jax.random.randint(donor_key, (size,), 0, size)]
    donor = jnp.arange(num_members).at[order[:size]].set(chosen)
    copied = jax.tree.map(lambda x: x[donor], train)
    before = hparams.get(train)
    explored = explore(hparams.get(copied), explore_key, pbt)
    exploits = donor != jnp.arange(num_members)
    after = {name: jnp.where(exploits, v, before[name]) for name, v in explored.items()}
    # The copy starts an empty window (and keeps its envs' episodes under way and its episode
    # count): its mean return, its rank at the next round and whether it solved then count
    # only episodes it played itself, never the donor's. Copying the window let a whole
    # population "solve" the moment its bottom members copied solved donors.
    episodes = episodes.replace(
        window_start=jnp.where(exploits, episodes.count, episodes.window_start))
    return (hparams.set(copied, after), episodes,
            PBTEvent(jnp.asarray(True), donor, score, before, after))


def exploits(events: PBTEvent, last_step: int, steps_per_update: int) -> list[dict[str, Any]]:
    """One dict per member that exploited another in a call's events (host arrays, leaves
    [U, ...] over its U updates, the last at learner step `last_step`): `env_steps` (per
    member) of the round, `member`, `donor`, their `member_return` and `donor_return` (the
    window means they were ranked by; None before a member's first episode ended), and the
    hyper-parameters: the member's `before`, the donor's `donor_hparams` and the member's
    `after`."""
    out = []
    num_updates = events.round.shape[0]
    for u in np.flatnonzero(events.round):
        env_steps = (last_step - num_updates + 1 + int(u)) * steps_per_update
        donor = events.donor[u]
        for member in np.flatnonzero(donor != np.arange(donor.shape[0])):
            d = int(donor[member])
            out.append({
                "env_steps": env_steps, "member": int(member), "donor": d,
                "member_return": _finite(events.score[u, member]),
                "donor_return": _finite(events.score[u, d]),
                "before": {k: float(v[u, member]) for k, v in events.before.items()},
                "donor_hparams": {k: float(v[u, d]) for k, v in events.before.items()},
                "after": {k: float(v[u, member]) for k, v in events.after.items()}})
    return out


def _finite(x: Any) -> float | None:
    return float(x) if np.isfinite(x) else None


def no_pbt_round(train: Any, episodes: Episodes, hparams: HyperParams
                 ) -> tuple[Any, Episodes, PBTEvent]:
    """`exploit_and_explore`'s result when no round is due: everything unchanged."""
    values = hparams.get(train)
    members = jnp.arange(episodes.count.shape[0])
    return train, episodes, PBTEvent(jnp.asarray(False), members, window_means(episodes),
                                     values, values)


def play_episodes(env: Any, policy: Callable, params: Any, initial_state: Mapping[str, Any],
                  num_episodes: int, key: jax.Array) -> jax.Array:
    """Returns [num_episodes] of one episode in each of `num_episodes` fresh envs (jittable).

    Args:
      env: a `JaxEnv`; its time limit ends every episode.
      policy: e.g. the agent's greedy policy (`make_policy(networks, evaluation=True)`).
      params: the policy's params.
      initial_state: the policy state of `num_episodes` env slots.
      num_episodes: envs, one episode each.
      key: for the envs and the policy.
    """
    reset_key, key = jax.random.split(key)
    env_state, timestep = jax.vmap(env.reset)(jax.random.split(reset_key, num_episodes))

    def body(carry):
        env_state, timestep, policy_state, returns, finished, key = carry
        key, act_key, env_key = jax.random.split(key, 3)
        actions, _, policy_state = policy(params, act_key, timestep.obs, policy_state,
                                          timestep.first)
        env_state, timestep = jax.vmap(env.step)(
            jax.random.split(env_key, num_episodes), env_state, actions)
        returns = returns + jnp.where(finished, 0.0, timestep.reward)
        finished = finished | timestep.terminated | timestep.truncated
        return env_state, timestep, policy_state, returns, finished, key

    carry = (env_state, timestep, dict(initial_state), jnp.zeros(num_episodes, jnp.float32),
             jnp.zeros(num_episodes, bool), key)
    return jax.lax.while_loop(lambda c: ~jnp.all(c[4]), body, carry)[3]


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
        hparams = {k: jnp.asarray(v, jnp.float32) for k, v in hparams.items()}
        abstract = jax.eval_shape(jax.vmap(anakin.init_member), keys, hparams)
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
            self.state = init(keys, hparams)
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
