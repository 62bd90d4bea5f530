"""`AgentBuilder`: what every builder shares."""


from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from typing import Any, Generic

import jax
import numpy as np

from trellis import reverb_tables as rt
from trellis.agents.common.learners import DataParallelLearner, ReplayLearner
from trellis.builders.contract.agent import (
    REPLAY,
    ArraySpec,
    Capabilities,
    ExtrasSpec,
    Learner,
    Policy,
    QueueSpec,
    SpecT,
    Training,
)
from trellis.builders.contract.config import AgentConfig, ReplayConfig
from trellis.envs.specs import EnvSpec


class AgentBuilder(abc.ABC, Generic[SpecT]):
    """What every builder shares (the contract is `builders.contract.agent.Builder`), for envs
    of spec type `SpecT`: `AgentBuilder[EnvSpec]` for single-agent envs,
    `AgentBuilder[MultiAgentSpec]` for multi-agent ones.

    A subclass writes `capabilities`, `make_networks`, `make_policy` and `make_training`
    (and `replay_selector` when it replays transitions by priority), `extras_spec`
    when its policy records something beside the action, and `initial_state` when its policy
    is recurrent. Acting is SEED-style: the central
    inference server runs the policy and records the unrolls.

    Args:
      config: the agent's config; the queue spec comes from its `unroll_length`,
        `batch_size` and `max_queue_size`.
    """

    def __init__(self, config: AgentConfig):
        self.config = config

    def queue_spec(self) -> QueueSpec:
        c = self.config
        return QueueSpec(c.unroll_length, c.batch_size, c.max_queue_size)

    def extras_spec(self, spec: SpecT) -> ExtrasSpec:
        """What inference records per step beside the action: nothing, unless overridden."""
        del spec
        return {}

    def initial_state(self, spec: SpecT, num_slots: int) -> dict[str, np.ndarray]:
        """Every env slot's initial policy state: none ({}, feed-forward) unless overridden."""
        del spec, num_slots
        return {}

    def replay_table(self, signature: Mapping[str, ArraySpec]) -> rt.TableSpec | None:
        """The agent's own replay table: none (unrolls reach the learner in order) unless
        overridden (`builders.contract.agent.Builder.replay_table`)."""
        del signature
        return None

    @abc.abstractmethod
    def make_networks(self, spec: SpecT) -> Any:
        """The agent's networks for an env with `spec`."""

    @abc.abstractmethod
    def make_policy(self, networks: Any, evaluation: bool = False) -> Policy:
        """`policy(params, key, obs[N, ...], state, first[N]) -> (actions[N, ...], extras,
        new_state)` (`builders.contract.agent.Policy`)."""

    @property
    @abc.abstractmethod
    def capabilities(self) -> Capabilities:
        """What the agent can do (`builders.contract.agent.Capabilities`)."""

    @abc.abstractmethod
    def make_training(self, networks: Any, spec: SpecT) -> Training:
        """The pure init and update (`builders.contract.agent.Training`)."""

    def replay_selector(self) -> rt.Selector:
        """How an agent that learns from replay samples its transitions: uniformly unless
        overridden (DQN and D4PG sample by priority)."""
        return rt.Uniform()

    def make_learner(self, networks: Any, spec: SpecT, key: jax.Array, *,
                     devices: Sequence[jax.Device] | None = None,
                     replay: Any = None) -> Learner:
        """`make_training`'s pieces on a device mesh (`builders.contract.agent.Builder.
        make_learner`): fed unrolls in order, or, for an agent that learns from replay, their
        n-step transitions through an in-process table (`ReplayLearner`, `replay_selector`).
        An agent with a replay node of its own (R2D2) overrides it.

        Raises:
          ValueError: a replay client, which these learners have no use for.
          TypeError: an agent that learns from replay whose config is not a `ReplayConfig`, or
            on a multi-agent env (the n-step transitions are one agent's).
        """
        if replay is not None:
            raise ValueError(f"{type(self).__name__} keeps no replay node; it takes no replay "
                             "client")
        training = self.make_training(networks, spec)
        if self.capabilities.learns_from == REPLAY:
            if not isinstance(self.config, ReplayConfig):
                raise TypeError(f"{type(self).__name__} learns from replay: its config must "
                                f"derive from ReplayConfig, got {type(self.config).__name__}")
            if not isinstance(spec, EnvSpec):
                raise TypeError(f"{type(self).__name__} learns from replayed single-agent "
                                f"transitions: it needs an EnvSpec, got {type(spec).__name__}")
            action = ((), "int32") if spec.discrete else (spec.action_shape, "float32")
            return ReplayLearner(training, key, self.config, self.replay_selector(),
                                 obs_spec=(spec.observation_shape, spec.observation_dtype),
                                 action_spec=action, devices=devices)
        return DataParallelLearner(training, key, self.config.batch_size, devices)
