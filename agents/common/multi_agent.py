"""One single-agent learner per policy of a multi-agent env: what IPPO/MAPPO (agents/ppo) and
independent IMPALA (agents/impala) share.

Agents go to policies by the policy mapping (builders/contract/policy_mapping.py). Each policy
is a single-agent agent, unchanged: its policy acts on its agents' inputs stacked as rows
(`per_policy_policy`), and its update learns from its agents' steps stacked on the batch axis
(`group_batch`, [T + 1, B * n] for n agents), with its own params and optimizer state; the
training state is a `MultiPolicyState` of {policy: state}, so a checkpoint holds one entry per
policy and restores them all (`per_policy_training`).

Masks: a step after which an agent no longer acts (`alive` False: it finished before the
others) is given to the single-agent learner as its ignored autoreset steps are (`first` set
on the next step): masked out of the loss, no trace across it. The agent's last transition,
into its terminal observation, is learned from.

The networks of such an agent (`PerPolicyNetworks`) say which policies there are, which agents
each serves, and what a policy's input is made of (`inputs`); its config derives from
`PolicyMappingConfig`, the mapping's settings.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Protocol

import flax.struct
import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from trellis.agents.common.params import Params
from trellis.agents.common.training import STATE_HPARAMS
from trellis.builders.contract.agent import Policy, State, Training, Update
from trellis.builders.contract.config import Config, setting
from trellis.builders.contract.policy_mapping import (
    PolicyGroup,
    PolicyMapping,
    PolicyMappingError,
    stack,
    unstack,
)
from trellis.envs.multi_agent import MultiAgentStep


@dataclasses.dataclass(frozen=True)
class PolicyMappingConfig(Config):
    """The policy mapping's settings, for the config of an agent with one learner per policy.

    Listed first among its bases, before the single-agent config
    (`class IPPOConfig(PolicyMappingConfig, PPOConfig)`): its fields then follow the single
    agent's, and its `check` runs the single agent's checks before the mapping's.
    """

    policy_mapping: str = setting(
        "shared", "which agent uses which policy: shared, per_agent, or PATTERN=POLICY,... "
        "(glob patterns on agent ids, e.g. 'adversary_*=adv,agent_*=good')")
    policies: str = setting(
        "", "the policy ids policy_mapping may name, comma-separated (empty: any)")

    def check(self) -> None:
        super().check()
        try:  # A mapping of none of the forms is refused here, before anything runs.
            PolicyMapping.parse(self.policy_mapping, self.policies)
        except PolicyMappingError as e:
            raise self.invalid("policy_mapping", f"a mapping onto the declared policies ({e})"
                               ) from None

    @property
    def mapping(self) -> PolicyMapping:
        return PolicyMapping.parse(self.policy_mapping, self.policies)


class PerPolicyNetworks(Protocol):
    """The networks of a multi-agent agent with one single-agent learner per policy.

    Attributes:
      groups: the policies and their agents (`PolicyMapping.groups`).
      agents: every agent, in the groups' order.
    """

    @property
    def groups(self) -> tuple[PolicyGroup, ...]: ...

    @property
    def agents(self) -> tuple[str, ...]: ...

    def inputs(self, group: PolicyGroup, step: MultiAgentStep) -> jax.Array:
        """[N, n, ...]: the input of the group's policy for its n agents in N envs (`step`'s
        leaves [N, ...])."""
        ...


def group_batch(networks: PerPolicyNetworks, group: PolicyGroup,
                batch: Mapping[str, Any]) -> dict[str, jax.Array]:
    """The single-agent batch of one policy: its agents' steps stacked on the batch axis.

    Args:
      networks: for the policy's input.
      group: the policy and its n agents.
      batch: the recorded unrolls, time-major [T + 1, B, ...]: `obs` (the `MultiAgentStep`s),
        and the per-agent `action` and extras, each {agent: [T + 1, B, ...]}.

    Returns:
      {field: [T + 1, B * n, ...]}: `obs` (the policy's input), `reward`, `terminated`,
      `truncated`, `first` (also set after a step where the agent no longer acts, so the
      learner masks what follows, as after an episode's end), the action and the extras.
    """
    step: MultiAgentStep = batch["obs"]
    t1, b = step.first.shape
    n = len(group.agents)

    def flat(x: jax.Array) -> jax.Array:  # [T + 1, B, ...] -> [(T + 1) * B, ...]
        return x.reshape((t1 * b,) + x.shape[2:])

    def per_agent(fields: Mapping[str, jax.Array]) -> jax.Array:  # -> [T + 1, B * n, ...]
        x: jax.Array = stack(group, {a: flat(fields[a]) for a in group.agents}, jnp)
        return x.reshape((t1, b * n) + x.shape[2:])

    x = networks.inputs(group, jax.tree.map(flat, step))
    alive = per_agent(step.alive)
    acted_before = jnp.concatenate([jnp.ones_like(alive[:1]), alive[:-1]])
    first = jnp.repeat(step.first, n, axis=1) | ~acted_before
    out = {"obs": x.reshape((t1, b * n) + x.shape[2:]), "first": first,
           "reward": per_agent(step.reward), "terminated": per_agent(step.terminated),
           "truncated": per_agent(step.truncated)}
    for field in batch:
        if field not in out and isinstance(batch[field], Mapping):
            out[field] = per_agent(batch[field])
    return out


def agent_metrics(step: MultiAgentStep, agents: tuple[str, ...]) -> dict[str, jax.Array]:
    """`agent/<id>/reward_mean`: each agent's mean reward over the steps it acted (time-major
    [T + 1, B] leaves; the reward at t + 1 is for the action at t)."""
    out = {}
    for agent in agents:
        acted = step.alive[agent][:-1].astype(jnp.float32)
        total = jnp.sum(step.reward[agent][1:] * acted)
        out[f"agent/{agent}/reward_mean"] = total / jnp.maximum(jnp.sum(acted), 1.0)
    return out


@flax.struct.dataclass
class MultiPolicyState:
    """The training state of every policy: {policy id: its learner's state} (one checkpoint
    entry each). `params` and `step` are what acting and the counters read."""

    policies: dict[str, Any]

    @property
    def params(self) -> dict[str, Any]:
        return {policy: state.params for policy, state in self.policies.items()}

    @property
    def step(self) -> jax.Array:
        """Updates taken (the policies update together)."""
        step: jax.Array = next(iter(self.policies.values())).step
        return step


def per_policy_training(networks: PerPolicyNetworks, trainings: Mapping[str, Training]
                        ) -> Training:
    """A `MultiPolicyState` of every policy's own training, and the update that runs each
    policy's update on its batch (`group_batch`); metrics `policy/<id>/<name>` and
    `agent/<id>/reward_mean`.

    Args:
      networks: the groups and their inputs.
      trainings: {policy id: the single-agent training of that policy}.
    """

    def init(key: jax.Array) -> MultiPolicyState:
        keys = jax.random.split(key, len(networks.groups))
        return MultiPolicyState({group.policy: trainings[group.policy].init(k)
                                 for group, k in zip(networks.groups, keys, strict=True)})

    def make_update(mesh: Mesh | None) -> Update:
        updates = {policy: training.make_update(mesh) for policy, training in trainings.items()}

        def update(state: MultiPolicyState, batch: Mapping[str, Any]
                   ) -> tuple[MultiPolicyState, dict[str, jax.Array]]:
            policies: dict[str, Any] = {}
            metrics = agent_metrics(batch["obs"], networks.agents)
            for group in networks.groups:
                policies[group.policy], group_metrics = updates[group.policy](
                    state.policies[group.policy], group_batch(networks, group, batch))
                metrics.update({f"policy/{group.policy}/{name}": v
                                for name, v in group_metrics.items()})
            return MultiPolicyState(policies), metrics

        return update

    return Training(init, make_update, hparams=STATE_HPARAMS)


def per_policy_policy(networks: PerPolicyNetworks, policies: Mapping[str, Policy]) -> Policy:
    """`policy(params, key, step, state, first) -> (actions, extras, state)` on N envs'
    `MultiAgentStep`: each policy's single-agent policy (feed-forward) acts once, on its n
    agents' inputs stacked as rows [N * n, ...]; actions and each extra {agent: [N, ...]}.

    Args:
      networks: the groups and their inputs.
      policies: {policy id: its single-agent policy}, called with that policy's params.
    """

    def policy(params: Params, key: jax.Array, step: MultiAgentStep, state: State,
               first: jax.Array
               ) -> tuple[dict[str, jax.Array], dict[str, dict[str, jax.Array]], State]:
        actions: dict[str, jax.Array] = {}
        extras: dict[str, dict[str, jax.Array]] = {}
        keys = jax.random.split(key, len(networks.groups))
        for group, group_key in zip(networks.groups, keys, strict=True):
            x = networks.inputs(group, step)  # [N, n, ...]
            n_envs, n = x.shape[:2]
            rows = x.reshape((n_envs * n,) + x.shape[2:])
            action, group_extras, _ = policies[group.policy](
                params[group.policy], group_key, rows, {}, jnp.repeat(first, n))
            for name, v in {"action": action, **group_extras}.items():
                per_agent = unstack(group, v.reshape((n_envs, n) + v.shape[1:]))
                (actions if name == "action" else extras.setdefault(name, {})).update(per_agent)
        return actions, extras, state

    return policy
