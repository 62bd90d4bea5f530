"""MuZero's learning: a pure SGD step that unrolls the model K moves from sampled positions."""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from trellis.agents.common.params import Params, pure_apply
from trellis.agents.common.training import (
    STATE_HPARAMS,
    TrainingState,
    gradient_step,
    init_training_state,
    make_optimizer,
)
from trellis.agents.muzero.config import MuZeroConfig
from trellis.agents.muzero.losses import muzero_loss, scale_gradient
from trellis.agents.muzero.networks import MuZeroNet
from trellis.builders.contract.agent import Training, Update
from trellis.envs.specs import EnvSpec

# unroll(params, obs [N, ...], actions [N, K]) -> (logits [N, K + 1, A], value [N, K + 1],
# reward [N, K]).
Predictions = tuple[jax.Array, jax.Array, jax.Array]


def unroll_model(network: MuZeroNet, config: MuZeroConfig, params: Params, obs: jax.Array,
                 actions: jax.Array) -> Predictions:
    """The model's predictions along `actions` from `obs` (the pseudocode's
    `update_weights`): each step's gradient scaled by 1 / K, the latent's by
    `dynamics_grad_scale` where it enters the dynamics."""
    latent, logits, value = pure_apply(network)(params, obs, method=MuZeroNet.initial_inference)
    steps = actions.shape[1]

    def step(latent: jax.Array, action: jax.Array
             ) -> tuple[jax.Array, tuple[jax.Array, jax.Array, jax.Array]]:
        latent = scale_gradient(latent, config.dynamics_grad_scale)
        latent, reward, logits, value = pure_apply(network)(
            params, latent, action, method=MuZeroNet.recurrent_inference)
        share = 1.0 / steps
        return latent, (scale_gradient(logits, share), scale_gradient(value, share),
                        scale_gradient(reward, share))

    _, (logits_k, value_k, reward_k) = jax.lax.scan(step, latent, actions.T)  # [K, N, ...]
    return (jnp.concatenate([logits[:, None], jnp.moveaxis(logits_k, 0, 1)], axis=1),
            jnp.concatenate([value[:, None], value_k.T], axis=1), reward_k.T)


def make_training(network: MuZeroNet, spec: EnvSpec, config: MuZeroConfig) -> Training:
    """`init(key) -> TrainingState` and `make_update(mesh) -> update(state, batch)`, where the
    batch holds positions: obs [N, ...] and `losses.unroll_targets`' fields, rows [N]."""
    optimizer = make_optimizer(config)
    example = jnp.zeros((1, *spec.observation_shape), jnp.float32)

    def init(key: jax.Array) -> TrainingState:
        return init_training_state(
            lambda k: network.init(k, example, jnp.zeros((1,), jnp.int32)), optimizer, key)

    def make_update(mesh: Mesh | None) -> Update:
        del mesh  # One program on one device: the self-play loop places it.

        def update(state: TrainingState, batch: Mapping[str, jax.Array]
                   ) -> tuple[TrainingState, dict[str, jax.Array]]:
            def loss_fn(params: Params) -> tuple[jax.Array, dict[str, jax.Array]]:
                logits, value, reward = unroll_model(network, config, params, batch["obs"],
                                                     batch["action"])
                return muzero_loss(logits, value, reward, batch, config.value_cost,
                                   config.reward_cost)

            return gradient_step(state, loss_fn, optimizer)

        return update

    return Training(init, make_update, hparams=STATE_HPARAMS)
