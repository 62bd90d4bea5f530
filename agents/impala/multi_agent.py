"""Independent IMPALA: IMPALA for each policy of a multi-agent env (`--agent=iimpala`).

Each policy of the policy mapping (builders/contract/policy_mapping.py: `shared`, `per_agent`
or `PATTERN=POLICY,...`) is one IMPALA learner, unchanged: its networks, V-trace loss and
update (agents/impala/) run on its agents' steps stacked on the batch axis, with their own
params and optimizer state (agents/common/multi_agent.py: one checkpoint entry per policy, a
step after an agent stopped acting masked as IMPALA masks autoreset steps). Where a policy
serves several agents, its input is the agent's observation with its one-hot id. Only the
defaults differ from IMPALA's (`IImpalaConfig`): centred rewards and a lower learning rate,
without which it does not learn MPE's simple_spread.

Acting is the same central inference as IMPALA's on one agent: each policy's policy runs once
per batch on its agents' observations stacked as rows. Feed-forward only (`core=none`): a
recurrent core would need its state per (env slot, agent), which this agent does not keep.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import jax
import jax.numpy as jnp

from trellis.agents.common import AgentBuilder
from trellis.agents.common.multi_agent import (
    PolicyMappingConfig,
    per_policy_policy,
    per_policy_training,
)
from trellis.agents.impala.builder import ImpalaBuilder
from trellis.agents.impala.config import ImpalaConfig
from trellis.agents.impala.learner import make_training as impala_training
from trellis.agents.impala.networks import ImpalaNetworks, num_actions
from trellis.builders.contract.agent import UNROLLS, ArraySpec, Capabilities, Policy, Training
from trellis.builders.contract.config import setting
from trellis.builders.contract.policy_mapping import PolicyGroup, add_agent_ids, stack
from trellis.envs.multi_agent import MultiAgentSpec, MultiAgentStep


@dataclasses.dataclass(frozen=True)
class IImpalaConfig(PolicyMappingConfig, ImpalaConfig):
    """Independent IMPALA's settings: IMPALA's, and the policy mapping, with defaults that
    learn MPE's simple_spread (docs/multi_agent.md, "Independent IMPALA"):

    - `center_rewards`: MPE's rewards are all negative (about -1 a step per agent), so with
      discount 0.99 and bootstrapping at the time limit the values are about -100: a
      baseline that starts at 0 spends many updates learning that constant, and its
      error swamps the actions' small effect on 5-step returns (measured: the policy either
      collapses onto one action or does not move). Centred rewards leave it only the
      differences between states to learn.
    - `learning_rate` 5e-4 and `entropy_cost` 0.01: the settings published for independent
      actor-critic on MPE (MARLlib's finetuned mpe/ia2c.yaml; EPyMARL's ia2c.yaml has lr
      5e-4 with standardised rewards); IMPALA's CartPole rate (5e-3 then, 4e-3 now) is unstable
      here.
    """

    learning_rate: float | None = setting(
        5e-4, "Adam's learning rate (independent IMPALA: 5e-4, the published independent "
        "actor-critic setting for MPE)", gt=0)
    center_rewards: bool = setting(
        True, "the learner subtracts the batch's mean reward before V-trace, so the baseline "
        "need not learn the returns' constant part (MPE: about -100 at discount 0.99)")

    def check(self) -> None:
        super().check()
        if self.core != "none":
            raise self.invalid("core", "none (independent IMPALA keeps no recurrent state per "
                               "agent)")


@dataclasses.dataclass(frozen=True)
class MultiAgentNetworks:
    """One IMPALA network per policy (`agents.common.multi_agent.PerPolicyNetworks`).

    Attributes:
      groups: the policies and their agents.
      policies: {policy id: ImpalaNetworks of the group's spec}.
    """

    groups: tuple[PolicyGroup, ...]
    policies: Mapping[str, ImpalaNetworks]

    @property
    def agents(self) -> tuple[str, ...]:
        return tuple(a for g in self.groups for a in g.agents)

    def inputs(self, group: PolicyGroup, step: MultiAgentStep) -> jax.Array:
        """[N, n, ...]: each agent's observation, with its one-hot id where the policy serves
        several agents (`add_agent_ids`)."""
        x: jax.Array = add_agent_ids(group, stack(group, step.obs, jnp), jnp)
        return x


class IImpalaBuilder(AgentBuilder[MultiAgentSpec]):
    """Builder of independent IMPALA on multi-agent envs (see the module docstring)."""

    config: IImpalaConfig

    def _single(self, group: PolicyGroup) -> ImpalaBuilder:
        """IMPALA on one policy's agents: each update takes B envs' unrolls of n agents."""
        return ImpalaBuilder(dataclasses.replace(
            self.config, batch_size=self.config.batch_size * len(group.agents)))

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(UNROLLS, anakin=True, multi_agent=True)

    def make_networks(self, spec: MultiAgentSpec) -> MultiAgentNetworks:
        """IMPALA's networks per policy of `config.mapping` on `spec`.

        Raises:
          builders.contract.policy_mapping.PolicyMappingError: the mapping does not fit.
        """
        groups = self.config.mapping.groups(spec)
        return MultiAgentNetworks(groups, {g.policy: self._single(g).make_networks(g.spec)
                                           for g in groups})

    def extras_spec(self, spec: MultiAgentSpec) -> dict[str, dict[str, ArraySpec]]:
        """The behaviour logits of each agent's step, of its policy's number of actions."""
        return {"logits": {agent: ArraySpec((num_actions(g.spec),), "float32")
                           for g in self.config.mapping.groups(spec) for agent in g.agents}}

    def make_policy(self, networks: MultiAgentNetworks, evaluation: bool = False) -> Policy:
        return per_policy_policy(networks, {
            g.policy: self._single(g).make_policy(networks.policies[g.policy], evaluation)
            for g in networks.groups})

    def make_training(self, networks: MultiAgentNetworks, spec: MultiAgentSpec) -> Training:
        del spec  # The networks know the groups and shapes.
        return per_policy_training(networks, {
            g.policy: impala_training(networks.policies[g.policy], self._single(g).config)
            for g in networks.groups})
