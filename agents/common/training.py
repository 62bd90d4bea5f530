"""The training state, the optimizer, and the hyper-parameters a state holds as arrays."""


from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import chex
import flax.struct
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from trellis.agents.common.params import Params
from trellis.builders.contract.config import AgentConfig
from trellis.builders.contract.hparams import array_module, learning_rate_factor

__all__ = ["STATE_HPARAMS", "StateHyperParams", "TargetNetworkState", "TrainingState",
           "get_hparams", "gradient_step", "importance_weights", "init_target_network_state",
           "init_training_state", "learning_rate_factor", "make_optimizer", "minibatch_epochs",
           "scale_by_learning_rate_factor", "set_hparams", "set_learning_rate_factor",
           "with_learning_rate_factor", "without_learning_rate_factor"]


def make_optimizer(config: AgentConfig) -> optax.GradientTransformation:
    """Adam after global-norm gradient clipping, as `config` sets them, its steps scaled by
    the learning-rate schedule's factor (`set_learning_rate_factor`; 1 until set).

    The learning rate is injected (`optax.inject_hyperparams`): it lives in the optimizer
    state as an array, so checkpoints keep it and `set_hparams` changes it without a
    recompilation. Adam's other settings stay constants of the compiled update. The
    schedule's factor is apart from it, so that PBT's changes of the rate and the schedule's
    compose: the step is learning_rate x factor.
    """
    adam = optax.inject_hyperparams(optax.adam, static_args=("b1", "b2", "eps", "eps_root"))
    return optax.chain(
        optax.clip_by_global_norm(config.max_grad_norm),
        adam(learning_rate=config.learning_rate, eps=config.adam_eps),
        scale_by_learning_rate_factor(),
    )


class _LearningRateFactor(NamedTuple):
    """The optimizer state of the schedule's factor on the learning rate."""

    factor: jax.Array  # float32 scalar ([M] in a population).


def scale_by_learning_rate_factor() -> optax.GradientTransformation:
    """Scales the updates by the learning-rate schedule's factor (1 until
    `set_learning_rate_factor` sets it): the last link of an optimizer's chain."""

    def init(params: optax.Params) -> _LearningRateFactor:
        del params
        return _LearningRateFactor(jnp.ones((), jnp.float32))

    def update(updates: optax.Updates, state: optax.OptState,
               params: optax.Params | None = None) -> tuple[optax.Updates, optax.OptState]:
        del params
        # optax hands back the state `init` made (an OptState to its annotations).
        assert isinstance(state, _LearningRateFactor)
        factor = state.factor
        return jax.tree.map(lambda u: u * factor.astype(u.dtype), updates), state

    return optax.GradientTransformation(init, update)


def _is_factor(node: Any) -> bool:
    return isinstance(node, _LearningRateFactor)


def set_learning_rate_factor(state: Any, factor: Any) -> Any:
    """A copy of training state `state` whose optimizers scale their steps by `factor`
    (broadcast to the factor each holds: [M] in a population's state). A number sets numpy
    arrays (`array_module`): the state's next device_put or jitted call takes them over.

    Raises:
      ValueError: `state` holds no factor (its optimizer does not end with
        `scale_by_learning_rate_factor`): a schedule would change nothing.
    """
    if not any(_is_factor(node) for node in jax.tree.leaves(state, is_leaf=_is_factor)):
        raise ValueError("this training state holds no learning-rate factor to schedule: its "
                         "optimizer must end with agents.common's scale_by_learning_rate_factor "
                         "(make_optimizer's does)")
    xp = array_module(factor)
    return jax.tree.map(
        lambda node: _LearningRateFactor(xp.broadcast_to(
            xp.asarray(factor, xp.float32), node.factor.shape)) if _is_factor(node) else node,
        state, is_leaf=_is_factor)


def _is_scheduled_chain(node: Any) -> bool:
    return type(node) is tuple and bool(node) and _is_factor(node[-1])


def without_learning_rate_factor(state: Any) -> Any:
    """`state` with its optimizers' chains as they were before the schedule's factor ended
    them (a158f3b): the structure of the checkpoints written before."""
    return jax.tree.map(lambda chain: chain[:-1] if _is_scheduled_chain(chain) else chain,
                        state, is_leaf=_is_scheduled_chain)


def with_learning_rate_factor(legacy: Any, target: Any) -> Any:
    """`target` with the values of `legacy` (shaped as `without_learning_rate_factor(target)`)
    and its own factors: a state read from a checkpoint written before the schedule."""
    nodes, structure = jax.tree.flatten(target, is_leaf=_is_factor)
    values = iter(jax.tree.leaves(legacy))
    return jax.tree.unflatten(structure,
                              [node if _is_factor(node) else next(values) for node in nodes])


@flax.struct.dataclass
class TrainingState:
    params: Params
    opt_state: optax.OptState
    key: jax.Array
    step: jax.Array
    # Hyper-parameters the update reads from the state, not from its config (e.g.
    # entropy_cost): float32 scalars, so PBT and populations change them without recompiling.
    hparams: dict[str, jax.Array] = flax.struct.field(default_factory=dict)


def init_training_state(
    init_params: Callable[[jax.Array], Params],
    optimizer: optax.GradientTransformation,
    key: jax.Array,
    hparams: Mapping[str, float] | None = None,
) -> TrainingState:
    """Fresh params and optimizer state; the rest of `key` becomes the state's own key.

    Args:
      init_params: `init_params(key) -> params`.
      optimizer: e.g. `make_optimizer(config)`.
      key: the learner's key.
      hparams: the hyper-parameters the update reads from `state.hparams`, with their
        initial values (from the config).
    """
    init_key, state_key = jax.random.split(key)
    params = init_params(init_key)
    return TrainingState(params, optimizer.init(params), state_key, jnp.zeros((), jnp.int32),
                         {name: jnp.asarray(v, jnp.float32) for name, v in (hparams or {}).items()})


@flax.struct.dataclass
class TargetNetworkState:
    """The training state of a value-based learner with a target network (DQN, R2D2)."""

    params: Params
    target_params: Params
    opt_state: optax.OptState
    key: jax.Array
    step: jax.Array  # SGD steps taken.


def init_target_network_state(init_params: Callable[[jax.Array], Params],
                              optimizer: optax.GradientTransformation,
                              key: jax.Array) -> TargetNetworkState:
    """Fresh online params, the target network a copy of them."""
    init_key, state_key = jax.random.split(key)
    params = init_params(init_key)
    return TargetNetworkState(params, params, optimizer.init(params), state_key,
                              jnp.zeros((), jnp.int32))


def importance_weights(probabilities: jax.Array, table_size: jax.Array,
                       exponent: float) -> jax.Array:
    """(N P(i))^-exponent, divided by the batch's largest so weights only scale down
    (Schaul et al., 2016, section 3.4): prioritized replay's correction.

    Args:
      probabilities: [B] probability with which each item was sampled.
      table_size: [B] N, the table's size when each was sampled.
      exponent: beta.

    Returns:
      [B] weights in (0, 1].
    """
    chex.assert_rank([probabilities, table_size], 1)
    weights = (table_size * probabilities) ** -exponent
    return weights / jnp.max(weights)


# --- Hyper-parameters in a training state ---------------------------------------------
#
# A state's hyper-parameters are the injected ones of its optimizer states (the learning
# rate; SAC's three optimizers share it) and its `hparams` field. They are arrays the jitted
# update reads, so these helpers work on any state, inside jit and vmap too.


def _is_injected(node: Any) -> bool:
    return isinstance(node, optax.InjectStatefulHyperparamsState)


def get_hparams(state: Any) -> dict[str, jax.Array]:
    """The hyper-parameters held by a training state: {name: scalar array}."""
    found: dict[str, jax.Array] = {}
    for node in jax.tree.leaves(state, is_leaf=_is_injected):
        if _is_injected(node):
            found.update(node.hyperparams)
    found.update(getattr(state, "hparams", {}))
    return found


def set_hparams(state: Any, values: Mapping[str, Any]) -> Any:
    """A copy of `state` with the hyper-parameters in `values` replaced (keeping their dtypes).

    Raises:
      ValueError: a name in `values` is not a hyper-parameter of `state`.
    """
    held = get_hparams(state)
    unknown = sorted(set(values) - set(held))
    if unknown:
        raise ValueError(f"{', '.join(unknown)} not among this training state's "
                         f"hyper-parameters ({', '.join(sorted(held)) or 'none'})")

    def put(hparams: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
        return {name: jnp.asarray(values[name], jnp.result_type(v)) if name in values else v
                for name, v in hparams.items()}

    state = jax.tree.map(
        lambda node: node._replace(hyperparams=put(node.hyperparams)) if _is_injected(node)
        else node, state, is_leaf=_is_injected)
    if isinstance(getattr(state, "hparams", None), dict):
        state = state.replace(hparams=put(state.hparams))
    return state


class StateHyperParams:
    """`builders.contract.hparams.HyperParams` of the training states made here: the
    optimizers' injected hyper-parameters, a state's `hparams` field, and the factor of
    `scale_by_learning_rate_factor`. Agents pass `STATE_HPARAMS` in their `Training`."""

    def get(self, state: Any) -> dict[str, jax.Array]:
        return get_hparams(state)

    def set(self, state: Any, values: Mapping[str, Any]) -> Any:
        return set_hparams(state, values)

    def set_learning_rate_factor(self, state: Any, factor: Any) -> Any:
        return set_learning_rate_factor(state, factor)


STATE_HPARAMS = StateHyperParams()


MinibatchLoss = Callable[[Params, Any], tuple[jax.Array, dict[str, jax.Array]]]
Epochs = Callable[[Any, Params, optax.OptState, jax.Array],
                  tuple[Params, optax.OptState, dict[str, jax.Array]]]


def minibatch_epochs(minibatch_loss: MinibatchLoss, optimizer: optax.GradientTransformation,
                     num_minibatches: int, mesh: Mesh | None) -> Epochs:
    """`epochs(transitions, params, opt_state, keys) -> (params, opt_state, metrics)`: one
    pass per key over `transitions` (a pytree of [N, ...] arrays) in a fresh permutation,
    split into `num_minibatches` minibatches with one optimizer step on `minibatch_loss`
    each; the metrics (the loss's, with `loss` and `grad_norm`) are means over the steps.

    With a `mesh`, each minibatch is sharded over its "data" axis: the steps run
    data-parallel after the global shuffle, the same numbers on any device count. N must
    divide into `num_minibatches` minibatches that divide over the mesh (the caller checks,
    naming its agent's settings).
    """

    def sgd_step(carry: tuple[Params, optax.OptState], minibatch: Any
                 ) -> tuple[tuple[Params, optax.OptState], dict[str, jax.Array]]:
        params, opt_state = carry
        (loss, metrics), grads = jax.value_and_grad(minibatch_loss, has_aux=True)(
            params, minibatch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return (params, opt_state), dict(metrics, loss=loss, grad_norm=optax.global_norm(grads))

    def shard(x: jax.Array) -> jax.Array:
        if mesh is None:
            return x
        spec = PartitionSpec(None, "data")  # [M, N / M, ...]: each minibatch split.
        sharded: jax.Array = jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))
        return sharded

    def epoch(transitions: Any, carry: tuple[Params, optax.OptState], key: jax.Array
              ) -> tuple[tuple[Params, optax.OptState], dict[str, jax.Array]]:
        order = jax.random.permutation(key, jax.tree.leaves(transitions)[0].shape[0])
        minibatches = jax.tree.map(
            lambda x: shard(x[order].reshape((num_minibatches, -1) + x.shape[1:])),
            transitions)
        return jax.lax.scan(sgd_step, carry, minibatches)

    def epochs(transitions: Any, params: Params, opt_state: optax.OptState, keys: jax.Array
               ) -> tuple[Params, optax.OptState, dict[str, jax.Array]]:
        (params, opt_state), metrics = jax.lax.scan(
            lambda carry, key: epoch(transitions, carry, key), (params, opt_state), keys)
        return params, opt_state, jax.tree.map(jnp.mean, metrics)

    return epochs


def gradient_step(state: TrainingState,
                  loss_fn: Callable[[Params], tuple[jax.Array, dict[str, jax.Array]]],
                  optimizer: optax.GradientTransformation
                  ) -> tuple[TrainingState, dict[str, jax.Array]]:
    """One optimizer step of `state` on `loss_fn(params) -> (loss, metrics)`; the metrics
    with `loss`. The params move by `p + u` (the update in the params' dtype)."""
    (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = jax.tree.map(lambda p, u: p + u, state.params, updates)
    state = dataclasses.replace(state, params=params, opt_state=opt_state, step=state.step + 1)
    return state, {"loss": loss, **metrics}
