"""The step wire format: what an env worker and central inference exchange per env and step.

An env worker sends its K envs' step as named fields (`StepFormat.inputs`) and gets their
actions back as named fields (`StepFormat.actions`), through the `step` RPC or through shared
slots (`StepFormat.shm_layout`: one byte wakes the server, `REQUEST`, and one byte answers,
`ACTIONS`, `STOPPING` or `FAILED`; a worker's channel opens with its `pack_hello`).
Inference records the fields it saw with what the policy did there (`step_specs`), and the
learner takes the unrolls nested as the agent's kind wants them (`StepFormat.nest`).

Nothing here imports JAX: env workers import this module, and importing JAX costs each of
them 1-2 s of start-up.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np

from trellis.builders.contract.agent import ArraySpec, state_specs
from trellis.envs.multi_agent import MultiAgentSpec, MultiAgentStep
from trellis.envs.specs import EnvSpec
from trellis.launch.runtime import shm

# The one-byte messages of a shared-memory step: the worker's request, the server's answers.
REQUEST, ACTIONS, STOPPING, FAILED = 1, 2, 3, 4
Episode = tuple[float, int]  # (return, length); multi-agent: the team's return (all agents').

_PER_AGENT = ("obs", "reward", "terminated", "truncated", "alive")


@dataclasses.dataclass(frozen=True)
class StepFormat:
    """What an env worker and inference exchange per env and step, as named fields.

    Single-agent: the inputs obs, reward, terminated, truncated, first; the action `action`.
    Multi-agent (envs/multi_agent.py): `MultiAgentStep`'s fields flattened by agent,
    `<field>/<agent>` (obs, reward, terminated, truncated, alive), then `first` and, where the
    env has one, `global_state`; the actions `action/<agent>`, and the policy's extras, per
    agent too, `<extra>/<agent>`. A finished episode is reported as (return, length),
    multi-agent with the team's return, the sum over agents (as the anakin platform counts it,
    envs/jax_multi_agent.TeamEnv).

    Attributes:
      inputs: {field: spec of one env's value}, in order.
      actions: {field: spec of one env's action}.
      agents: the agent ids (multi-agent), or ().
    """

    inputs: Mapping[str, ArraySpec]
    actions: Mapping[str, ArraySpec]
    agents: tuple[str, ...] = ()

    @property
    def multi_agent(self) -> bool:
        return bool(self.agents)

    def env_actions(self, fields: Mapping[str, Any]) -> Any:
        """The actions the envs take from the action fields: [K, ...], or {agent: [K, ...]}."""
        if not self.multi_agent:
            return fields["action"]
        return {agent: fields[f"action/{agent}"] for agent in self.agents}

    def action_fields(self, actions: Any) -> dict[str, Any]:
        """The inverse of `env_actions`: the policy's actions as named fields."""
        if not self.multi_agent:
            return {"action": actions}
        return {f"action/{agent}": actions[agent] for agent in self.agents}

    def extras_specs(self, extras: Mapping[str, Any]) -> dict[str, ArraySpec]:
        """The recorded fields of the policy's extras (`Builder.extras_spec`): multi-agent,
        one per extra and agent, each extra's spec the same for every agent or given per
        agent ({agent: ArraySpec}, e.g. logits of agents with different actions)."""
        if not self.multi_agent:
            return dict(extras)
        return {f"{name}/{agent}": s if isinstance(s, ArraySpec) else s[agent]
                for name, s in extras.items() for agent in self.agents}

    def extras_fields(self, extras: Mapping[str, Any]) -> dict[str, Any]:
        """The policy's extras as recorded fields: multi-agent, {name: {agent: [N, ...]}}
        flattened to `<name>/<agent>`."""
        if not self.multi_agent:
            return dict(extras)
        return {f"{name}/{agent}": v for name, per_agent in extras.items()
                for agent, v in per_agent.items()}

    def nest(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        """Recorded unrolls {field: [T + 1, B, ...]} as a multi-agent learner takes them (and
        the anakin program gives them): `obs` the `MultiAgentStep`, `first`, and every other
        per-agent field {name: {agent: ...}} (`action`, the extras); fields of neither kind
        (the policy's `state/` fields) as they are. Single-agent batches are unchanged."""
        if not self.multi_agent:
            return dict(batch)
        nested: dict[str, Any] = {"obs": self.policy_obs(batch), "first": batch["first"]}
        taken = set(self.inputs)
        for name, value in batch.items():
            prefix, _, agent = name.rpartition("/")
            if name in taken:
                continue
            if agent in self.agents and prefix:
                nested.setdefault(prefix, {})[agent] = value
            else:
                nested[name] = value
        return nested

    def policy_obs(self, inputs: Mapping[str, Any]) -> Any:
        """What the policy's `obs` argument is: the observations [N, ...], or, multi-agent,
        the step's fields as a `MultiAgentStep` of {agent: [N, ...]} (its `first` and
        `global_state` included)."""
        if not self.multi_agent:
            return inputs["obs"]

        def per_agent(name: str) -> dict[str, Any]:
            return {agent: inputs[f"{name}/{agent}"] for agent in self.agents}

        return MultiAgentStep(
            obs=per_agent("obs"), reward=per_agent("reward"),
            terminated=per_agent("terminated"), truncated=per_agent("truncated"),
            alive=per_agent("alive"), first=inputs["first"],
            global_state=inputs.get("global_state"))

    def flatten(self, step: MultiAgentStep) -> dict[str, np.ndarray]:
        """A multi-agent env's step as the input fields."""
        fields = {f"{name}/{agent}": getattr(step, name)[agent] for name in _PER_AGENT
                  for agent in self.agents}
        fields["first"] = step.first
        if step.global_state is not None:
            fields["global_state"] = step.global_state
        return fields

    def shm_layout(self, num_envs: int) -> shm.Layout:
        """The shared slots of one worker of `num_envs` envs: its step's inputs, finished
        episodes, the actions back.

        `episodes` holds (return, length) of the episodes that ended, in its first
        `num_episodes` rows.
        """
        layout = {name: ((num_envs, *s.shape), s.dtype) for name, s in self.inputs.items()}
        layout["episodes"] = ((num_envs, 2), "float64")
        layout["num_episodes"] = ((), "int64")
        layout.update({name: ((num_envs, *s.shape), s.dtype) for name, s in self.actions.items()})
        return layout


def step_format(spec: EnvSpec | MultiAgentSpec) -> StepFormat:
    """The fields of a worker's step for envs of `spec` (see `StepFormat`)."""
    flag, reward = ArraySpec((), "bool"), ArraySpec((), "float32")
    if isinstance(spec, EnvSpec):
        return StepFormat(
            {"obs": ArraySpec(spec.observation_shape, spec.observation_dtype), "reward": reward,
             "terminated": flag, "truncated": flag, "first": flag},
            {"action": ArraySpec(spec.action_shape, spec.action_dtype)})
    per_agent = {"obs": lambda s: ArraySpec(s.observation_shape, s.observation_dtype),
                 "reward": lambda s: reward, "terminated": lambda s: flag,
                 "truncated": lambda s: flag, "alive": lambda s: flag}
    inputs = {f"{name}/{agent}": per_agent[name](spec.specs[agent]) for name in _PER_AGENT
              for agent in spec.agents}
    inputs["first"] = flag
    if spec.global_state_shape is not None:
        inputs["global_state"] = ArraySpec(spec.global_state_shape, "float32")
    actions = {f"action/{agent}": ArraySpec(s.action_shape, s.action_dtype)
               for agent, s in spec.specs.items()}
    return StepFormat(inputs, actions, spec.agents)


def step_specs(spec: EnvSpec | MultiAgentSpec, extras: Mapping[str, Any],
               initial_state: Mapping[str, np.ndarray] | None = None) -> dict[str, ArraySpec]:
    """The fields of one recorded step, as stored in unrolls.

    What the env worker sent (`StepFormat.inputs`: the observation and how it was reached:
    reward, terminated, truncated, first; multi-agent, those per agent with `alive`, and the
    global state), what the policy did there (the action fields, extras) and, for a stateful
    policy, the fields `state/<name>` of its state (`Builder.initial_state` rows give their
    specs), recorded once per unroll.
    """
    fmt = step_format(spec)
    return {**fmt.inputs, **fmt.actions, **fmt.extras_specs(extras),
            **state_specs(initial_state or {})}


def pack_hello(worker_id: int, run_id: int) -> bytes:
    """What a worker's shared-memory channel opens with: who steps, in which run."""
    return struct.pack("!qq", worker_id, run_id)


def unpack_hello(hello: bytes) -> tuple[int, int]:
    """(worker_id, run_id) of a channel's hello."""
    worker_id, run_id = struct.unpack("!qq", hello)
    return worker_id, run_id
