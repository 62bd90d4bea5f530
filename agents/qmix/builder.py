"""QMIX's and VDN's builder: the one place that wires networks, policy and learner."""

from __future__ import annotations

import jax

from trellis.agents.common import AgentBuilder
from trellis.agents.common.multi_agent import per_policy_policy
from trellis.agents.common.params import Params
from trellis.agents.common.q_learning import epsilon_greedy, linear_epsilon
from trellis.agents.qmix.config import QMIXConfig
from trellis.agents.qmix.learner import make_training
from trellis.agents.qmix.networks import QMIXNetworks, QNetwork, make_networks
from trellis.builders.contract.agent import UNROLLS, Capabilities, Policy, State, Training
from trellis.envs.multi_agent import MultiAgentSpec


class QMIXBuilder(AgentBuilder[MultiAgentSpec]):
    """Builder of QMIX and VDN (`config.mixer`) on cooperative multi-agent envs: a gradient
    agent on unrolls in order (no replay table, no target network), on anakin (JaxMARL) and
    on the host platforms (PettingZoo), each agent acting with its policy's Q-network
    (builders/contract/policy_mapping.py).

    Nothing is recorded beside the actions: the learner computes the team's bootstrap values
    itself (the mixer needs every agent's Q and the global state). The policy reads
    `{policy: {"q": params, "env_steps": n}}` (`learner.acting_params`), so epsilon's schedule
    follows the env steps learned from on every platform.
    """

    config: QMIXConfig

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(UNROLLS, anakin=True, multi_agent=True)

    def make_networks(self, spec: MultiAgentSpec) -> QMIXNetworks:
        return make_networks(spec, self.config)

    def make_policy(self, networks: QMIXNetworks, evaluation: bool = False) -> Policy:
        """`policy(params, key, step, state, first) -> ({agent: actions [N]}, {}, state)` on N
        envs' `MultiAgentStep`: each agent epsilon-greedy on its policy's Q (one epsilon for
        all, from the schedule), greedy when evaluating."""
        return per_policy_policy(networks, {
            policy: self._agent_policy(q, evaluation) for policy, q in networks.q.items()})

    def _agent_policy(self, network: QNetwork, evaluation: bool) -> Policy:
        c = self.config

        def policy(params: Params, key: jax.Array, x: jax.Array, state: State,
                   first: jax.Array) -> tuple[jax.Array, dict[str, jax.Array], State]:
            del first  # Feed-forward: nothing to reset.
            q_values = network.apply(params["q"], x)  # [rows, A]
            epsilon = (0.0 if evaluation else linear_epsilon(
                params["env_steps"], c.epsilon_start, c.epsilon_finish,
                c.epsilon_decay_env_steps))
            return epsilon_greedy(key, q_values, epsilon), {}, state

        return policy

    def make_training(self, networks: QMIXNetworks, spec: MultiAgentSpec) -> Training:
        del spec  # The networks know the groups and shapes.
        return make_training(networks, self.config)
