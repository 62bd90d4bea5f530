"""D4PG builder: the one place that wires networks, policy, learner and queue spec."""

from __future__ import annotations

from trellis import reverb_tables as rt
from trellis.agents.common import AgentBuilder
from trellis.agents.common.continuous import deterministic_policy
from trellis.agents.d4pg.config import D4PGConfig
from trellis.agents.d4pg.learner import make_training
from trellis.agents.d4pg.networks import D4PGNetworks, make_networks
from trellis.builders.contract.agent import REPLAY, Capabilities, Policy, Training
from trellis.envs.specs import EnvSpec


class D4PGBuilder(AgentBuilder[EnvSpec]):
    """Builder for D4PG; acting is SEED-style through central inference, every env worker one
    of the paper's distributed actors. Inference records plain unrolls; the learner turns them
    into N-step transitions in its table (agents/d4pg/learner.py)."""

    config: D4PGConfig

    def make_networks(self, spec: EnvSpec) -> D4PGNetworks:
        c = self.config
        return make_networks(spec, c.hidden_sizes, c.num_atoms, c.v_min, c.v_max)

    def make_policy(self, networks: D4PGNetworks, evaluation: bool = False) -> Policy:
        """mu(s) plus Gaussian exploration noise when training, mu(s) when evaluating
        (`agents.common.continuous.deterministic_policy`)."""
        return deterministic_policy(networks.policy, networks.bounds,
                                    self.config.exploration_noise, evaluation)

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(REPLAY)

    def replay_selector(self) -> rt.Selector:
        """By priority with `priority_exponent` > 0 (the paper's prioritized variant)."""
        c = self.config
        return rt.Prioritized(c.priority_exponent) if c.prioritized else rt.Uniform()

    def make_training(self, networks: D4PGNetworks, spec: EnvSpec) -> Training:
        del spec  # The networks already know the shapes.
        return make_training(networks, self.config)
