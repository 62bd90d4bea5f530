"""PPO builder: the one place that wires networks, policy, learner and queue spec."""

from __future__ import annotations

import jax

from trellis.agents.common import AgentBuilder
from trellis.agents.common.params import Params
from trellis.agents.ppo.config import PPOConfig
from trellis.agents.ppo.learner import make_training
from trellis.agents.ppo.networks import DiagonalGaussian, PPONetworks, make_networks
from trellis.builders.contract.agent import (
    UNROLLS,
    ArraySpec,
    Capabilities,
    Policy,
    State,
    Training,
)
from trellis.envs.specs import EnvSpec


class PPOBuilder(AgentBuilder[EnvSpec]):
    """Builder for PPO; acting is SEED-style through the central inference server.

    PPO is on-policy: the learner's bounded queue (`max_queue_size` batches) keeps the data
    at most a few updates old, and the clipped ratio against the recorded behaviour
    log-probability keeps what lag there is harmless.
    """

    config: PPOConfig

    def make_networks(self, spec: EnvSpec) -> PPONetworks:
        c = self.config
        return make_networks(spec, c.hidden_sizes, c.normalize_observations, c.pixel_torso,
                             c.shared_torso)

    def extras_spec(self, spec: EnvSpec) -> dict[str, ArraySpec]:
        """What the inference server records per step beside the action.

        The behaviour log-probability (for the ratio) and value (for GAE and value
        clipping); for Gaussian policies also the unclipped sample, which the
        log-probability refers to (the env gets it clipped to its bounds).
        """
        extras = {"log_prob": ArraySpec((), "float32"), "value": ArraySpec((), "float32")}
        if spec.num_actions is None:
            extras[DiagonalGaussian.learn_field] = ArraySpec(spec.action_shape, "float32")
        return extras

    def make_policy(self, networks: PPONetworks, evaluation: bool = False) -> Policy:
        """`policy(params, key, obs[N, ...], state, first) -> (actions[N, ...], extras,
        state)`, feed-forward (the state stays {}); the distribution's mode when evaluating."""
        distribution = networks.distribution

        def policy(params: Params, key: jax.Array, obs: jax.Array, state: State,
                   first: jax.Array) -> tuple[jax.Array, dict[str, jax.Array], State]:
            del first  # Feed-forward: nothing to reset.
            dist_params, value = networks.apply(params, obs)
            if evaluation:
                action = learn_action = distribution.mode(dist_params)
            else:
                action, learn_action = distribution.sample(key, dist_params)
            extras = {"log_prob": distribution.log_prob(dist_params, learn_action),
                      "value": value}
            if distribution.learn_field != "action":
                extras[distribution.learn_field] = learn_action
            return action, extras, state

        return policy

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(UNROLLS, anakin=True)

    def make_training(self, networks: PPONetworks, spec: EnvSpec) -> Training:
        del spec  # The networks already know the shapes.
        return make_training(networks, self.config)
