"""D4PG learner: unrolls -> N-step transitions -> replay -> jitted distributional updates.

Like the other replay agents' (agents.common.ReplayLearner): the learner node's unrolls from
every env worker (Ape-X-style distributed acting through central inference) become N-step
transitions in one in-process table, uniform or prioritized, and each learner step runs
`updates_per_step` SGD steps in one jitted call. Each step updates the categorical critic, then
the policy against it, then moves both target networks by Polyak averaging.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import flax.struct
import jax
import jax.numpy as jnp
import optax

from trellis.agents.common import STATE_HPARAMS, Batch, importance_weights, make_optimizer
from trellis.agents.common.continuous import deterministic_actor_params
from trellis.agents.common.params import Params
from trellis.agents.d4pg import losses
from trellis.agents.d4pg.config import D4PGConfig
from trellis.agents.d4pg.networks import D4PGNetworks
from trellis.builders.contract.agent import Training


@flax.struct.dataclass
class D4PGState:
    policy_params: Params
    critic_params: Params
    target_policy_params: Params
    target_critic_params: Params
    policy_opt_state: optax.OptState
    critic_opt_state: optax.OptState
    step: jax.Array  # SGD steps taken; the update draws no random numbers.


def init_state(networks: D4PGNetworks, optimizer: optax.GradientTransformation,
               key: jax.Array) -> D4PGState:
    """Fresh policy and critic; the targets are copies of them."""
    policy_key, critic_key = jax.random.split(key)
    policy_params = networks.init_policy(policy_key)
    critic_params = networks.init_critic(critic_key)
    return D4PGState(policy_params, critic_params, policy_params, critic_params,
                     optimizer.init(policy_params), optimizer.init(critic_params),
                     jnp.zeros((), jnp.int32))


Metrics = dict[str, jax.Array]


def make_update(
    networks: D4PGNetworks, optimizer: optax.GradientTransformation, config: D4PGConfig
) -> Callable[[D4PGState, Batch], tuple[D4PGState, Metrics]]:
    """Returns the pure `update(state, batch) -> (state, metrics)`.

    `batch` holds U sampled minibatches, each leaf [U, S, ...]: `obs`, `action`, `reward`
    (the N-step return), `discount`, `next_obs`, and, prioritized, the sampling `probability`
    and `table_size`. One SGD step per minibatch (a scan); prioritized, `metrics["priorities"]`
    [U, S] are each sample's cross-entropy plus `priority_epsilon`.
    """
    atoms = networks.atoms
    td = jax.vmap(losses.critic_loss, in_axes=(None, 0, 0, 0, 0))

    def critic_loss_fn(critic_params: Params, state: D4PGState, minibatch: Batch
                       ) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
        next_obs = minibatch["next_obs"]
        a_t = networks.policy(state.target_policy_params, next_obs)  # [S, D]
        logits_t = networks.critic(state.target_critic_params, next_obs, a_t)  # [S, K]
        logits_tm1 = networks.critic(critic_params, minibatch["obs"], minibatch["action"])
        loss = td(atoms, logits_tm1, minibatch["reward"], minibatch["discount"], logits_t)  # [S]
        q_mean = jnp.mean(jnp.sum(jax.nn.softmax(logits_tm1) * atoms, axis=-1))
        if config.prioritized:
            weights = importance_weights(minibatch["probability"], minibatch["table_size"],
                                         config.importance_exponent)
            return jnp.mean(weights * loss), (loss, q_mean)
        return jnp.mean(loss), (loss, q_mean)

    def actor_loss_fn(policy_params: Params, critic_params: Params, obs: jax.Array
                      ) -> jax.Array:
        logits = networks.critic(critic_params, obs, networks.policy(policy_params, obs))
        return jnp.mean(jax.vmap(losses.actor_loss, in_axes=(None, 0))(atoms, logits))

    def apply(grads: Params, opt_state: optax.OptState, params: Params
              ) -> tuple[Params, optax.OptState]:
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    def sgd_step(state: D4PGState, minibatch: Batch
                 ) -> tuple[D4PGState, tuple[jax.Array, Metrics]]:
        (critic_loss, (per_sample, q_mean)), grads = jax.value_and_grad(
            critic_loss_fn, has_aux=True)(state.critic_params, state, minibatch)
        critic_params, critic_opt_state = apply(grads, state.critic_opt_state,
                                                state.critic_params)
        actor_loss, grads = jax.value_and_grad(actor_loss_fn)(state.policy_params,
                                                              critic_params, minibatch["obs"])
        policy_params, policy_opt_state = apply(grads, state.policy_opt_state,
                                                state.policy_params)
        state = D4PGState(
            policy_params, critic_params,
            optax.incremental_update(policy_params, state.target_policy_params, config.tau),
            optax.incremental_update(critic_params, state.target_critic_params, config.tau),
            policy_opt_state, critic_opt_state, state.step + 1)
        metrics = {"critic_loss": critic_loss, "actor_loss": actor_loss, "q_mean": q_mean}
        return state, (per_sample + config.priority_epsilon, metrics)

    def update(state: D4PGState, batch: Batch) -> tuple[D4PGState, Metrics]:
        state, (priorities, metrics) = jax.lax.scan(sgd_step, state, dict(batch))
        metrics = jax.tree.map(jnp.mean, metrics)
        return state, dict(metrics, priorities=priorities) if config.prioritized else metrics

    return update


def make_training(networks: D4PGNetworks, config: D4PGConfig) -> Training:
    """The pure init and update of the D4PG learner (`builders.contract.agent.Training`)."""
    optimizer = make_optimizer(config)
    return Training(functools.partial(init_state, networks, optimizer),
                    lambda mesh: make_update(networks, optimizer, config),
                    deterministic_actor_params,
                    STATE_HPARAMS)

