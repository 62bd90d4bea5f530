"""IMPALA learner: a pure, jitted update and a thin host shell that runs it data-parallel."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from agents.impala.config import ImpalaConfig
from agents.impala.losses import impala_loss
from agents.impala.networks import ImpalaNetworks

Batch = Mapping[str, jax.Array]  # Unrolls, time-major: each leaf [T+1, B, ...].


@flax.struct.dataclass
class TrainingState:
    params: dict
    opt_state: optax.OptState
    key: jax.Array
    step: jax.Array


def make_optimizer(config: ImpalaConfig) -> optax.GradientTransformation:
    return optax.chain(
        optax.clip_by_global_norm(config.max_grad_norm),
        optax.adam(config.learning_rate, eps=config.adam_eps),
    )


def make_update(
    networks: ImpalaNetworks, optimizer: optax.GradientTransformation, config: ImpalaConfig
) -> Callable[[TrainingState, Batch], tuple[TrainingState, dict]]:
    """Returns the pure `update(state, batch) -> (state, metrics)`.

    The batch holds what the inference server recorded per step: `obs`, `first`, `reward`,
    `terminated` (describing how each observation was reached), and the `action` and
    behaviour `logits` chosen at it.
    """
    loss_fn = functools.partial(
        impala_loss,
        baseline_cost=config.baseline_cost,
        entropy_cost=config.entropy_cost,
        lambda_=config.vtrace_lambda,
        clip_rho_threshold=config.clip_rho_threshold,
        clip_pg_rho_threshold=config.clip_pg_rho_threshold,
    )

    def batch_loss(params, batch: Batch):
        logits, values = networks.apply(params, batch["obs"])  # [T+1, B, A], [T+1, B]
        discounts = config.discount * (1.0 - batch["terminated"][1:].astype(jnp.float32))
        mask = 1.0 - batch["first"][1:].astype(jnp.float32)  # [T, B]
        losses, metrics = jax.vmap(loss_fn, in_axes=1)(
            logits,
            values,
            batch["action"][:-1],
            batch["logits"][:-1],
            batch["reward"][1:],
            discounts,
            mask,
        )
        return jnp.mean(losses), jax.tree.map(jnp.mean, metrics)

    def update(state: TrainingState, batch: Batch) -> tuple[TrainingState, dict]:
        (loss, metrics), grads = jax.value_and_grad(batch_loss, has_aux=True)(
            state.params, batch
        )
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        key, _ = jax.random.split(state.key)
        metrics = dict(metrics, loss=loss, grad_norm=optax.global_norm(grads))
        return TrainingState(params, opt_state, key, state.step + 1), metrics

    return update


class Learner:
    """Host shell: owns the state, places it on a device mesh and runs the jitted update.

    Data parallel over `devices` (default: all local devices): the batch axis of every leaf
    is sharded over the mesh axis "data", params and optimizer state are replicated, and
    XLA inserts the gradient all-reduce.
    """

    def __init__(
        self,
        networks: ImpalaNetworks,
        config: ImpalaConfig,
        key: jax.Array,
        devices: Sequence[jax.Device] | None = None,
    ):
        devices = list(devices if devices is not None else jax.local_devices())
        if config.batch_size % len(devices):
            raise ValueError(
                f"batch_size={config.batch_size} must be divisible by the number of learner "
                f"devices ({len(devices)}) to shard the batch evenly."
            )
        mesh = Mesh(np.array(devices), ("data",))
        replicated = NamedSharding(mesh, PartitionSpec())
        self._batch_sharding = NamedSharding(mesh, PartitionSpec(None, "data"))
        optimizer = make_optimizer(config)

        def init(key: jax.Array) -> TrainingState:
            init_key, state_key = jax.random.split(key)
            params = networks.init(init_key)
            step = jnp.zeros((), jnp.int32)
            return TrainingState(params, optimizer.init(params), state_key, step)

        # One compiled init instead of many small eager ops: seconds faster at start-up.
        self._state = jax.jit(init, out_shardings=replicated)(key)
        self._update = jax.jit(
            make_update(networks, optimizer, config),
            in_shardings=(replicated, self._batch_sharding),
            # No donation: inference may still be reading the params published last step.
            out_shardings=(replicated, replicated),
        )

    def step(self, batch: Mapping[str, np.ndarray]) -> dict:
        """One SGD step on a host batch; returns the metrics as device scalars."""
        batch = jax.device_put(dict(batch), self._batch_sharding)
        self._state, metrics = self._update(self._state, batch)
        return metrics

    @property
    def params(self):
        return self._state.params

    @property
    def state(self) -> TrainingState:
        return self._state
