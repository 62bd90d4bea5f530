"""DQN learner: unrolls -> n-step transitions -> prioritized replay -> jitted double-Q updates.

The learner node hands every learner a batch of unrolls [T + 1, B] from central inference.
DQN is off-policy, so its host shell (agents.common.ReplayLearner) turns them into n-step
transitions, inserts them into an in-process prioritized table with the largest priority
seen so far, samples `updates_per_step` batches from it, runs that many SGD steps in one
jitted call, and writes the new priorities back.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax

from trellis.agents.common import (
    STATE_HPARAMS,
    Batch,
    TargetNetworkState,
    importance_weights,
    init_target_network_state,
    make_optimizer,
)
from trellis.agents.common.params import Params
from trellis.agents.dqn.config import DQNConfig
from trellis.agents.dqn.losses import double_q_td_error, weighted_huber_loss
from trellis.agents.dqn.networks import DQNNetworks
from trellis.builders.contract.agent import Training

Metrics = dict[str, jax.Array]


def make_update(
    networks: DQNNetworks, optimizer: optax.GradientTransformation, config: DQNConfig
) -> Callable[[TargetNetworkState, Batch], tuple[TargetNetworkState, Metrics]]:
    """Returns the pure `update(state, batch) -> (state, metrics)`.

    `batch` holds U sampled minibatches, each leaf [U, S, ...]: `obs`, `action`, `reward`
    (the n-step return), `discount`, `next_obs`, and the sampling `probability` and
    `table_size` for the importance weights. One SGD step per minibatch (a scan);
    `metrics["priorities"]` [U, S] are the new priorities, the rest are means.
    """

    def loss_fn(params: Params, target_params: Params, minibatch: Batch
                ) -> tuple[jax.Array, tuple[jax.Array, Metrics]]:
        q_tm1 = networks.apply(params, minibatch["obs"])  # [S, A]
        q_t_online = networks.apply(params, minibatch["next_obs"])  # [S, A]
        q_t_target = networks.apply(target_params, minibatch["next_obs"])  # [S, A]
        td = jax.vmap(double_q_td_error)(q_tm1, minibatch["action"], minibatch["reward"],
                                         minibatch["discount"], q_t_target, q_t_online)
        weights = importance_weights(minibatch["probability"], minibatch["table_size"],
                                     config.importance_exponent)
        loss = weighted_huber_loss(td, weights, config.huber_delta)
        return loss, (td, {"q_mean": jnp.mean(q_tm1), "td_abs": jnp.mean(jnp.abs(td))})

    def sgd_step(state: TargetNetworkState, minibatch: Batch
                 ) -> tuple[TargetNetworkState, tuple[jax.Array, Metrics]]:
        (loss, (td, metrics)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            state.params, state.target_params, minibatch)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        step = state.step + 1
        target_params = optax.periodic_update(params, state.target_params, step,
                                              config.target_update_period)
        key, _ = jax.random.split(state.key)
        metrics = dict(metrics, loss=loss, grad_norm=optax.global_norm(grads))
        priorities = jnp.abs(td) + config.priority_epsilon
        state = TargetNetworkState(params, target_params, opt_state, key, step)
        return state, (priorities, metrics)

    def update(state: TargetNetworkState, batch: Batch) -> tuple[TargetNetworkState, Metrics]:
        state, (priorities, metrics) = jax.lax.scan(sgd_step, state, dict(batch))
        metrics = jax.tree.map(jnp.mean, metrics)
        return state, dict(metrics, priorities=priorities)

    return update


def make_training(networks: DQNNetworks, config: DQNConfig) -> Training:
    """The pure init and update of the DQN learner (`builders.contract.agent.Training`)."""
    optimizer = make_optimizer(config)
    return Training(
        functools.partial(init_target_network_state, networks.init, optimizer),
        lambda mesh: make_update(networks, optimizer, config),
        acting_params,
        STATE_HPARAMS,
    )


def acting_params(state: TargetNetworkState) -> dict[str, Params]:
    """What the acting policy reads: the online params and the SGD step count (for the
    epsilon decay), so the policy needs nothing beyond the usual params argument."""
    return {"q": state.params, "updates": state.step}

