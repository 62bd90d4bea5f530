"""PPO learner: a pure, jitted update (GAE, then epochs of minibatch SGD) and a thin host
shell that runs it data-parallel."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from trellis.agents.common import (
    STATE_HPARAMS,
    Batch,
    TrainingState,
    init_training_state,
    make_optimizer,
)
from trellis.agents.common.normalization import keep_moments, observe
from trellis.agents.common.params import Params
from trellis.agents.common.vtrace import vtrace
from trellis.agents.ppo.config import PPOConfig
from trellis.agents.ppo.losses import (
    generalized_advantage_estimation,
    ppo_loss,
    transition_discounts,
)
from trellis.agents.ppo.networks import PPONetworks
from trellis.builders.contract.agent import Training

Metrics = dict[str, jax.Array]
# An SGD step's carry: the params and the optimizer's state.
Carry = tuple[Params, optax.OptState]


def make_transitions(networks: PPONetworks, config: PPOConfig, batch: Batch,
                     params: Params = None) -> dict[str, jax.Array]:
    """Flat transitions [T * B, ...] with their advantages and value targets.

    With GAE (PPO), advantages use the values recorded when acting (the behaviour policy's
    critic, as in the PPO paper's rollouts). With V-trace (APPO), they use `params`' values
    and the importance weights pi(a|x) / mu(a|x) of `params`' policy pi against the one that
    acted, mu: the correction for data that lags the learner. Either way once per batch,
    before any SGD step.

    Args:
      networks: the networks, and the distribution's `learn_field` (which batch field holds
        the action that `log_prob` was recorded for).
      config: discount, lambda, reward scale, which advantages.
      batch: what the inference server recorded per step, time-major [T + 1, B, ...]:
        `obs`, `first`, `reward`, `terminated`, `truncated` (how each observation was
        reached), the action and the extras `log_prob` and `value` of the policy there.
      params: the learner's params (V-trace only).
    """
    discount_t, lambda_t, mask = jax.vmap(
        functools.partial(transition_discounts, discount=config.discount,
                          lambda_=config.gae_lambda),
        in_axes=1, out_axes=1,
    )(batch["first"][1:], batch["terminated"][1:], batch["truncated"][1:])  # [T, B] each
    reward_t = batch["reward"][1:].astype(jnp.float32)  # [T, B]
    if config.reward_clip is not None:  # Here, so the returns are reported unclipped.
        reward_t = jnp.clip(reward_t, -config.reward_clip, config.reward_clip)
    reward_t = reward_t * config.reward_scale
    action = batch[networks.distribution.learn_field][:-1]
    if config.advantages == "vtrace":
        dist_params, values = networks.apply(params, batch["obs"])  # [T+1, B, ...], [T+1, B]
        log_rho = networks.distribution.log_prob(
            jax.tree.map(lambda x: x[:-1], dist_params), action) - batch["log_prob"][:-1]
        rho = jnp.exp(log_rho) * mask  # A weight of 0 drops the autoreset transition.
        out = jax.vmap(functools.partial(
            vtrace, lambda_=config.gae_lambda, clip_rho_threshold=config.vtrace_clip_rho,
            clip_pg_rho_threshold=config.vtrace_clip_rho), in_axes=1, out_axes=1)(
            values[:-1], values[1:], reward_t, discount_t, rho)
        values = jax.lax.stop_gradient(values)
        advantages, returns = out.pg_advantage * mask, out.errors + values[:-1]
    else:
        values = batch["value"].astype(jnp.float32)  # [T+1, B]
        advantages = jax.vmap(generalized_advantage_estimation, in_axes=1, out_axes=1)(
            reward_t, discount_t, lambda_t, values) * mask  # [T, B]
        returns = advantages + values[:-1]
    transitions = {
        "obs": batch["obs"][:-1],
        "action": action,
        "behaviour_log_prob": batch["log_prob"][:-1],
        "behaviour_value": values[:-1],
        "advantage": advantages,
        "return": returns,
        "mask": mask,
    }
    flat: dict[str, jax.Array] = jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]),
                                              transitions)
    return flat


def random_order(key: jax.Array, n: int) -> jax.Array:
    """A random permutation of range(n), from one sort of uint32 keys that hold random bits
    above each index's bits.

    `jax.random.permutation` sorts two operands with a comparator, which on a CPU core took
    4.3x as long for 32 members' permutations of 256 (0.86 against 0.20 ms; on 2 cores that
    sort was 45% of a 64-member population's PPO update). Indices whose random bits tie keep
    their order: with n = 256 the 24 random bits tie somewhere in 0.2% of the draws.
    """
    width = max(1, (n - 1).bit_length())
    if width > 16:  # Fewer than 16 random bits would tie often: the exact, slower sort.
        return jax.random.permutation(key, n)
    keys = (jax.random.bits(key, (n,), jnp.uint32) << width) | jnp.arange(n, dtype=jnp.uint32)
    return (jnp.sort(keys) & ((1 << width) - 1)).astype(jnp.int32)


def make_update(
    networks: PPONetworks,
    optimizer: optax.GradientTransformation,
    config: PPOConfig,
    mesh: Mesh | None = None,
) -> Callable[[TrainingState, Batch], tuple[TrainingState, Metrics]]:
    """Returns the pure `update(state, batch) -> (state, metrics)`.

    One update is PPO's whole optimisation phase on one batch of unrolls: GAE, then
    `num_epochs` passes over a fresh permutation of the T * B transitions in
    `num_minibatches` minibatches, one Adam step each. Metrics are means over those steps.

    Args:
      networks, optimizer, config: the agent's.
      mesh: when given, each minibatch is sharded over its "data" axis, so the SGD steps run
        data-parallel after the (global) shuffle; the math is the same with any device count.

    Raises:
      ValueError: a minibatch does not divide over the mesh's devices.
    """
    if mesh is not None and config.minibatch_size % mesh.size:
        raise ValueError(
            f"PPO minibatches of {config.minibatch_size} transitions (unroll_length * "
            f"batch_size / num_minibatches) must divide over the {mesh.size} learner "
            "devices; change num_minibatches or batch_size.")
    loss_fn = functools.partial(
        ppo_loss,
        clip_epsilon=config.clip_epsilon,
        value_cost=config.value_cost,
        value_clip_epsilon=config.value_clip_epsilon,
        normalize_advantages=config.normalize_advantages,
    )
    distribution = networks.distribution
    num_minibatches, num_transitions = config.num_minibatches, config.num_transitions

    def minibatch_loss(params: Params, mb: dict[str, jax.Array], entropy_cost: jax.Array
                       ) -> tuple[jax.Array, Metrics]:
        dist_params, values = networks.apply(params, mb["obs"])  # [N, ...], [N]
        return loss_fn(
            distribution.log_prob(dist_params, mb["action"]),
            mb["behaviour_log_prob"],
            distribution.entropy(dist_params),
            values,
            mb["behaviour_value"],
            mb["advantage"],
            mb["return"],
            mb["mask"],
            entropy_cost=entropy_cost,
        )

    def sgd_step(entropy_cost: jax.Array, carry: Carry, mb: dict[str, jax.Array]
                 ) -> tuple[Carry, Metrics]:
        params, opt_state = carry
        (loss, metrics), grads = jax.value_and_grad(minibatch_loss, has_aux=True)(
            params, mb, entropy_cost)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        stepped: Params = optax.apply_updates(params, updates)
        params = keep_moments(stepped, params)
        return (params, opt_state), dict(metrics, loss=loss, grad_norm=optax.global_norm(grads))

    def shard(x: jax.Array) -> jax.Array:
        if mesh is None:
            return x
        spec = PartitionSpec(None, "data")  # [M, N / M, ...]: each minibatch split.
        sharded: jax.Array = jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))
        return sharded

    def epoch(transitions: dict[str, jax.Array], entropy_cost: jax.Array, carry: Carry,
              key: jax.Array) -> tuple[Carry, Metrics]:
        if num_minibatches > 1:  # One minibatch is the whole batch in any order: no sort.
            order = random_order(key, num_transitions)
            transitions = jax.tree.map(lambda x: x[order], transitions)
        minibatches = jax.tree.map(
            lambda x: shard(x.reshape((num_minibatches, -1) + x.shape[1:])), transitions)
        return jax.lax.scan(functools.partial(sgd_step, entropy_cost), carry, minibatches)

    def update(state: TrainingState, batch: Batch) -> tuple[TrainingState, Metrics]:
        keys = jax.random.split(state.key, config.num_epochs + 1)
        # Step 0 repeats the previous unroll's last step: its observation is merged already.
        params = observe(state.params, batch["obs"][1:])
        transitions = make_transitions(networks, config, batch, params)
        (params, opt_state), metrics = jax.lax.scan(
            functools.partial(epoch, transitions, state.hparams["entropy_cost"]),
            (params, state.opt_state), keys[1:]
        )
        metrics = jax.tree.map(jnp.mean, metrics)
        return dataclasses.replace(state, params=params, opt_state=opt_state, key=keys[0],
                                   step=state.step + 1), metrics

    return update


def make_training(networks: PPONetworks, config: PPOConfig) -> Training:
    """The pure init and update of the PPO learner (`builders.contract.agent.Training`)."""
    optimizer = make_optimizer(config)
    return Training(
        functools.partial(init_training_state, networks.init, optimizer,
                          hparams={"entropy_cost": config.entropy_cost}),
        lambda mesh: make_update(networks, optimizer, config, mesh),
        hparams=STATE_HPARAMS,
    )

