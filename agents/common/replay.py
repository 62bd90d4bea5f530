"""Transition replay for off-policy agents: unrolls from central inference become n-step
transitions in an in-process table (reverb_tables, native backend) that the learner samples.

DQN (prioritized) and SAC (uniform) both learn from it through `agents.common.ReplayLearner`;
the table's selector is theirs to pick.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

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
        self.client = rt.make_client(
            [rt.TableSpec(TABLE, selector, rt.Fifo(), capacity, rt.MinSize(1),
                          signature=self._signature)],
            backend="native", seed=seed)
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
