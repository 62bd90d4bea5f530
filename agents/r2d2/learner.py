"""R2D2 learner: sequences sampled from a prioritized table -> burn-in -> n-step double-Q
update with value rescaling -> new priorities written back to the table.

The learner node feeds it batches sampled from the builder's replay table on the replay node
(`builders.contract.agent.Builder.replay_table`); as in Acme's R2D2 learner, the learner writes the
priorities back itself through the replay client it was given.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from trellis.agents.common import (
    STATE_HPARAMS,
    Batch,
    DataParallelLearner,
    TargetNetworkState,
    importance_weights,
    init_target_network_state,
    make_optimizer,
)
from trellis.agents.common.learners import Metrics
from trellis.agents.common.params import Params
from trellis.agents.r2d2.config import R2D2Config
from trellis.agents.r2d2.losses import (
    sequence_priority,
    sequence_td_errors,
    weighted_sequence_loss,
)
from trellis.agents.r2d2.networks import R2D2Networks
from trellis.builders.contract.agent import (
    REPLAY_KEY,
    REPLAY_PROBABILITY,
    REPLAY_TABLE_SIZE,
    Training,
    recorded_state,
)


def unroll_q(networks: R2D2Networks, params: Params, batch: Batch, burn_in: int) -> jax.Array:
    """Q-values [T + 1, B, A] over the steps after the burn-in.

    The LSTM starts from the state recorded at the sequence's first step; the burn-in steps
    only carry it forward, without gradient (R2D2, section 3: "stored state" with burn-in).
    """
    state = recorded_state(batch)  # [B, ...]; the core ignores what is not its own (epsilon).
    obs, first = batch["obs"], batch["first"]
    if burn_in:
        state, _ = networks.apply(params, state, obs[:burn_in], first[:burn_in])
        state = jax.lax.stop_gradient(state)
    _, q = networks.apply(params, state, obs[burn_in:], first[burn_in:])
    return q


def make_update(
    networks: R2D2Networks, optimizer: optax.GradientTransformation, config: R2D2Config
) -> Callable[[TargetNetworkState, Batch], tuple[TargetNetworkState, dict[str, jax.Array]]]:
    """Returns the pure `update(state, batch) -> (state, metrics)`.

    `batch` holds B sequences, time-major: the recorded steps [burn_in + T + 1, B, ...], the
    policy state `state/<name>` [1, B, ...] at their first step, and the sampling
    probability and table size [1, B] (`REPLAY_PROBABILITY`, `REPLAY_TABLE_SIZE`). One SGD
    step; `metrics["priorities"]` [B] are the sequences' new priorities, the rest scalars.
    """
    c = config
    td_errors = jax.vmap(  # Over the batch axis of every input.
        functools.partial(sequence_td_errors, discount=c.discount, n_step=c.n_step,
                          eps=c.value_rescaling_eps), in_axes=1)

    def loss_fn(params: Params, target_params: Params, batch: Batch
                ) -> tuple[jax.Array, tuple[jax.Array, dict[str, jax.Array]]]:
        q_online = unroll_q(networks, params, batch, c.burn_in)  # [T + 1, B, A]
        # No gradient reaches the target network: one pass over burn-in and trace will do.
        _, q_target = networks.apply(target_params, recorded_state(batch), batch["obs"],
                                     batch["first"])
        q_target = q_target[c.burn_in:]
        trace = {k: batch[k][c.burn_in:] for k in
                 ("action", "reward", "terminated", "truncated", "first")}
        td, mask = td_errors(q_online, q_target, trace["action"], trace["reward"],
                             trace["terminated"], trace["truncated"], trace["first"])  # [B, T]
        weights = importance_weights(batch[REPLAY_PROBABILITY][0], batch[REPLAY_TABLE_SIZE][0],
                                     c.importance_exponent)
        loss = weighted_sequence_loss(td, mask, weights)
        priorities = jax.vmap(sequence_priority, in_axes=(0, 0, None))(td, mask, c.priority_eta)
        abs_td = jnp.sum(jnp.abs(td) * mask) / jnp.maximum(jnp.sum(mask), 1.0)
        return loss, (priorities, {"q_mean": jnp.mean(q_online), "td_abs": abs_td})

    def update(state: TargetNetworkState, batch: Batch
               ) -> tuple[TargetNetworkState, dict[str, jax.Array]]:
        (loss, (priorities, metrics)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            state.params, state.target_params, batch)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        step = state.step + 1
        target_params = optax.periodic_update(params, state.target_params, step,
                                              c.target_update_period)
        key, _ = jax.random.split(state.key)
        metrics = dict(metrics, loss=loss, grad_norm=optax.global_norm(grads),
                       priorities=priorities)
        return TargetNetworkState(params, target_params, opt_state, key, step), metrics

    return update


def make_training(networks: R2D2Networks, config: R2D2Config) -> Training:
    """The pure init and update of the R2D2 learner (`builders.contract.agent.Training`)."""
    optimizer = make_optimizer(config)
    return Training(
        functools.partial(init_target_network_state, networks.init, optimizer),
        lambda mesh: make_update(networks, optimizer, config),
        hparams=STATE_HPARAMS,
    )


class Learner(DataParallelLearner):
    """Host shell: one jitted update per sampled batch, then the priorities go back to the
    replay table.

    Args:
      networks, config: the agent's.
      key: the learner's root key.
      replay: a client of the replay node (`reverb_tables.ReplayClient` or in-process).
      table: the name of the sequence table there.
      devices: the learner devices.
    """

    def __init__(self, networks: R2D2Networks, config: R2D2Config, key: jax.Array, replay: Any,
                 table: str, devices: Sequence[jax.Device] | None = None):
        super().__init__(
            make_training(networks, config), key, config.batch_size, devices,
        )
        self._replay, self._table = replay, table

    def place(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        """The batch as it is: its keys stay on the host (uint64 does not go to the device)."""
        return dict(batch)

    def compile(self, batch: Mapping[str, Any]) -> None:
        """Compiles the update for sampled sequences shaped as `batch` (`REPLAY_KEY` stays on
        the host)."""
        super().compile({k: v for k, v in batch.items() if k != REPLAY_KEY})

    def step(self, batch: Mapping[str, np.ndarray]) -> Metrics:
        """Learns from sampled sequences and writes their new priorities back.

        Args:
          batch: as `make_update` takes it, plus `REPLAY_KEY` [B], the items' keys (kept on
            the host: uint64 does not go to the device).

        Returns:
          The update's scalar metrics (device arrays).
        """
        keys = np.asarray(batch[REPLAY_KEY])
        metrics = dict(super().step({k: v for k, v in batch.items() if k != REPLAY_KEY}))
        priorities = np.asarray(metrics.pop("priorities"), np.float64)
        # A sequence sampled twice in the batch keeps the last of its priorities.
        self._replay.update_priorities(self._table, dict(zip(keys.tolist(), priorities.tolist(),
                                                             strict=True)))
        return metrics
