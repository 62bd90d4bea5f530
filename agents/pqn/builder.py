"""PQN builder: the one place that wires networks, policy and learner."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from trellis.agents.common import AgentBuilder
from trellis.agents.common.params import Params
from trellis.agents.common.q_learning import epsilon_greedy, linear_epsilon
from trellis.agents.pqn.config import PQNConfig
from trellis.agents.pqn.learner import make_training
from trellis.agents.pqn.networks import PQNNetworks, make_networks
from trellis.builders.contract.agent import (
    UNROLLS,
    ArraySpec,
    Capabilities,
    Policy,
    State,
    Training,
)
from trellis.envs.specs import EnvSpec


class PQNBuilder(AgentBuilder[EnvSpec]):
    """Builder for PQN: a gradient agent on inference's unrolls in order (no replay table, no
    target network), on anakin (one jitted program with JAX envs) and on the host platforms
    (env workers' unrolls through the central inference server).

    Inference records the max Q-value beside the action (`q_max`, the learner's bootstrap
    values: the targets need no forward pass of their own). The policy reads
    `{"q": params, "env_steps": n}` (`learner.acting_params`), so epsilon's schedule follows
    the env steps learned from on every platform.
    """

    config: PQNConfig

    def make_networks(self, spec: EnvSpec) -> PQNNetworks:
        return make_networks(spec, self.config.hidden_sizes)

    def make_policy(self, networks: PQNNetworks, evaluation: bool = False) -> Policy:
        """`policy(params, key, obs[N, ...], state, first) -> (actions[N], {"q_max": [N]},
        state)`,
        feed-forward (the state stays {}): epsilon-greedy with every env's epsilon from the
        schedule (`q_learning.linear_epsilon`), greedy when evaluating."""
        c = self.config

        def policy(params: Params, key: jax.Array, obs: jax.Array, state: State,
                   first: jax.Array) -> tuple[jax.Array, dict[str, jax.Array], State]:
            del first  # Feed-forward: nothing to reset.
            q_values = networks.apply(params["q"], obs)  # [N, A]
            greedy = jnp.argmax(q_values, axis=-1).astype(jnp.int32)
            extras = {"q_max": jnp.max(q_values, axis=-1)}
            if evaluation:
                return greedy, extras, state
            epsilon = linear_epsilon(params["env_steps"], c.epsilon_start, c.epsilon_finish,
                                     c.epsilon_decay_env_steps)
            return epsilon_greedy(key, q_values, epsilon), extras, state

        return policy

    def extras_spec(self, spec: EnvSpec) -> dict[str, ArraySpec]:
        """What inference records per step beside the action: max_a Q(obs, a)."""
        del spec
        return {"q_max": ArraySpec((), "float32")}

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(UNROLLS, anakin=True)

    def make_training(self, networks: PQNNetworks, spec: EnvSpec) -> Training:
        del spec  # The networks already know the shapes.
        return make_training(networks, self.config)
