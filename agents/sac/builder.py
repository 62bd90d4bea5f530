"""SAC builder: the one place that wires networks, policy, learner and queue spec."""

from __future__ import annotations

import jax

from trellis.agents.common import AgentBuilder
from trellis.agents.common.params import Params
from trellis.agents.sac.config import SACConfig
from trellis.agents.sac.learner import make_training
from trellis.agents.sac.networks import SACNetworks, make_networks
from trellis.builders.contract.agent import REPLAY, Capabilities, Policy, State, Training
from trellis.envs.specs import EnvSpec


class SACBuilder(AgentBuilder[EnvSpec]):
    """Builder for SAC; acting is SEED-style through the central inference server.

    Inference records plain unrolls (no extras: the critics learn from the squashed action the
    env received); the learner turns them into transitions in its uniform table (see
    agents/sac/learner.py), so builders/ needs nothing SAC-specific.
    """

    config: SACConfig

    def make_networks(self, spec: EnvSpec) -> SACNetworks:
        c = self.config
        return make_networks(spec, c.hidden_sizes, c.log_std_min, c.log_std_max)

    def make_policy(self, networks: SACNetworks, evaluation: bool = False) -> Policy:
        """`policy(params, key, obs[N, D_obs], state, first) -> (actions[N, D], {}, state)`,
        feed-forward (the state stays {}): a sample of the squashed Gaussian when training,
        its squashed mean when evaluating."""
        dist = networks.distribution

        def policy(params: Params, key: jax.Array, obs: jax.Array, state: State,
                   first: jax.Array) -> tuple[jax.Array, dict[str, jax.Array], State]:
            del first  # Feed-forward: nothing to reset.
            mean, log_std = networks.policy(params["policy"], obs)
            if evaluation:
                return dist.mode(mean), {}, state
            action, _ = dist.sample(key, mean, log_std)
            return action, {}, state

        return policy

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(REPLAY, anakin=True)

    def make_training(self, networks: SACNetworks, spec: EnvSpec) -> Training:
        del spec  # The networks already know the shapes.
        return make_training(networks, self.config)
