"""TD3 builder: the one place that wires networks, policy, learner and queue spec."""

from __future__ import annotations

from trellis.agents.common import AgentBuilder
from trellis.agents.common.continuous import deterministic_policy
from trellis.agents.td3.config import TD3Config
from trellis.agents.td3.learner import make_training
from trellis.agents.td3.networks import TD3Networks, make_networks
from trellis.builders.contract.agent import REPLAY, Capabilities, Policy, Training
from trellis.envs.specs import EnvSpec


class TD3Builder(AgentBuilder[EnvSpec]):
    """Builder for TD3 and DDPG (its preset); acting is SEED-style through central inference.

    Inference records plain unrolls; the learner turns them into transitions in its uniform
    table (agents/td3/learner.py).
    """

    config: TD3Config

    def make_networks(self, spec: EnvSpec) -> TD3Networks:
        c = self.config
        return make_networks(spec, c.hidden_sizes, 2 if c.twin_critics else 1,
                             "TD3" if c.twin_critics else "DDPG")

    def make_policy(self, networks: TD3Networks, evaluation: bool = False) -> Policy:
        """mu(s) plus Gaussian exploration noise when training, mu(s) when evaluating
        (`agents.common.continuous.deterministic_policy`)."""
        return deterministic_policy(networks.policy, networks.bounds,
                                    self.config.exploration_noise, evaluation)

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(REPLAY, anakin=True)

    def make_training(self, networks: TD3Networks, spec: EnvSpec) -> Training:
        del spec  # The networks already know the shapes.
        return make_training(networks, self.config)
