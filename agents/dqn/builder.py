"""DQN/Rainbow builder: the one place that wires networks, policy, learner and queue spec."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from trellis import reverb_tables as rt
from trellis.agents.common import AgentBuilder
from trellis.agents.common.params import Params
from trellis.agents.dqn.config import DQNConfig
from trellis.agents.dqn.learner import make_training
from trellis.agents.dqn.networks import DQNNetworks, make_networks
from trellis.builders.contract.agent import REPLAY, Capabilities, Policy, State, Training
from trellis.envs.specs import EnvSpec


class DQNBuilder(AgentBuilder[EnvSpec]):
    """Builder for DQN, Rainbow and Ape-X; acting is SEED-style through the central inference
    server.

    Inference records plain unrolls (no extras: Q-learning needs only what was seen and
    done); the learner turns them into n-step transitions in its prioritized table (see
    agents/dqn/learner.py), so builders/ needs nothing DQN-specific.
    """

    config: DQNConfig

    def make_networks(self, spec: EnvSpec) -> DQNNetworks:
        return make_networks(spec, self.config)

    def make_policy(self, networks: DQNNetworks, evaluation: bool = False) -> Policy:
        """`policy(params, key, obs[N, ...], state, first) -> (actions[N], {}, state)`,
        feed-forward (the state stays {}): greedy when evaluating (noisy nets: on the mean
        weights), otherwise epsilon-greedy with each row's epsilon from the config's ladder
        (noisy nets: greedy on weights with fresh noise, one sample per call, and epsilon
        on top where the config's is above 0).

        Row r gets ladder entry r mod num_epsilons. The inference server lays out each
        worker's K envs in consecutive rows starting at a multiple of K
        (builders/experiments/inference.py), so when num_epsilons divides K every env slot keeps
        its own epsilon, as Ape-X's actors do; otherwise the assignment still spreads the
        ladder over the envs.
        """
        c = self.config
        ladder = jnp.asarray(c.epsilons, jnp.float32)

        def policy(params: Params, key: jax.Array, obs: jax.Array, state: State,
                   first: jax.Array) -> tuple[jax.Array, dict[str, jax.Array], State]:
            del first  # Feed-forward: nothing to reset.
            if evaluation:  # No key used: an exported policy (ONNX) holds no random ops.
                q_values = networks.q_values(params["q"], obs, None)  # [N, A]
                return jnp.argmax(q_values, axis=-1).astype(jnp.int32), {}, state
            noise_key, key = jax.random.split(key)
            q_values = networks.q_values(params["q"], obs, noise_key if c.noisy else None)
            greedy = jnp.argmax(q_values, axis=-1).astype(jnp.int32)
            n = obs.shape[0]
            epsilon = ladder[jnp.arange(n) % ladder.shape[0]]  # [N]
            if c.epsilon_decay_updates:
                decay = 1.0 - params["updates"] / c.epsilon_decay_updates
                epsilon = jnp.maximum(epsilon, jnp.clip(decay, 0.0, 1.0))
            explore_key, action_key = jax.random.split(key)
            explore = jax.random.uniform(explore_key, (n,)) < epsilon
            random_actions = jax.random.randint(action_key, (n,), 0, networks.num_actions)
            return jnp.where(explore, random_actions, greedy), {}, state

        return policy

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(REPLAY)

    def replay_selector(self) -> rt.Selector:
        """By priority (Schaul et al., 2016): P(i) ~ p_i^priority_exponent; uniform when the
        exponent is 0 (the same distribution, without the sum tree's upkeep)."""
        if self.config.priority_exponent == 0:
            return rt.Uniform()
        return rt.Prioritized(self.config.priority_exponent)

    def make_training(self, networks: DQNNetworks, spec: EnvSpec) -> Training:
        del spec  # The networks already know the shapes.
        return make_training(networks, self.config)
