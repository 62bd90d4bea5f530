"""TD3 learner: unrolls -> transitions -> uniform replay -> jitted TD3 updates.

Like SAC's (agents.common.ReplayLearner): the learner node's unrolls become n-step transitions
in an in-process uniform table, and each learner step runs `updates_per_step` SGD steps in one
jitted call. Each SGD step updates the critics towards the clipped double Q target of the
smoothed target action; every `policy_delay`-th step also updates the policy by the
deterministic policy gradient and moves both target networks by Polyak averaging.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import flax.struct
import jax
import jax.numpy as jnp
import optax

from trellis.agents.common import STATE_HPARAMS, Batch, make_optimizer
from trellis.agents.common.continuous import deterministic_actor_params
from trellis.agents.common.params import Params
from trellis.agents.td3 import losses
from trellis.agents.td3.config import TD3Config
from trellis.agents.td3.networks import TD3Networks
from trellis.builders.contract.agent import Training


@flax.struct.dataclass
class TD3State:
    policy_params: Params
    critic_params: Params
    target_policy_params: Params
    target_critic_params: Params
    policy_opt_state: optax.OptState
    critic_opt_state: optax.OptState
    key: jax.Array
    step: jax.Array  # Critic (SGD) steps taken.


def init_state(networks: TD3Networks, optimizer: optax.GradientTransformation,
               key: jax.Array) -> TD3State:
    """Fresh policy and critics; the targets are copies of them."""
    policy_key, critic_key, state_key = jax.random.split(key, 3)
    policy_params = networks.init_policy(policy_key)
    critic_params = networks.init_critic(critic_key)
    return TD3State(policy_params, critic_params, policy_params, critic_params,
                    optimizer.init(policy_params), optimizer.init(critic_params), state_key,
                    jnp.zeros((), jnp.int32))


Metrics = dict[str, jax.Array]


def make_update(
    networks: TD3Networks, optimizer: optax.GradientTransformation, config: TD3Config
) -> Callable[[TD3State, Batch], tuple[TD3State, Metrics]]:
    """Returns the pure `update(state, batch) -> (state, metrics)`.

    `batch` holds U sampled minibatches, each leaf [U, S, ...]: `obs`, `action`, `reward`
    (the n-step return), `discount` and `next_obs`. One critic step per minibatch (a scan);
    `actor_loss` is the mean over the steps that updated the policy.
    """
    bounds = networks.bounds
    smooth = jax.vmap(losses.smoothed_target_action, in_axes=(0, 0, None, None, None, None, None))

    def critic_loss_fn(critic_params: Params, state: TD3State, key: jax.Array, minibatch: Batch
                       ) -> tuple[jax.Array, jax.Array]:
        next_obs = minibatch["next_obs"]
        a_t = networks.policy(state.target_policy_params, next_obs)  # [S, D]
        keys = jax.random.split(key, a_t.shape[0])
        a_t = smooth(keys, a_t, bounds.scale, config.target_noise, config.target_noise_clip,
                     jnp.asarray(bounds.low), jnp.asarray(bounds.high))
        q_t = networks.critic(state.target_critic_params, next_obs, a_t)  # [S, N]
        target = jax.vmap(losses.td3_target)(minibatch["reward"], minibatch["discount"], q_t)
        q_tm1 = networks.critic(critic_params, minibatch["obs"], minibatch["action"])  # [S, N]
        return jnp.mean(jax.vmap(losses.critic_loss)(q_tm1, target)), jnp.mean(q_tm1)

    def actor_loss_fn(policy_params: Params, critic_params: Params, obs: jax.Array
                      ) -> jax.Array:
        q = networks.critic(critic_params, obs, networks.policy(policy_params, obs))  # [S, N]
        return jnp.mean(jax.vmap(losses.actor_loss)(q[:, 0]))

    def apply(grads: Params, opt_state: optax.OptState, params: Params
              ) -> tuple[Params, optax.OptState]:
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    def policy_and_targets(state: TD3State, obs: jax.Array) -> tuple[TD3State, jax.Array]:
        loss, grads = jax.value_and_grad(actor_loss_fn)(state.policy_params,
                                                        state.critic_params, obs)
        policy_params, policy_opt_state = apply(grads, state.policy_opt_state,
                                                state.policy_params)
        state = dataclasses.replace(
            state, policy_params=policy_params, policy_opt_state=policy_opt_state,
            target_policy_params=optax.incremental_update(
                policy_params, state.target_policy_params, config.tau),
            target_critic_params=optax.incremental_update(
                state.critic_params, state.target_critic_params, config.tau))
        return state, loss

    def sgd_step(state: TD3State, minibatch: Batch) -> tuple[TD3State, Metrics]:
        key, critic_key = jax.random.split(state.key)
        (critic_loss, q_mean), grads = jax.value_and_grad(critic_loss_fn, has_aux=True)(
            state.critic_params, state, critic_key, minibatch)
        critic_params, critic_opt_state = apply(grads, state.critic_opt_state,
                                                state.critic_params)
        state = dataclasses.replace(state, critic_params=critic_params,
                                    critic_opt_state=critic_opt_state, key=key,
                                    step=state.step + 1)
        # The paper's delay counts critic updates: the policy moves after every d-th.
        delayed = state.step % config.policy_delay == 0
        state, actor_loss = jax.lax.cond(
            delayed, policy_and_targets, lambda s, obs: (s, jnp.zeros((), jnp.float32)),
            state, minibatch["obs"])
        return state, {"critic_loss": critic_loss, "actor_loss": actor_loss,
                       "q_mean": q_mean, "policy_updated": delayed.astype(jnp.float32)}

    def update(state: TD3State, batch: Batch) -> tuple[TD3State, Metrics]:
        state, metrics = jax.lax.scan(sgd_step, state, dict(batch))
        updated = metrics.pop("policy_updated")
        actor_loss = jnp.sum(metrics.pop("actor_loss")) / jnp.maximum(jnp.sum(updated), 1.0)
        return state, {**jax.tree.map(jnp.mean, metrics), "actor_loss": actor_loss}

    return update


def make_training(networks: TD3Networks, config: TD3Config) -> Training:
    """The pure init and update of the TD3 learner (`builders.contract.agent.Training`)."""
    optimizer = make_optimizer(config)
    return Training(functools.partial(init_state, networks, optimizer),
                    lambda mesh: make_update(networks, optimizer, config),
                    deterministic_actor_params,
                    STATE_HPARAMS)

