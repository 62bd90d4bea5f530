"""The anakin platform: act and learn in one jitted program, for envs written in JAX.

Podracer's "Anakin" architecture (Hessel et al., 2021): the envs (gymnax, envs/jax_env.py)
are vmapped over the batch and scanned over the unroll inside the same compiled program as
the agent's policy and update, so no env step waits on Python. The agent's pieces are reused
unchanged: its networks and policy (`builder.make_policy`), its pure `update(state, batch)`
and `init(key)` (what its `DataParallelLearner` jits), on the same time-major unrolls
{field: [T + 1, B, ...]} that the inference server records (`builders.inference.step_specs`):
the last step of an unroll is the first of the next, and one update takes T * B env steps.

A population (`num_seeds` = M members) is the member step vmapped over M: each member has its
own params, optimizer state, envs, RNG and hyper-parameters (`set_hparams`: the learning rate
and the loss weights the update reads from its state), in one program. The env batch axis is
sharded over the local devices, as the learner's batch is; everything else is replicated.

The host only calls the compiled step (`updates_per_call` updates of every member) and, in
between, logs, shows progress, checkpoints and checks the stop rule on each member's return
window (kept on the device: `Episodes`), with the same statistics as the Gymnasium path.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from trellis.agents.common import set_hparams
from trellis.builders.counter import CounterSnapshot

# --- Episode statistics on the device ---------------------------------------------------


@flax.struct.dataclass
class Episodes:
    """Running episodes of B envs and the window of the last W finished ones.

    Attributes:
      episode_return, episode_length: [B] of the episodes under way.
      returns, lengths: [W] ring buffers of finished episodes; slot `i % W` holds the i-th.
      count: episodes finished so far.
    """

    episode_return: jax.Array
    episode_length: jax.Array
    returns: jax.Array
    lengths: jax.Array
    count: jax.Array

    @classmethod
    def zeros(cls, num_envs: int, window: int) -> Episodes:
        return cls(jnp.zeros(num_envs, jnp.float32), jnp.zeros(num_envs, jnp.int32),
                   jnp.zeros(window, jnp.float32), jnp.zeros(window, jnp.int32),
                   jnp.zeros((), jnp.int32))


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
        episodes.count + ended.astype(jnp.int32))


def window_in_order(returns: np.ndarray, count: int) -> np.ndarray:
    """A ring buffer's episodes oldest first (at most W, fewer before W have ended)."""
    window = returns.shape[0]
    if count <= window:
        return returns[:count]
    return np.roll(returns, -(count % window))


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
    """

    train: Any
    env: Any
    pending: dict[str, jax.Array]
    policy_state: dict[str, jax.Array]
    episodes: Episodes
    key: jax.Array


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
    """

    env: Any
    policy: Callable
    init: Callable
    update: Callable
    initial_state: Mapping[str, np.ndarray]
    num_envs: int
    unroll_length: int
    return_window: int

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
        train = set_hparams(self.init(train_key), hparams)
        env, timestep = jax.vmap(self.env.reset)(jax.random.split(env_key, self.num_envs))
        policy_state = jax.tree.map(jnp.asarray, dict(self.initial_state))
        pending, policy_state = self._act(train.params, act_key, timestep, policy_state)
        episodes = Episodes.zeros(self.num_envs, self.return_window)
        return MemberState(train, env, pending, policy_state, episodes, key)

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
        carry, records = jax.lax.scan(functools.partial(self._env_step, member.train.params),
                                      carry, None, length=self.unroll_length)
        env, pending, policy_state, episodes, key = carry
        batch = jax.tree.map(lambda first, rest: jnp.concatenate([first[None], rest]),
                             member.pending, records)
        return member.replace(env=env, pending=pending, policy_state=policy_state,
                              episodes=episodes, key=key), batch

    def member_update(self, member: MemberState, _=None) -> tuple[MemberState, dict]:
        """One unroll, then one update of the agent on it."""
        member, batch = self.unroll(member)
        train, metrics = self.update(member.train, batch)
        return member.replace(train=train), metrics

    def member_steps(self, member: MemberState, num_updates: int) -> tuple[MemberState, dict]:
        """`num_updates` updates; the metrics are their means."""
        member, metrics = jax.lax.scan(self.member_update, member, None, length=num_updates)
        return member, jax.tree.map(jnp.mean, metrics)


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


def _sharding_of(mesh: Mesh, state: MemberState) -> Any:
    """Per-env leaves [M, B, ...] sharded over the mesh on B; the rest replicated."""
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
      anakin: the program's functions; its `update` is built for `mesh`.
      mesh: the local devices, axis "data" (the env batch is sharded over it).
      keys: [M] member keys.
      hparams: {name: [M] values} the members start with (others: the config's).
      updates_per_call: updates of every member per compiled call.
    """

    def __init__(self, anakin: Anakin, mesh: Mesh, keys: jax.Array,
                 hparams: Mapping[str, Sequence[float]], updates_per_call: int):
        self.anakin = anakin
        self.num_members = int(keys.shape[0])
        hparams = {k: jnp.asarray(v, jnp.float32) for k, v in hparams.items()}
        abstract = jax.eval_shape(jax.vmap(anakin.init_member), keys, hparams)
        self._sharding = _sharding_of(mesh, abstract)
        step = jax.jit(
            jax.vmap(functools.partial(anakin.member_steps, num_updates=updates_per_call)),
            in_shardings=(self._sharding,),
            # No donation: a checkpoint may still be writing the previous state.
            out_shardings=(self._sharding, NamedSharding(mesh, PartitionSpec())))
        # XLA compiles without the GIL: the step compiles on a second core while the
        # initial state is compiled and computed here (seconds off a run's start).
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            compiled = pool.submit(lambda: step.lower(abstract).compile())
            init = jax.jit(jax.vmap(anakin.init_member), out_shardings=self._sharding)
            self.state = init(keys, hparams)
            self._step = compiled.result()
        self.env_steps_per_call = updates_per_call * anakin.unroll_length * anakin.num_envs

    def step(self) -> dict[str, np.ndarray]:
        """One compiled call; returns the members' metrics {name: [M]} (means over the call)."""
        self.state, metrics = self._step(self.state)
        return metrics

    def restore(self, state: Any) -> None:
        """Replaces the population's state (e.g. a checkpoint's, restored onto `self.state`)."""
        self.state = jax.device_put(state, self._sharding)

    def snapshots(self, env_steps: int, elapsed_s: float, resumes: int) -> list[CounterSnapshot]:
        """Each member's counters as the Gymnasium path's `Counter` would give them."""
        episodes = jax.device_get(self.state.episodes)
        learner_steps = np.asarray(jax.device_get(self.state.train.step))
        out = []
        for m in range(self.num_members):
            count = int(episodes.count[m])
            out.append(CounterSnapshot(
                env_steps=env_steps, learner_steps=int(learner_steps[m]), episodes=count,
                returns=tuple(float(r) for r in window_in_order(episodes.returns[m], count)),
                lengths=tuple(int(n) for n in window_in_order(episodes.lengths[m], count)),
                elapsed_s=elapsed_s, resumes=resumes))
        return out
