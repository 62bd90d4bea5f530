"""Multi-agent envs: the spec and the array convention every platform and agent shares.

Several agents act in one env at each step. Every multi-agent env in Trellis, on the device
(JaxMARL's envs, envs/jaxmarl_envs.py; the warehouses example, envs/warehouses.py) or on the
host (PettingZoo's parallel API), is seen through this one convention, so that the anakin
program, the env workers and the learners agree on it.

The spec (`MultiAgentSpec`):
  - `agents`: every agent id the env can have, in a fixed order (PettingZoo's
    `possible_agents`). Arrays keyed by agent always hold every one of them, whether the agent
    is in the episode or not.
  - `specs`: {agent: EnvSpec}, each agent's observation and action space as for a
    single-agent env (envs/specs.py), so a single-agent network can be built for it.
  - `global_state_shape`: the shape of the env's global state (float32), what a centralised
    critic sees (JaxMARL's `world_state`, PettingZoo's `state()`); None when the env has none.

One step (`MultiAgentStep`) of N envs, each field keyed by agent id with the env axis first:
  - `obs[agent]`: [N, *obs_shape], the agent's observation of the state reached.
  - `reward[agent]`: [N] float32, the reward for the step that reached it.
  - `terminated[agent]`, `truncated[agent]`: [N] bool, the agent's episode ended on this step
    (terminated: its MDP ended, no bootstrap; truncated: a time limit, bootstrap from `obs`).
  - `alive[agent]`: [N] bool, the agent acts on this step: it is in the episode and has not
    finished. An agent that finished early (or has not joined yet) stays in every array, masked:
    `alive` False, reward 0, its obs zeros, its actions ignored. A transition (obs_t, action_t,
    reward_t+1, terminated_t+1) is learned from only where `alive_t`; the step on which an agent
    finishes still carries its last reward and its terminal observation.
  - `first`: [N] bool, per env: this step starts an episode (every agent's reward 0, `alive`
    True for the agents the episode starts with).
  - `global_state`: [N, *global_state_shape], or None when the spec has none.

The episode of an env ends when every agent has finished (`episode_done`). Autoreset is on the
next step, as for single-agent envs (envs/jax_env.py): the step after an episode's end resets
that env, ignores the actions and gives the new episode's first step.

Actions are {agent: [N, *action_shape]} in the dtype of the agent's EnvSpec; every agent id is
present (a masked agent's action is ignored).

A multi-agent env factory (an envs/contract.EnvFactory, like the single-agent ones) declares
`players = Players.MULTI_AGENT` and gives `spec() -> MultiAgentSpec`; the session refuses a
single-agent agent on it, and the reverse (`Capabilities.multi_agent`,
builders/experiments/session.check_supported). A JAX one's `make()` gives an env with pure
`reset(key) -> (state, MultiAgentStep)` and `step(key, state, actions) -> (state,
MultiAgentStep)` for one env (unbatched: the fields without the env axis), vmapped and scanned
by the anakin program; `envs.registry.register_jax_multi_agent` gives an id to one of your own.

Which agent acts with which policy is the policy mapping's concern
(builders/contract/policy_mapping.py), not the env's.

This module imports neither JAX nor numpy at use: `MultiAgentStep` is a NamedTuple, so it is a
pytree of JAX arrays on the device and a record of numpy arrays in an env worker alike.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, NamedTuple

from trellis.envs.specs import EnvSpec


class MultiAgentSpecError(ValueError):
    """A multi-agent spec that does not hold together (one line: what, the value, what works)."""


@dataclasses.dataclass(frozen=True, eq=True)
class MultiAgentSpec:
    """Shapes and dtypes of one (unbatched) multi-agent env: see the module docstring.

    Attributes:
      agents: every agent id the env can have, in a fixed order (PettingZoo's possible_agents).
      specs: {agent: EnvSpec}, the observation and action space of each agent.
      global_state_shape: the shape of the env's global state (float32), or None.

    Raises:
      MultiAgentSpecError: no agents, repeated ids, or `specs` not keyed by exactly `agents`.
    """

    agents: tuple[str, ...]
    specs: Mapping[str, EnvSpec]
    global_state_shape: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if not self.agents:
            raise MultiAgentSpecError("a multi-agent env needs at least one agent, got none")
        if len(set(self.agents)) != len(self.agents):
            raise MultiAgentSpecError(f"agent ids must be unique, got {list(self.agents)}")
        if set(self.specs) != set(self.agents):
            raise MultiAgentSpecError(
                f"specs must be keyed by the agents {list(self.agents)}, got {list(self.specs)}")

    @property
    def num_agents(self) -> int:
        return len(self.agents)

    @property
    def has_global_state(self) -> bool:
        return self.global_state_shape is not None

    def __hash__(self) -> int:  # `specs` is a dict; the agents and their specs identify it.
        return hash((self.agents, tuple(self.specs[a] for a in self.agents),
                     self.global_state_shape))


class MultiAgentStep(NamedTuple):
    """One step of N envs, fields keyed by agent id with the env axis first (module docstring).

    A NamedTuple, so a pytree under JAX and a plain record on the host.
    """

    obs: Mapping[str, Any]  # {agent: [N, *obs_shape]}
    reward: Mapping[str, Any]  # {agent: [N]} float32
    terminated: Mapping[str, Any]  # {agent: [N]} bool
    truncated: Mapping[str, Any]  # {agent: [N]} bool
    alive: Mapping[str, Any]  # {agent: [N]} bool: the agent acts on this step
    first: Any  # [N] bool: an episode starts here
    global_state: Any = None  # [N, *global_state_shape], or None


def episode_done(step: MultiAgentStep, agents: tuple[str, ...]) -> Any:
    """[N] bool: each env's episode ended on this step: no agent acts any more (an agent that
    finishes on a step is no longer `alive` on it)."""
    done = ~step.alive[agents[0]]
    for agent in agents[1:]:
        done = done & ~step.alive[agent]
    return done
