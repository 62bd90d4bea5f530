"""AlphaZero's learning: a pure SGD step on positions sampled from the replay."""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from trellis.agents.alphazero.config import AlphaZeroConfig
from trellis.agents.alphazero.losses import alphazero_loss
from trellis.agents.alphazero.networks import PolicyValueNet
from trellis.agents.common.params import Params, pure_apply
from trellis.agents.common.training import (
    STATE_HPARAMS,
    TrainingState,
    gradient_step,
    init_training_state,
    make_optimizer,
)
from trellis.builders.contract.agent import Training, Update
from trellis.envs.specs import EnvSpec


def make_training(network: PolicyValueNet, spec: EnvSpec, config: AlphaZeroConfig) -> Training:
    """`init(key) -> TrainingState` and `make_update(mesh) -> update(state, batch)`, where the
    batch holds positions: obs [N, ...], policy [N, A], value [N], weight [N]."""
    optimizer = make_optimizer(config)
    example = jnp.zeros((1, *spec.observation_shape), jnp.float32)

    def init(key: jax.Array) -> TrainingState:
        return init_training_state(lambda k: network.init(k, example), optimizer, key)

    def make_update(mesh: Mesh | None) -> Update:
        del mesh  # One program on one device: the self-play loop places it.

        def update(state: TrainingState, batch: Mapping[str, jax.Array]
                   ) -> tuple[TrainingState, dict[str, jax.Array]]:
            def loss_fn(params: Params) -> tuple[jax.Array, dict[str, jax.Array]]:
                logits, value = pure_apply(network)(params, batch["obs"])
                return alphazero_loss(logits, value, batch, config.value_cost)

            return gradient_step(state, loss_fn, optimizer)

        return update

    return Training(init, make_update, hparams=STATE_HPARAMS)
