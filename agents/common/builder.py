"""`AgentBuilder`: what every builder shares."""


from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from trellis import reverb_tables as rt
from trellis.builders.contract.agent import ArraySpec, Learner, Policy, QueueSpec
from trellis.builders.contract.config import AgentConfig
from trellis.envs.specs import EnvSpec


class AgentBuilder(abc.ABC):
    """What every builder shares (the contract is `builders.base.Builder`).

    A subclass writes `make_networks`, `make_policy` and `make_learner`, `extras_spec`
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

    def extras_spec(self, spec: EnvSpec) -> dict[str, ArraySpec]:
        """What inference records per step beside the action: nothing, unless overridden."""
        del spec
        return {}

    def initial_state(self, spec: EnvSpec, num_slots: int) -> dict[str, np.ndarray]:
        """Every env slot's initial policy state: none ({}, feed-forward) unless overridden."""
        del spec, num_slots
        return {}

    def replay_table(self, signature: Mapping[str, ArraySpec]) -> rt.TableSpec | None:
        """The agent's own replay table: none (unrolls reach the learner in order) unless
        overridden (`builders.base.Builder.replay_table`)."""
        del signature
        return None

    @abc.abstractmethod
    def make_networks(self, spec: EnvSpec) -> Any:
        """The agent's networks for an env with `spec`."""

    @abc.abstractmethod
    def make_policy(self, networks: Any, evaluation: bool = False) -> Policy:
        """`policy(params, key, obs[N, ...], state, first[N]) -> (actions[N, ...], extras,
        new_state)` (`builders.base.Policy`)."""

    @abc.abstractmethod
    def make_learner(self, networks: Any, spec: EnvSpec, key: jax.Array) -> Learner:
        """The learner, owning the training state, seeded from `key`."""
