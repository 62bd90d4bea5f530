"""SAC learner: unrolls -> transitions -> uniform replay -> jitted soft actor-critic updates.

The learner node hands every learner a batch of unrolls [T + 1, B] from central inference.
SAC is off-policy, so its host shell (agents.common.ReplayLearner, shared with DQN) inserts
their n-step transitions into an in-process uniform table, samples `updates_per_step`
minibatches and runs that many SGD steps in one jitted call. Each SGD step updates the twin
critics, then the policy, then the temperature, then moves the target critics towards the
online ones.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import flax.struct
import jax
import jax.numpy as jnp
import optax

from trellis.agents.common import STATE_HPARAMS, Batch, make_optimizer
from trellis.agents.common.continuous import actor_params
from trellis.agents.common.params import Params
from trellis.agents.sac import losses
from trellis.agents.sac.config import SACConfig
from trellis.agents.sac.networks import SACNetworks
from trellis.builders.contract.agent import Training


@flax.struct.dataclass
class SACState:
    policy_params: Params
    critic_params: Params  # Both critics.
    target_critic_params: Params
    log_alpha: jax.Array
    policy_opt_state: optax.OptState
    critic_opt_state: optax.OptState
    temperature_opt_state: optax.OptState
    key: jax.Array
    step: jax.Array  # SGD steps taken.


def init_state(networks: SACNetworks, optimizer: optax.GradientTransformation,
               initial_temperature: float, key: jax.Array) -> SACState:
    """Fresh policy and critics, the target critics a copy of the online ones."""
    policy_key, critic_key, state_key = jax.random.split(key, 3)
    policy_params = networks.init_policy(policy_key)
    critic_params = networks.init_critic(critic_key)
    log_alpha = jnp.log(jnp.asarray(initial_temperature, jnp.float32))
    return SACState(policy_params, critic_params, critic_params, log_alpha,
                    optimizer.init(policy_params), optimizer.init(critic_params),
                    optimizer.init(log_alpha), state_key, jnp.zeros((), jnp.int32))


def target_entropy(config: SACConfig, action_dim: int) -> float:
    """The config's target entropy, or the paper's -action_dim when unset."""
    return -float(action_dim) if config.target_entropy is None else config.target_entropy


Metrics = dict[str, jax.Array]


def make_update(
    networks: SACNetworks, optimizer: optax.GradientTransformation, config: SACConfig
) -> Callable[[SACState, Batch], tuple[SACState, Metrics]]:
    """Returns the pure `update(state, batch) -> (state, metrics)`.

    `batch` holds U sampled minibatches, each leaf [U, S, ...]: `obs`, `action`, `reward`
    (the n-step return), `discount` and `next_obs`; other fields are ignored. One SGD step
    per minibatch (a scan); the metrics are means over them.
    """
    dist = networks.distribution
    entropy_target = target_entropy(config, networks.action_dim)

    def critic_loss_fn(critic_params: Params, state: SACState, alpha: jax.Array, key: jax.Array,
                       minibatch: Batch) -> tuple[jax.Array, jax.Array]:
        mean_t, log_std_t = networks.policy(state.policy_params, minibatch["next_obs"])
        a_t, log_prob_t = dist.sample(key, mean_t, log_std_t)  # [S, D], [S]
        q_t = networks.critic(state.target_critic_params, minibatch["next_obs"], a_t)  # [S, 2]
        target = jax.vmap(losses.soft_q_target, in_axes=(0, 0, 0, 0, None))(
            minibatch["reward"], minibatch["discount"], q_t, log_prob_t, alpha)  # [S]
        q_tm1 = networks.critic(critic_params, minibatch["obs"], minibatch["action"])  # [S, 2]
        loss = jnp.mean(jax.vmap(losses.critic_loss)(q_tm1, target))
        return loss, jnp.mean(q_tm1)

    def actor_loss_fn(policy_params: Params, critic_params: Params, alpha: jax.Array,
                      key: jax.Array, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        mean, log_std = networks.policy(policy_params, obs)
        action, log_prob = dist.sample(key, mean, log_std)  # [S, D], [S]
        q = networks.critic(critic_params, obs, action)  # [S, 2]
        loss = jnp.mean(jax.vmap(losses.actor_loss, in_axes=(0, 0, None))(q, log_prob, alpha))
        return loss, log_prob

    def temperature_loss_fn(log_alpha: jax.Array, log_prob: jax.Array) -> jax.Array:
        return jnp.mean(jax.vmap(losses.temperature_loss, in_axes=(None, 0, None))(
            log_alpha, log_prob, entropy_target))

    def apply(grads: Params, opt_state: optax.OptState, params: Params
              ) -> tuple[Params, optax.OptState]:
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    def sgd_step(state: SACState, minibatch: Batch) -> tuple[SACState, Metrics]:
        key, critic_key, actor_key = jax.random.split(state.key, 3)
        alpha = jnp.exp(state.log_alpha)
        (critic_loss, q_mean), grads = jax.value_and_grad(critic_loss_fn, has_aux=True)(
            state.critic_params, state, alpha, critic_key, minibatch)
        critic_params, critic_opt_state = apply(grads, state.critic_opt_state,
                                                state.critic_params)
        (actor_loss, log_prob), grads = jax.value_and_grad(actor_loss_fn, has_aux=True)(
            state.policy_params, critic_params, alpha, actor_key, minibatch["obs"])
        policy_params, policy_opt_state = apply(grads, state.policy_opt_state,
                                                state.policy_params)
        temperature_loss, grad = jax.value_and_grad(temperature_loss_fn)(state.log_alpha,
                                                                         log_prob)
        log_alpha, temperature_opt_state = apply(grad, state.temperature_opt_state,
                                                 state.log_alpha)
        target_critic_params = optax.incremental_update(critic_params,
                                                        state.target_critic_params, config.tau)
        metrics = {"critic_loss": critic_loss, "actor_loss": actor_loss,
                   "temperature_loss": temperature_loss, "alpha": alpha, "q_mean": q_mean,
                   "entropy": -jnp.mean(log_prob)}
        state = SACState(policy_params, critic_params, target_critic_params, log_alpha,
                         policy_opt_state, critic_opt_state, temperature_opt_state, key,
                         state.step + 1)
        return state, metrics

    def update(state: SACState, batch: Batch) -> tuple[SACState, Metrics]:
        state, metrics = jax.lax.scan(sgd_step, state, dict(batch))
        return state, jax.tree.map(jnp.mean, metrics)

    return update


def make_training(networks: SACNetworks, config: SACConfig) -> Training:
    """The pure init and update of the SAC learner (`builders.contract.agent.Training`)."""
    optimizer = make_optimizer(config)
    return Training(
        functools.partial(init_state, networks, optimizer, config.initial_temperature),
        lambda mesh: make_update(networks, optimizer, config),
        actor_params,
        STATE_HPARAMS,
    )

