"""QMIX's and VDN's learner: a pure, jitted update (the team's Q(lambda) targets over the
batch, then epochs of minibatch SGD on the team's TD loss), PQN's learning on the team's Q,
run by the gradient agents' host shell (`DataParallelLearner`) and by the anakin program."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh

from trellis.agents.common import STATE_HPARAMS, make_optimizer
from trellis.agents.common.multi_agent import agent_metrics
from trellis.agents.common.params import Params
from trellis.agents.common.q_learning import linear_epsilon, q_lambda_targets
from trellis.agents.common.training import minibatch_epochs
from trellis.agents.qmix.config import QMIXConfig
from trellis.agents.qmix.losses import chosen_q, team_q_loss, team_step
from trellis.agents.qmix.networks import QMIXNetworks
from trellis.builders.contract.agent import Training
from trellis.builders.contract.policy_mapping import unstack
from trellis.envs.multi_agent import MultiAgentStep

Metrics = dict[str, jax.Array]


@flax.struct.dataclass
class QMIXState:
    """The training state.

    Attributes:
      params: {"agents": {policy id: its Q-network's params}, "mixer": the mixer's ({} for
        VDN)}.
      env_steps: the env steps of the batches learned from (T * B each), which epsilon's
        schedule follows; float32 (an int32 would overflow on a long run).
      hparams: none of the agent's own (the learning rate is the optimizer's); kept so that
        `STATE_HPARAMS` reads this state as agents.common's.
    """

    params: Params
    opt_state: optax.OptState
    key: jax.Array
    step: jax.Array
    env_steps: jax.Array
    hparams: dict[str, jax.Array] = flax.struct.field(default_factory=dict)


def init_state(networks: QMIXNetworks, optimizer: optax.GradientTransformation,
               key: jax.Array) -> QMIXState:
    """Fresh params and optimizer state, no env steps; the rest of `key` is the state's."""
    init_key, state_key = jax.random.split(key)
    params = networks.init(init_key)
    return QMIXState(params, optimizer.init(params), state_key, jnp.zeros((), jnp.int32),
                     jnp.zeros((), jnp.float32))


def acting_params(state: QMIXState) -> dict[str, dict[str, jax.Array]]:
    """What the policy reads (`Training.acting_params`): per policy, its Q-network's params and
    the env steps learned from, which set epsilon (the mixer does not act)."""
    return {policy: {"q": params, "env_steps": state.env_steps}
            for policy, params in state.params["agents"].items()}


def agent_q_values(networks: QMIXNetworks, agent_params: Mapping[str, Params],
                   step: MultiAgentStep) -> dict[str, jax.Array]:
    """{agent: Q(o_agent, .) [N, A]} of every agent of N envs (`step`'s leaves [N, ...]),
    each policy's network run once on its agents' inputs stacked as rows."""
    out: dict[str, jax.Array] = {}
    for group in networks.groups:
        x = networks.inputs(group, step)  # [N, n, D]
        q = networks.q[group.policy].apply(agent_params[group.policy], x)  # [N, n, A]
        out.update(unstack(group, q))
    return out


def team_q(networks: QMIXNetworks, params: Params, step: MultiAgentStep,
           pick: Callable[[str, jax.Array], jax.Array],
           counts: Mapping[str, jax.Array]) -> jax.Array:
    """Q_tot [N] of N envs' `step`: each agent's Q picked by `pick(agent, q [N, A]) -> [N]`
    (the action taken, or the max), 0 where `counts[agent]` [N] is False, then mixed."""
    qs = agent_q_values(networks, params["agents"], step)
    picked = jnp.stack([pick(a, qs[a]) * counts[a] for a in networks.agents], axis=-1)
    q_tot: jax.Array = networks.mix(params["mixer"], picked, step.global_state)
    return q_tot


def make_transitions(networks: QMIXNetworks, config: QMIXConfig, params: Params,
                     batch: Mapping[str, Any]) -> dict[str, Any]:
    """Flat team transitions [T * B, ...] with their Q(lambda) targets.

    The bootstrap values are the team's maximum, max over joint actions of Q_tot(s', .) =
    mix(max_a Q_1, ..., max_a Q_n) (the mixer is monotonic, so each agent's own argmax is the
    team's), from the learner's params at this batch (on anakin, the params that acted). An
    agent counts there while it acts or where its episode was cut by a time limit (truncated:
    the bootstrap stands for its future, as for one agent); a terminated one counts 0.

    Args:
      params: the learner's.
      batch: unrolls [T + 1, B, ...]: `obs` (the `MultiAgentStep`s) and `action`
        ({agent: [T + 1, B]}).
    """
    step: MultiAgentStep = batch["obs"]
    t1, b = step.first.shape
    flat: MultiAgentStep = jax.tree.map(lambda x: x.reshape((t1 * b,) + x.shape[2:]), step)
    counts = {a: flat.alive[a] | flat.truncated[a] for a in networks.agents}
    q_next = team_q(networks, params, flat, lambda a, q: jnp.max(q, axis=-1), counts
                    ).reshape((t1, b))
    reward, terminated, truncated = team_step(step, networks.agents)  # [T + 1, B] each
    targets, mask = jax.vmap(
        functools.partial(q_lambda_targets, discount=config.discount, lambda_=config.q_lambda),
        in_axes=1, out_axes=1,
    )(reward[1:] * config.reward_scale, step.first[1:], terminated[1:], truncated[1:],
      jax.lax.stop_gradient(q_next[1:]))  # [T, B] each
    transitions = {"step": jax.tree.map(lambda x: x[:-1], step),
                   "action": {a: batch["action"][a][:-1] for a in networks.agents},
                   "target": targets, "mask": mask}
    out: dict[str, Any] = jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), transitions)
    return out


def make_update(
    networks: QMIXNetworks,
    optimizer: optax.GradientTransformation,
    config: QMIXConfig,
    mesh: Mesh | None = None,
) -> Callable[[QMIXState, Mapping[str, Any]], tuple[QMIXState, Metrics]]:
    """Returns the pure `update(state, batch) -> (state, metrics)`.

    One update: the team's Q(lambda) targets once, then `num_epochs` passes over a fresh
    permutation of the T * B team transitions in `num_minibatches` minibatches, one Adam step
    each on the team's TD loss, whose gradient reaches every policy's network through the
    mixer. Metrics are means over those steps, and each agent's mean reward.

    Args:
      networks, optimizer, config: the agent's.
      mesh: when given, each minibatch is sharded over its "data" axis.
    """
    num_minibatches = config.num_minibatches

    def minibatch_loss(params: Params, mb: Mapping[str, Any]) -> tuple[jax.Array, Metrics]:
        step = mb["step"]  # Only the agents that acted count.
        q_tot = team_q(networks, params, step, lambda a, q: chosen_q(q, mb["action"][a]),
                       step.alive)  # [N]
        loss = team_q_loss(q_tot, mb["target"], mb["mask"])
        return loss, {"q_tot_mean": jnp.mean(q_tot)}

    epochs = minibatch_epochs(minibatch_loss, optimizer, num_minibatches, mesh)

    def update(state: QMIXState, batch: Mapping[str, Any]) -> tuple[QMIXState, Metrics]:
        step: MultiAgentStep = batch["obs"]
        steps, num_envs = step.first.shape[0] - 1, step.first.shape[1]
        if (steps * num_envs) % num_minibatches or (
                mesh is not None and (steps * num_envs // num_minibatches) % mesh.size):
            raise ValueError(
                f"{config.mixer}'s {steps * num_envs} team transitions per batch "
                f"(unroll_length * batch_size) must split into num_minibatches="
                f"{num_minibatches} minibatches, each dividing over the "
                f"{1 if mesh is None else mesh.size} learner devices; change num_minibatches "
                "or batch_size.")
        keys = jax.random.split(state.key, config.num_epochs + 1)
        transitions = make_transitions(networks, config, state.params, batch)
        params, opt_state, metrics = epochs(transitions, state.params, state.opt_state, keys[1:])
        metrics.update(agent_metrics(step, networks.agents))
        metrics.update(target_mean=jnp.sum(transitions["target"] * transitions["mask"])
                       / jnp.maximum(jnp.sum(transitions["mask"]), 1.0),
                       epsilon=linear_epsilon(state.env_steps, config.epsilon_start,
                                              config.epsilon_finish,
                                              config.epsilon_decay_env_steps))
        return dataclasses.replace(
            state, params=params, opt_state=opt_state, key=keys[0], step=state.step + 1,
            env_steps=state.env_steps + steps * num_envs), metrics

    return update


def make_training(networks: QMIXNetworks, config: QMIXConfig) -> Training:
    """The pure init and update of the QMIX/VDN learner (`builders.contract.agent.Training`)."""
    optimizer = make_optimizer(config)
    return Training(
        functools.partial(init_state, networks, optimizer),
        lambda mesh: make_update(networks, optimizer, config, mesh),
        acting_params=acting_params,
        hparams=STATE_HPARAMS,
    )
