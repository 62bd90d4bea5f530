"""Which agent of a multi-agent env acts and learns with which policy (RLlib's policy mapping).

A mapping is one setting (`policy_mapping`, on the command line or in a --config file):

  - `shared` (the default): one policy, "shared", for every agent; its input is the agent's
    observation with a one-hot of the agent's index appended, so shared parameters can still
    act differently per agent.
  - `per_agent`: one policy per agent, named after it.
  - `PATTERN=POLICY,...`: glob patterns on agent ids (fnmatch), the first match wins, e.g.
    `adversary_*=adv,agent_*=good`. Every agent must match a pattern and every pattern an agent.

An optional `policies` setting (`adv,good`) declares the policy ids; a mapping that names
another is an error, with the close matches.

Agents mapped to one policy must have equal observation and action spaces (one network serves
them); where they do not, the error names the agents and their spaces and suggests a mapping
that separates them. Where a policy serves several agents, its observation gets the one-hot of
the agent's index among them (`add_agent_ids`), as for `shared`.

Arrays follow envs/multi_agent.py: a policy's agents are stacked on an axis after the env axis
(`stack`), [N, n_agents_of_policy, ...], and split back by agent id (`unstack`).
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from trellis.envs.multi_agent import MultiAgentSpec
from trellis.envs.specs import EnvSpec

SHARED = "shared"
PER_AGENT = "per_agent"


class PolicyMappingError(ValueError):
    """A mapping that does not fit the env's agents (one line: what, the value, what works)."""


@dataclasses.dataclass(frozen=True)
class PolicyGroup:
    """One policy and the agents that act with it.

    Attributes:
      policy: the policy id (its parameters, optimizer state and checkpoint entry go by it).
      agents: its agents, in the env's agent order.
      spec: what the policy sees and does: the agents' common EnvSpec, its observation extended
        by a one-hot agent index when it serves several agents (`agent_ids`).
    """

    policy: str
    agents: tuple[str, ...]
    spec: EnvSpec

    @property
    def agent_ids(self) -> bool:
        """The observation carries a one-hot of the agent's index among `agents`."""
        return len(self.agents) > 1


@dataclasses.dataclass(frozen=True)
class PolicyMapping:
    """Agent id -> policy id: see the module docstring.

    Attributes:
      rules: (pattern, policy) pairs, the first match wins; () with `per_agent`.
      per_agent: one policy per agent, named after the agent.
      policies: the declared policy ids, or () to accept any the rules name.
    """

    rules: tuple[tuple[str, str], ...] = (("*", SHARED),)
    per_agent: bool = False
    policies: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str, policies: str | Sequence[str] = "") -> PolicyMapping:
        """The mapping a `policy_mapping` setting names (`shared`, `per_agent` or
        `PATTERN=POLICY,...`), with the declared `policies` (comma-separated or a list).

        Raises:
          PolicyMappingError: text of none of these forms, or a rule naming an undeclared policy.
        """
        declared = tuple(p.strip() for p in (policies.split(",") if isinstance(policies, str)
                                             else policies) if p.strip())
        text = text.strip()
        if text == SHARED:
            mapping = cls(policies=declared)
        elif text == PER_AGENT:
            mapping = cls(rules=(), per_agent=True, policies=declared)
        else:
            rules = []
            for item in filter(None, (part.strip() for part in text.split(","))):
                pattern, sep, policy = (s.strip() for s in item.partition("="))
                if not (sep and pattern and policy):
                    raise PolicyMappingError(
                        f"policy_mapping={text!r}: {item!r} is not PATTERN=POLICY; use "
                        f"{SHARED!r}, {PER_AGENT!r} or e.g. 'adversary_*=adv,agent_*=good'")
                rules.append((pattern, policy))
            if not rules:
                raise PolicyMappingError(
                    f"policy_mapping={text!r} is empty; use {SHARED!r}, {PER_AGENT!r} or "
                    "e.g. 'adversary_*=adv,agent_*=good'")
            mapping = cls(rules=tuple(rules), policies=declared)
        for _, policy in mapping.rules:
            mapping._check_declared(policy)
        return mapping

    def _check_declared(self, policy: str) -> None:
        if self.policies and policy not in self.policies:
            close = difflib.get_close_matches(policy, self.policies, n=3, cutoff=0.5)
            hint = f" Did you mean: {', '.join(close)}?" if close else ""
            raise PolicyMappingError(
                f"policy_mapping names policy {policy!r}, which is not one of the policies "
                f"{list(self.policies)}.{hint}")

    def policy_of(self, agent: str) -> str | None:
        """The policy id of `agent`, or None when no rule matches it."""
        if self.per_agent:
            return agent
        return next((policy for pattern, policy in self.rules
                     if fnmatch.fnmatchcase(agent, pattern)), None)

    def groups(self, spec: MultiAgentSpec) -> tuple[PolicyGroup, ...]:
        """The env's agents grouped by policy, in order of each policy's first agent.

        Raises:
          PolicyMappingError: an agent no rule matches, a rule that matches no agent, a
            per-agent policy that is not declared, a declared policy no agent uses, or agents
            of one policy with different spaces.
        """
        by_policy: dict[str, list[str]] = {}
        for agent in spec.agents:
            policy = self.policy_of(agent)
            if policy is None:
                raise PolicyMappingError(
                    f"agent {agent!r} matches no pattern of policy_mapping "
                    f"{self._text()!r}; the env's agents: {list(spec.agents)}")
            self._check_declared(policy)
            by_policy.setdefault(policy, []).append(agent)
        for pattern, _ in self.rules:
            if not any(fnmatch.fnmatchcase(a, pattern) for a in spec.agents):
                raise PolicyMappingError(
                    f"policy_mapping pattern {pattern!r} matches no agent; the env's agents: "
                    f"{list(spec.agents)}")
        unused = [p for p in self.policies if p not in by_policy]
        if unused:
            raise PolicyMappingError(
                f"policies {unused} are declared but policy_mapping {self._text()!r} maps no "
                f"agent to them; the env's agents: {list(spec.agents)}")
        return tuple(_group(policy, tuple(agents), spec, self._text())
                     for policy, agents in by_policy.items())

    def _text(self) -> str:
        if self.per_agent:
            return PER_AGENT
        if self.rules == ((("*", SHARED),)):
            return SHARED
        return ",".join(f"{pattern}={policy}" for pattern, policy in self.rules)


def _group(policy: str, agents: tuple[str, ...], spec: MultiAgentSpec, text: str
           ) -> PolicyGroup:
    first = spec.specs[agents[0]]
    different = [a for a in agents if spec.specs[a] != first]
    if different:
        raise PolicyMappingError(
            f"policy {policy!r} (policy_mapping={text!r}) serves agents with different spaces: "
            f"{agents[0]} has {_describe(first)} but {different[0]} has "
            f"{_describe(spec.specs[different[0]])}; give them separate policies, e.g. "
            f"policy_mapping={PER_AGENT}")
    if len(agents) == 1:
        return PolicyGroup(policy, agents, first)
    if len(first.observation_shape) != 1:
        raise PolicyMappingError(
            f"policy {policy!r} serves {len(agents)} agents, whose observations get a one-hot "
            f"agent id, which needs flat observations; got shape {first.observation_shape}; "
            f"use policy_mapping={PER_AGENT}")
    shape = (first.observation_shape[0] + len(agents),)
    return PolicyGroup(policy, agents, dataclasses.replace(
        first, observation_shape=shape, observation_dtype="float32"))


def _describe(spec: EnvSpec) -> str:
    actions = (f"{spec.num_actions} discrete actions" if spec.discrete
               else f"actions {spec.action_shape}")
    return f"observations {spec.observation_shape} {spec.observation_dtype}, {actions}"


def stack(group: PolicyGroup, per_agent: Mapping[str, Any], xp: Any = np) -> Any:
    """{agent: [N, ...]} -> [N, n_agents, ...] for the group's agents (`xp`: numpy or jax.numpy)."""
    return xp.stack([per_agent[a] for a in group.agents], axis=1)


def unstack(group: PolicyGroup, stacked: Any) -> dict[str, Any]:
    """[N, n_agents, ...] -> {agent: [N, ...]}, the inverse of `stack`."""
    return {agent: stacked[:, i] for i, agent in enumerate(group.agents)}


def add_agent_ids(group: PolicyGroup, obs: Any, xp: Any = np) -> Any:
    """The policy's input from its agents' stacked observations [..., n_agents, d]: each agent's
    observation (as float32) with the one-hot of its index appended, [..., n_agents, d + n];
    unchanged when the group has one agent."""
    if not group.agent_ids:
        return obs
    n = len(group.agents)
    ids = xp.broadcast_to(xp.eye(n, dtype=xp.float32), obs.shape[:-2] + (n, n))
    return xp.concatenate([obs.astype(xp.float32), ids], axis=-1)
