"""MPO builder: the one place that wires networks, policy, learner and queue spec."""

from __future__ import annotations

import jax

from trellis.agents.common import AgentBuilder
from trellis.agents.common.params import Params
from trellis.agents.mpo.config import MPOConfig
from trellis.agents.mpo.learner import make_training
from trellis.agents.mpo.networks import MPONetworks, make_networks
from trellis.builders.contract.agent import REPLAY, Capabilities, Policy, State, Training
from trellis.envs.specs import EnvSpec


class MPOBuilder(AgentBuilder[EnvSpec]):
    """Builder for MPO; acting is SEED-style through the central inference server.

    Inference records plain unrolls of the actions the env received; the learner turns them
    into n-step transitions in its uniform table (agents/mpo/learner.py), as SAC's does.
    """

    config: MPOConfig

    def make_networks(self, spec: EnvSpec) -> MPONetworks:
        c = self.config
        return make_networks(spec, c.hidden_sizes, c.init_scale, c.min_scale)

    def make_policy(self, networks: MPONetworks, evaluation: bool = False) -> Policy:
        """`policy(params, key, obs[N, D_obs], state, first) -> (actions[N, D], {}, state)`,
        feed-forward (the state stays {}): a sample of the Gaussian clipped into the bounds
        when training, its mean (clipped) when evaluating."""

        def policy(params: Params, key: jax.Array, obs: jax.Array, state: State,
                   first: jax.Array) -> tuple[jax.Array, dict[str, jax.Array], State]:
            del first  # Feed-forward: nothing to reset.
            mean, std = networks.policy(params["policy"], obs)
            if evaluation:
                return networks.to_env(mean), {}, state
            action = mean + std * jax.random.normal(key, mean.shape, mean.dtype)
            return networks.to_env(action), {}, state

        return policy

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(REPLAY, anakin=True)

    def make_training(self, networks: MPONetworks, spec: EnvSpec) -> Training:
        del spec  # The networks already know the shapes.
        return make_training(networks, self.config)
