"""DQN/Rainbow learner: unrolls -> n-step transitions -> prioritized replay -> jitted updates.

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
from trellis.agents.dqn.losses import (
    categorical_double_q_loss,
    double_q_td_error,
    weighted_huber_loss,
)
from trellis.agents.dqn.networks import DQNNetworks, expected_q
from trellis.builders.contract.agent import Training

Metrics = dict[str, jax.Array]


def make_update(
    networks: DQNNetworks, optimizer: optax.GradientTransformation, config: DQNConfig
) -> Callable[[TargetNetworkState, Batch], tuple[TargetNetworkState, Metrics]]:
    """Returns the pure `update(state, batch) -> (state, metrics)`.

    `batch` holds U sampled minibatches, each leaf [U, S, ...]: `obs`, `action`, `reward`
    (the n-step return), `discount`, `next_obs`, and the sampling `probability` and
    `table_size` for the importance weights. One SGD step per minibatch (a scan);
    `metrics["priorities"]` [U, S] are the new priorities (|TD error|, or C51's
    cross-entropy, plus priority_epsilon), the rest are means.
    """
    c = config

    def loss_fn(params: Params, target_params: Params, minibatch: Batch, key: jax.Array
                ) -> tuple[jax.Array, tuple[jax.Array, Metrics]]:
        # Noisy nets: independent noise for the online network at each input and for the
        # target network (Hessel et al., 2018); without them the keys go unused.
        keys: list[jax.Array | None] = list(jax.random.split(key, 3)) if c.noisy else [None] * 3
        head_tm1 = networks.apply(params, minibatch["obs"], keys[0])  # [S, A, K]
        head_t_target = networks.apply(target_params, minibatch["next_obs"], keys[1])
        q_tm1 = expected_q(head_tm1, networks.atoms)  # [S, A]
        q_t_target = expected_q(head_t_target, networks.atoms)  # [S, A]
        q_t_selector = (networks.q_values(params, minibatch["next_obs"], keys[2])
                        if c.double_q else q_t_target)  # [S, A]
        weights = importance_weights(minibatch["probability"], minibatch["table_size"],
                                     c.importance_exponent)
        targets = (minibatch["action"], minibatch["reward"], minibatch["discount"])
        if networks.atoms is None:
            td = jax.vmap(double_q_td_error)(q_tm1, *targets, q_t_target, q_t_selector)
            loss = weighted_huber_loss(td, weights, c.huber_delta)
            per_item, metrics = jnp.abs(td), {"td_abs": jnp.mean(jnp.abs(td))}
        else:
            per_item = jax.vmap(categorical_double_q_loss, in_axes=(None, 0, 0, 0, 0, 0, 0))(
                networks.atoms, head_tm1, *targets, head_t_target, q_t_selector)  # [S]
            loss = jnp.mean(jax.lax.stop_gradient(weights) * per_item)
            metrics = {"cross_entropy": jnp.mean(per_item)}
        return loss, (per_item, dict(metrics, q_mean=jnp.mean(q_tm1)))

    def sgd_step(state: TargetNetworkState, minibatch: Batch
                 ) -> tuple[TargetNetworkState, tuple[jax.Array, Metrics]]:
        key, noise_key = jax.random.split(state.key)
        (loss, (per_item, metrics)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            state.params, state.target_params, minibatch, noise_key)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        step = state.step + 1
        target_params = optax.periodic_update(params, state.target_params, step,
                                              c.target_update_period)
        metrics = dict(metrics, loss=loss, grad_norm=optax.global_norm(grads))
        priorities = per_item + c.priority_epsilon
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

