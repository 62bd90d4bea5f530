"""IMPALA learner: a pure, jitted update and a thin host shell that runs it data-parallel."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax

from trellis.agents.common import (
    STATE_HPARAMS,
    Batch,
    TrainingState,
    init_training_state,
    make_optimizer,
)
from trellis.agents.common.normalization import keep_moments, observe
from trellis.agents.common.params import Params
from trellis.agents.impala.config import ImpalaConfig
from trellis.agents.impala.losses import impala_loss
from trellis.agents.impala.networks import ImpalaNetworks
from trellis.builders.contract.agent import Training, recorded_state


def make_update(
    networks: ImpalaNetworks, optimizer: optax.GradientTransformation, config: ImpalaConfig
) -> Callable[[TrainingState, Batch], tuple[TrainingState, dict[str, jax.Array]]]:
    """Returns the pure `update(state, batch) -> (state, metrics)`.

    The batch holds what the inference server recorded per step: `obs`, `first`, `reward`,
    `terminated` (describing how each observation was reached), and the `action` and
    behaviour `logits` chosen at it; with a recurrent core also the state the actor had at
    the first step (`state/c`, `state/h`), from which the network unrolls over [T + 1, B].
    With observation normalization the params hold the running moments ("obs_norm"): each
    update merges the batch's observations into them before the loss.
    """
    loss_fn = functools.partial(
        impala_loss,
        baseline_cost=config.baseline_cost,
        lambda_=config.vtrace_lambda,
        clip_rho_threshold=config.clip_rho_threshold,
        clip_pg_rho_threshold=config.clip_pg_rho_threshold,
    )

    def batch_loss(params: Params, batch: Batch, entropy_cost: jax.Array
                   ) -> tuple[jax.Array, dict[str, jax.Array]]:
        logits, values, _ = networks.apply(  # [T+1, B, A], [T+1, B]
            params, batch["obs"], batch["first"], recorded_state(batch))
        discounts = config.discount * (1.0 - batch["terminated"][1:].astype(jnp.float32))
        mask = 1.0 - batch["first"][1:].astype(jnp.float32)  # [T, B]
        rewards = batch["reward"][1:]  # [T, B]; clipped here, so returns are reported unclipped.
        if config.reward_clip is not None:
            rewards = jnp.clip(rewards, -config.reward_clip, config.reward_clip)
        if config.center_rewards:  # The mean of the transitions learned from (mask 1).
            rewards = rewards - jnp.sum(rewards * mask) / jnp.maximum(mask.sum(), 1.0)
        losses, metrics = jax.vmap(functools.partial(loss_fn, entropy_cost=entropy_cost),
                                   in_axes=1)(
            logits,
            values,
            batch["action"][:-1],
            batch["logits"][:-1],
            rewards,
            discounts,
            mask,
        )
        return jnp.mean(losses), jax.tree.map(jnp.mean, metrics)

    def update(state: TrainingState, batch: Batch) -> tuple[TrainingState, dict[str, jax.Array]]:
        # Step 0 repeats the previous unroll's last step: its observation is merged already.
        params = observe(state.params, batch["obs"][1:])
        (loss, metrics), grads = jax.value_and_grad(batch_loss, has_aux=True)(
            params, batch, state.hparams["entropy_cost"]
        )
        updates, opt_state = optimizer.update(grads, state.opt_state, params)
        stepped: Params = optax.apply_updates(params, updates)
        new_params = keep_moments(stepped, params)
        key, _ = jax.random.split(state.key)
        metrics = dict(metrics, loss=loss, grad_norm=optax.global_norm(grads))
        return dataclasses.replace(state, params=new_params, opt_state=opt_state, key=key,
                                   step=state.step + 1), metrics

    return update


def make_training(networks: ImpalaNetworks, config: ImpalaConfig) -> Training:
    """The pure init and update of the IMPALA learner (`builders.contract.agent.Training`)."""
    optimizer = make_optimizer(config)
    return Training(
        functools.partial(init_training_state, networks.init, optimizer,
                          hparams={"entropy_cost": config.entropy_cost}),
        lambda mesh: make_update(networks, optimizer, config),
        hparams=STATE_HPARAMS,
    )

