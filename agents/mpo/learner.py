"""MPO learner: unrolls -> n-step transitions -> uniform replay -> jitted MPO updates.

As SAC's and D4PG's (agents.common.ReplayLearner on the host, the device replay on anakin):
each learner step's unrolls become n-step transitions in a uniform table and `updates_per_step`
SGD steps run in one jitted call. Each step draws `num_samples` actions from the target policy
at every transition's bootstrap observation, as Acme's TF MPO learner does: the target critic's
values of them give both the critic's n-step target (their mean) and the E-step's weights, so
one set of samples serves both. The critic is updated, then the policy and the Lagrange
multipliers together (each with its own Adam), then the targets.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import flax.struct
import jax
import jax.numpy as jnp
import optax

from trellis.agents.common import STATE_HPARAMS, Batch, make_optimizer
from trellis.agents.common.continuous import actor_params
from trellis.agents.common.params import Params
from trellis.agents.mpo import losses
from trellis.agents.mpo.config import MPOConfig
from trellis.agents.mpo.networks import MPONetworks
from trellis.builders.contract.agent import Training

# Acme clips the raw multipliers from below after each update: softplus(-18) ~ 1.5e-8, so a
# multiplier that the dual drives to 0 can still come back within a few Adam steps.
_MIN_RAW_DUAL = -18.0


@flax.struct.dataclass
class MPOState:
    policy_params: Params
    critic_params: Params
    target_policy_params: Params
    target_critic_params: Params
    duals: losses.Duals  # Raw (pre-softplus) multipliers.
    policy_opt_state: optax.OptState
    critic_opt_state: optax.OptState
    dual_opt_state: optax.OptState
    key: jax.Array
    step: jax.Array  # SGD steps taken.


def inverse_softplus(x: float) -> float:
    """The raw value whose softplus is `x` (x > 0): log(exp(x) - 1), written
    x + log(1 - exp(-x)) so that it stays finite for large x (Acme's 1,000)."""
    return x + math.log(-math.expm1(-x))


def init_duals(config: MPOConfig, action_dim: int) -> losses.Duals:
    """The multipliers at the config's first values; the KL ones one per action dimension
    (Acme's per_dim_constraining)."""
    def raw(value: float, shape: tuple[int, ...] = ()) -> jax.Array:
        return jnp.full(shape, inverse_softplus(value), jnp.float32)

    return losses.Duals(raw(config.init_temperature),
                        raw(config.init_alpha_mean, (action_dim,)),
                        raw(config.init_alpha_stddev, (action_dim,)),
                        raw(config.init_temperature))


def init_state(networks: MPONetworks, optimizer: optax.GradientTransformation,
               dual_optimizer: optax.GradientTransformation, config: MPOConfig,
               key: jax.Array) -> MPOState:
    """Fresh policy and critic, the targets copies of them, the multipliers at their first
    values."""
    policy_key, critic_key, state_key = jax.random.split(key, 3)
    policy_params = networks.init_policy(policy_key)
    critic_params = networks.init_critic(critic_key)
    duals = init_duals(config, networks.action_dim)
    return MPOState(policy_params, critic_params, policy_params, critic_params, duals,
                    optimizer.init(policy_params), optimizer.init(critic_params),
                    dual_optimizer.init(duals), state_key, jnp.zeros((), jnp.int32))


def make_dual_optimizer(config: MPOConfig) -> optax.GradientTransformation:
    """Adam on the raw multipliers at `dual_learning_rate`, unclipped (as Acme's)."""
    return optax.adam(config.dual_learning_rate)


Metrics = dict[str, jax.Array]


def update_targets(config: MPOConfig, step: jax.Array, online: Params,
                   target: Params) -> Params:
    """The target networks after SGD step `step` (counted from 1): a copy of the online ones
    every `target_update_period` steps, else unchanged; Polyak averaging by `tau` when the
    period is 0."""
    if config.target_update_period == 0:
        return optax.incremental_update(online, target, config.tau)
    copy = step % config.target_update_period == 0
    return jax.tree.map(lambda o, t: jnp.where(copy, o, t), online, target)


def make_update(
    networks: MPONetworks, optimizer: optax.GradientTransformation,
    dual_optimizer: optax.GradientTransformation, config: MPOConfig
) -> Callable[[MPOState, Batch], tuple[MPOState, Metrics]]:
    """Returns the pure `update(state, batch) -> (state, metrics)`.

    `batch` holds U sampled minibatches, each leaf [U, S, ...]: `obs`, `action` (in the env's
    units), `reward` (the n-step return), `discount` and `next_obs`; other fields are ignored.
    One SGD step per minibatch (a scan); the metrics are means over them.
    """
    epsilons = losses.Epsilons(config.epsilon, config.epsilon_mean, config.epsilon_stddev,
                               config.epsilon_penalty)

    def critic_loss_fn(critic_params: Params, minibatch: Batch, q_t: jax.Array
                       ) -> tuple[jax.Array, jax.Array]:
        target = losses.critic_target(minibatch["reward"], minibatch["discount"], q_t)
        q_tm1 = networks.critic(critic_params, minibatch["obs"], minibatch["action"])  # [S]
        return 0.5 * jnp.mean(jnp.square(q_tm1 - target)), jnp.mean(q_tm1)

    def policy_loss_fn(policy_params: Params, duals: losses.Duals, obs: jax.Array,
                       actions: jax.Array, q: jax.Array, target_mean: jax.Array,
                       target_std: jax.Array) -> tuple[jax.Array, Metrics]:
        mean, std = networks.policy(policy_params, obs)
        return losses.policy_loss(actions, q, mean, std, target_mean, target_std, duals,
                                  epsilons, config.action_penalization)

    def apply(opt: optax.GradientTransformation, grads: Params, opt_state: optax.OptState,
              params: Params) -> tuple[Params, optax.OptState]:
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    def sgd_step(state: MPOState, minibatch: Batch) -> tuple[MPOState, Metrics]:
        key, sample_key = jax.random.split(state.key)
        next_obs = minibatch["next_obs"]
        target_mean, target_std = networks.policy(state.target_policy_params, next_obs)
        noise = jax.random.normal(sample_key, (config.num_samples,) + target_mean.shape)
        actions = target_mean + target_std * noise  # [N, S, D]
        tiled_obs = jnp.broadcast_to(next_obs, (config.num_samples,) + next_obs.shape)
        q_t = networks.critic(state.target_critic_params, tiled_obs,
                              networks.to_env(actions))  # [N, S]
        (critic_loss, q_mean), grads = jax.value_and_grad(critic_loss_fn, has_aux=True)(
            state.critic_params, minibatch, q_t)
        critic_params, critic_opt_state = apply(optimizer, grads, state.critic_opt_state,
                                                state.critic_params)
        (loss, metrics), (policy_grads, dual_grads) = jax.value_and_grad(
            policy_loss_fn, argnums=(0, 1), has_aux=True)(
                state.policy_params, state.duals, next_obs, actions, q_t, target_mean,
                target_std)
        policy_params, policy_opt_state = apply(optimizer, policy_grads,
                                                state.policy_opt_state, state.policy_params)
        duals, dual_opt_state = apply(dual_optimizer, dual_grads, state.dual_opt_state,
                                      state.duals)
        duals = jax.tree.map(lambda d: jnp.maximum(d, _MIN_RAW_DUAL), duals)
        step = state.step + 1
        state = MPOState(
            policy_params, critic_params,
            update_targets(config, step, policy_params, state.target_policy_params),
            update_targets(config, step, critic_params, state.target_critic_params),
            duals, policy_opt_state, critic_opt_state, dual_opt_state, key, step)
        return state, dict(metrics, critic_loss=critic_loss, q_mean=q_mean, loss=loss)

    def update(state: MPOState, batch: Batch) -> tuple[MPOState, Metrics]:
        state, metrics = jax.lax.scan(sgd_step, state, dict(batch))
        return state, jax.tree.map(jnp.mean, metrics)

    return update


def make_training(networks: MPONetworks, config: MPOConfig) -> Training:
    """The pure init and update of the MPO learner (`builders.contract.agent.Training`)."""
    optimizer = make_optimizer(config)
    dual_optimizer = make_dual_optimizer(config)
    return Training(
        functools.partial(init_state, networks, optimizer, dual_optimizer, config),
        lambda mesh: make_update(networks, optimizer, dual_optimizer, config),
        actor_params,
        STATE_HPARAMS,
    )
