"""Transition replay for off-policy agents: unrolls from central inference become n-step
transitions in an in-process table (reverb_tables, native backend) that the learner samples.

DQN (prioritized) and SAC (uniform) both learn from it through `agents.common.ReplayLearner`;
the table's selector is theirs to pick. On anakin the same transitions live in a ring on the
device (`DeviceReplay`), sampled uniformly inside the jitted program.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from trellis import reverb_tables as rt

TABLE = "transitions"


def n_step_returns(first: Any, terminated: Any, truncated: Any, reward: Any, n_step: int,
                   discount: float, xp: Any = np) -> tuple[Any, Any, Any, Any]:
    """The n-step return of every start of time-major unrolls, none crossing an episode
    boundary, in the array namespace `xp` (numpy on the host, jax.numpy inside jit).

    Step t of an unroll holds `obs` and how it was reached (`reward`, `terminated`,
    `truncated`, `first`) and the `action` chosen at it. The transition from t sums the
    discounted rewards of the next k <= n steps and bootstraps from obs[t + k] with
    discount^k; it ends early where the episode ends (termination: bootstrap discount 0;
    truncation: bootstrap from the last observation) or where the unroll ends (a shorter
    but still valid return). A start whose next observation is `first` (Gymnasium's
    next-step autoreset: the action at a final observation is ignored) is not valid.

    Args:
      first, terminated, truncated: [T + 1, B] bools.
      reward: [T + 1, B].
      n_step: n.
      discount: gamma.
      xp: numpy (float64 sums) or jax.numpy (its default float).

    Returns:
      (returns, bootstrap discount, bootstrap index into the time axis, valid), each [T, B].
    """
    t_max = first.shape[0] - 1
    starts = xp.arange(t_max)[:, None]  # [T, 1]
    cols = xp.arange(first.shape[1])[None, :]  # [1, B]
    valid = ~first[1:]  # [T, B]
    returns = xp.zeros(valid.shape, reward.dtype)
    scale = xp.ones(valid.shape, reward.dtype)  # discount^j, or 0 once terminated.
    end = xp.broadcast_to(starts, valid.shape)  # Bootstrap index.
    alive = valid
    for j in range(1, n_step + 1):
        s = xp.minimum(starts + j, t_max)  # [T, 1]; clipped rows are masked by `step`.
        step = alive & (starts + j <= t_max) & ~first[s, cols]
        returns = xp.where(step, returns + scale * reward[s, cols], returns)
        scale = xp.where(step, scale * discount, scale)
        end = xp.where(step, s, end)
        scale = xp.where(step & terminated[s, cols], 0.0, scale)
        alive = step & ~(terminated[s, cols] | truncated[s, cols])
    return returns, scale, end, valid


def unrolls_to_transitions(
    unrolls: Mapping[str, np.ndarray], n_step: int, discount: float
) -> dict[str, np.ndarray]:
    """The valid n-step transitions of time-major unrolls (`n_step_returns`), on the host.

    Args:
      unrolls: {field: [T + 1, B, ...]}.
      n_step: n.
      discount: gamma.

    Returns:
      {obs, next_obs: [M, ...], action: [M, ...] (the unrolls' dtype), reward, discount: [M]},
      M <= T * B, ordered by (t, b).
    """
    returns, scale, end, valid = n_step_returns(
        unrolls["first"].astype(bool), unrolls["terminated"].astype(bool),
        unrolls["truncated"].astype(bool), unrolls["reward"].astype(np.float64), n_step,
        discount)
    t_idx, b_idx = np.nonzero(valid)
    return {
        "obs": unrolls["obs"][t_idx, b_idx],
        "action": unrolls["action"][t_idx, b_idx],
        "reward": returns[t_idx, b_idx].astype(np.float32),
        "discount": scale[t_idx, b_idx].astype(np.float32),
        "next_obs": unrolls["obs"][end[t_idx, b_idx], b_idx],
    }


class TransitionReplay:
    """An in-process table of n-step transitions, filled from unrolls, sampled in minibatches.

    Args:
      selector: how items are sampled (e.g. `rt.Prioritized(0.6)`, `rt.Uniform()`); the
        oldest item is removed once the table is full.
      capacity: most transitions held.
      obs_spec, action_spec: (shape, dtype) of one observation and one action.
      n_step, discount: of the transitions (see `unrolls_to_transitions`).
      seed: the table's sampling seed.
    """

    def __init__(self, selector: rt.Selector, capacity: int,
                 obs_spec: tuple[tuple[int, ...], str], action_spec: tuple[tuple[int, ...], str],
                 n_step: int, discount: float, seed: int):
        obs = rt.ArraySpec(*obs_spec)
        self._signature = {"obs": obs, "next_obs": obs, "action": rt.ArraySpec(*action_spec),
                           "reward": rt.ArraySpec((), "float32"),
                           "discount": rt.ArraySpec((), "float32")}
        self.client = rt.NativeClient(
            [rt.TableSpec(TABLE, selector, rt.Fifo(), capacity, rt.MinSize(1),
                          signature=self._signature)],
            seed=seed)
        self.table = self.client.table(TABLE)
        self._n_step, self._discount = n_step, discount

    def add(self, unrolls: Mapping[str, np.ndarray], priority: float) -> int:
        """Inserts the unrolls' transitions at `priority`; returns the table's size after."""
        transitions = unrolls_to_transitions(unrolls, self._n_step, self._discount)
        # The recorded action dtype may be wider than the table's (e.g. int64 from numpy).
        transitions = {k: v.astype(self._signature[k].dtype, copy=False)
                       for k, v in transitions.items()}
        for i in range(len(transitions["reward"])):
            self.table.insert({k: v[i] for k, v in transitions.items()}, priority)
        return len(self.table)

    def sample_shapes(self, num_batches: int, batch_size: int
                      ) -> dict[str, jax.ShapeDtypeStruct]:
        """The shapes and dtypes of `sample`'s minibatches (for compiling ahead)."""
        shapes = {k: jax.ShapeDtypeStruct((num_batches, batch_size) + spec.shape, spec.dtype)
                  for k, spec in self._signature.items()}
        for name in ("probability", "table_size"):
            shapes[name] = jax.ShapeDtypeStruct((num_batches, batch_size), np.float32)
        return shapes

    def sample(self, num_batches: int, batch_size: int) -> tuple[dict[str, np.ndarray],
                                                                 np.ndarray]:
        """`num_batches` minibatches of `batch_size` items in one draw.

        Returns:
          ({field: [U, S, ...]} with the transition fields plus the sampling `probability`
          and `table_size` of each item (for importance weights), keys [U * S] of the items).
        """
        u, s = num_batches, batch_size
        sample = self.table.sample(u * s)
        minibatches = {k: v.reshape((u, s) + v.shape[1:]) for k, v in sample.data.items()}
        minibatches["probability"] = sample.probabilities.astype(np.float32).reshape(u, s)
        minibatches["table_size"] = sample.table_size.astype(np.float32).reshape(u, s)
        return minibatches, sample.keys


@flax.struct.dataclass
class DeviceReplay:
    """A ring of n-step transitions kept on the device, for off-policy agents on anakin.

    The same transitions as `TransitionReplay` (`n_step_returns`), stored at fixed shapes: an
    unroll [T + 1, B] writes all its T * B starts, each with a `valid` flag, and sampling draws
    uniformly among the valid slots, so no shape depends on the data and the whole
    act-add-sample-learn step jits. Minibatches look like `TransitionReplay.sample`'s
    (with `probability` 1 / size and `table_size`), so the agent's update runs unchanged.

    Attributes:
      data: {obs, next_obs, action, reward, discount: [N, ...]}.
      valid: [N] the slots holding a transition.
      index: the next slot written (the oldest once full).
    """

    data: dict[str, jax.Array]
    valid: jax.Array
    index: jax.Array

    @classmethod
    def create(cls, capacity: int, obs: jax.ShapeDtypeStruct,
               action: jax.ShapeDtypeStruct) -> DeviceReplay:
        """An empty ring of `capacity` transitions of one `obs` and one `action`."""
        def slots(spec: jax.ShapeDtypeStruct) -> jax.Array:
            return jnp.zeros((capacity,) + tuple(spec.shape), spec.dtype)

        scalar = jax.ShapeDtypeStruct((), jnp.float32)
        return cls({"obs": slots(obs), "next_obs": slots(obs), "action": slots(action),
                    "reward": slots(scalar), "discount": slots(scalar)},
                   jnp.zeros(capacity, bool), jnp.zeros((), jnp.int32))

    @property
    def size(self) -> jax.Array:
        return jnp.sum(self.valid, dtype=jnp.int32)

    def add(self, unrolls: Mapping[str, jax.Array], n_step: int,
            discount: float) -> DeviceReplay:
        """Writes the T * B starts of unrolls {field: [T + 1, B, ...]}, oldest slots first.

        Raises:
          ValueError: T * B > capacity (one unroll would overwrite itself).
        """
        returns, scale, end, valid = n_step_returns(
            unrolls["first"], unrolls["terminated"], unrolls["truncated"],
            unrolls["reward"].astype(jnp.float32), n_step, discount, xp=jnp)
        t, b = valid.shape
        capacity = self.valid.shape[0]
        if t * b > capacity:
            raise ValueError(f"replay_size={capacity} holds fewer transitions than one update's "
                             f"unrolls ({t} x {b}); raise replay_size")
        cols = jnp.arange(b)[None, :]
        new = {"obs": unrolls["obs"][:-1], "action": unrolls["action"][:-1], "reward": returns,
               "discount": scale, "next_obs": unrolls["obs"][end, cols]}
        slots = (self.index + jnp.arange(t * b)) % capacity
        def flat(x: jax.Array) -> jax.Array:
            return x.reshape((t * b,) + x.shape[2:])

        data = {k: v.at[slots].set(flat(new[k]).astype(v.dtype)) for k, v in self.data.items()}
        return DeviceReplay(data, self.valid.at[slots].set(flat(valid)),
                            (self.index + t * b) % capacity)

    def sample(self, key: jax.Array, num_batches: int, batch_size: int) -> dict[str, jax.Array]:
        """`num_batches` minibatches of `batch_size` transitions drawn uniformly (with
        replacement) from the valid slots: {field: [U, S, ...]} plus `probability` and
        `table_size`. Call it only once `size` > 0."""
        count = jnp.cumsum(self.valid, dtype=jnp.int32)  # [N]
        size = count[-1]
        rank = jax.random.randint(key, (num_batches * batch_size,), 0, size)
        slots = jnp.searchsorted(count, rank, side="right")  # The rank-th valid slot.
        shape = (num_batches, batch_size)
        minibatches = {k: v[slots].reshape(shape + v.shape[1:]) for k, v in self.data.items()}
        minibatches["probability"] = jnp.full(shape, 1.0, jnp.float32) / size
        minibatches["table_size"] = jnp.full(shape, size, jnp.float32)
        return minibatches
