"""PQN learner: a pure, jitted update (Q(lambda) targets over the batch, then epochs of
minibatch SGD on the TD loss) on the gradient agents' host shell (`DataParallelLearner`)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import flax.struct
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh

from trellis.agents.common import STATE_HPARAMS, Batch, scale_by_learning_rate_factor
from trellis.agents.common.params import Params
from trellis.agents.common.q_learning import linear_epsilon, q_lambda_targets
from trellis.agents.common.training import minibatch_epochs
from trellis.agents.pqn.config import PQNConfig
from trellis.agents.pqn.losses import q_loss
from trellis.agents.pqn.networks import PQNNetworks
from trellis.builders.contract.agent import Training

Metrics = dict[str, jax.Array]


@flax.struct.dataclass
class PQNState:
    """The training state.

    Attributes:
      env_steps: the env steps of the batches learned from (T * B each), which epsilon's
        schedule follows; float32, exact to 2^24 and within a step's fraction beyond (an
        int32 would overflow at 2^31 on a long run).
      hparams: none of PQN's own (the learning rate is the optimizer's); kept so that
        `STATE_HPARAMS` reads this state as agents.common's.
    """

    params: Params
    opt_state: optax.OptState
    key: jax.Array
    step: jax.Array
    env_steps: jax.Array
    hparams: dict[str, jax.Array] = flax.struct.field(default_factory=dict)


def make_optimizer(config: PQNConfig) -> optax.GradientTransformation:
    """RAdam (the paper's) after global-norm clipping, its learning rate injected (an array in
    the optimizer state: checkpointed, set by PBT without recompiling) and its steps scaled by
    the schedule's factor (`agents.common.scale_by_learning_rate_factor`), so `STATE_HPARAMS`
    reaches it as it reaches agents.common's Adam."""
    radam = optax.inject_hyperparams(
        optax.radam, static_args=("b1", "b2", "eps", "eps_root", "threshold", "nesterov"))
    return optax.chain(
        optax.clip_by_global_norm(config.max_grad_norm),
        radam(learning_rate=config.learning_rate, eps=config.adam_eps),
        scale_by_learning_rate_factor(),
    )


def init_state(networks: PQNNetworks, optimizer: optax.GradientTransformation,
               key: jax.Array) -> PQNState:
    """Fresh params and optimizer state, no env steps; the rest of `key` is the state's."""
    init_key, state_key = jax.random.split(key)
    params = networks.init(init_key)
    return PQNState(params, optimizer.init(params), state_key, jnp.zeros((), jnp.int32),
                    jnp.zeros((), jnp.float32))


def acting_params(state: PQNState) -> dict[str, jax.Array]:
    """What the policy reads (`Training.acting_params`): the Q-network's params and the env
    steps learned from, which set epsilon."""
    return {"q": state.params, "env_steps": state.env_steps}


def make_transitions(config: PQNConfig, batch: Batch) -> dict[str, jax.Array]:
    """Flat transitions [T * B, ...] with their Q(lambda) targets, from the max Q-values the
    policy recorded when acting (the paper's: no forward pass here; on anakin they are the
    learner's params' values at this batch, on the host those of the params that acted).

    Args:
      batch: unrolls [T + 1, B, ...]: `obs`, `action`, `q_max` (max_a Q(obs, a) when
        acting), `reward`, `first`, `terminated`, `truncated` (how each observation was
        reached).
    """
    reward = batch["reward"][1:].astype(jnp.float32) * config.reward_scale  # [T, B]
    targets, mask = jax.vmap(
        functools.partial(q_lambda_targets, discount=config.discount, lambda_=config.q_lambda),
        in_axes=1, out_axes=1,
    )(reward, batch["first"][1:], batch["terminated"][1:], batch["truncated"][1:],
      batch["q_max"][1:])  # [T, B] each
    transitions = {"obs": batch["obs"][:-1], "action": batch["action"][:-1],
                   "target": targets, "mask": mask}
    flat: dict[str, jax.Array] = jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]),
                                              transitions)
    return flat


def make_update(
    networks: PQNNetworks,
    optimizer: optax.GradientTransformation,
    config: PQNConfig,
    mesh: Mesh | None = None,
) -> Callable[[PQNState, Batch], tuple[PQNState, Metrics]]:
    """Returns the pure `update(state, batch) -> (state, metrics)`.

    One update is PQN's learning on one batch of unrolls: Q(lambda) targets once, then
    `num_epochs` passes over a fresh permutation of the T * B transitions in
    `num_minibatches` minibatches, one RAdam step each. Metrics are means over those steps.
    The batch's B may differ from the config's (the host's auto learner batch): the
    minibatches are then T * B / num_minibatches transitions.

    Args:
      networks, optimizer, config: the agent's.
      mesh: when given, each minibatch is sharded over its "data" axis (the SGD steps run
        data-parallel after the global shuffle; the same numbers on any device count).
    """
    num_minibatches = config.num_minibatches

    def minibatch_loss(params: Params, mb: dict[str, jax.Array]) -> tuple[jax.Array, Metrics]:
        q_values = networks.apply(params, mb["obs"])  # [N, A]
        loss = q_loss(q_values, mb["action"], mb["target"], mb["mask"])
        return loss, {"q_mean": jnp.mean(q_values)}

    epochs = minibatch_epochs(minibatch_loss, optimizer, num_minibatches, mesh)

    def update(state: PQNState, batch: Batch) -> tuple[PQNState, Metrics]:
        steps = batch["reward"].shape[0] - 1
        num_envs = batch["reward"].shape[1]
        if (steps * num_envs) % num_minibatches or (
                mesh is not None and (steps * num_envs // num_minibatches) % mesh.size):
            raise ValueError(
                f"PQN's {steps * num_envs} transitions per batch (unroll_length * batch_size) "
                f"must split into num_minibatches={num_minibatches} minibatches, each dividing "
                f"over the {1 if mesh is None else mesh.size} learner devices; change "
                "num_minibatches or batch_size.")
        keys = jax.random.split(state.key, config.num_epochs + 1)
        transitions = make_transitions(config, batch)
        params, opt_state, metrics = epochs(transitions, state.params, state.opt_state, keys[1:])
        env_steps = state.env_steps + steps * num_envs
        metrics.update(target_mean=jnp.sum(transitions["target"] * transitions["mask"])
                       / jnp.maximum(jnp.sum(transitions["mask"]), 1.0),
                       epsilon=linear_epsilon(state.env_steps, config.epsilon_start,
                                              config.epsilon_finish,
                                              config.epsilon_decay_env_steps))
        return dataclasses.replace(state, params=params, opt_state=opt_state, key=keys[0],
                                   step=state.step + 1, env_steps=env_steps), metrics

    return update


def make_training(networks: PQNNetworks, config: PQNConfig) -> Training:
    """The pure init and update of the PQN learner (`builders.contract.agent.Training`)."""
    optimizer = make_optimizer(config)
    return Training(
        functools.partial(init_state, networks, optimizer),
        lambda mesh: make_update(networks, optimizer, config, mesh),
        acting_params=acting_params,
        hparams=STATE_HPARAMS,
    )
