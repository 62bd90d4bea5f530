"""IMPALA builder: the one place that wires networks, policy, learner and queue spec."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from trellis.agents.common import AgentBuilder
from trellis.agents.impala.config import ImpalaConfig
from trellis.agents.impala.learner import Learner
from trellis.agents.impala.networks import ImpalaNetworks, make_networks
from trellis.builders.base import ArraySpec
from trellis.envs.specs import EnvSpec


class ImpalaBuilder(AgentBuilder):
    """Builder for IMPALA; acting is SEED-style through the central inference server."""

    config: ImpalaConfig

    def make_networks(self, spec: EnvSpec) -> ImpalaNetworks:
        return make_networks(spec, self.config.hidden_sizes)

    def extras_spec(self, spec: EnvSpec) -> dict[str, ArraySpec]:
        """What the inference server records per step beside the action."""
        return {"logits": ArraySpec((spec.num_actions,), "float32")}

    def make_policy(self, networks: ImpalaNetworks, evaluation: bool = False):
        """`policy(params, key, obs[N, ...]) -> (actions[N], extras)`; greedy when evaluating."""

        def policy(params, key, obs):
            logits, _ = networks.apply(params, obs)
            if evaluation:
                actions = jnp.argmax(logits, axis=-1)
            else:
                actions = jax.random.categorical(key, logits)
            return actions.astype(jnp.int32), {"logits": logits}

        return policy

    def make_learner(self, networks: ImpalaNetworks, spec: EnvSpec, key: jax.Array) -> Learner:
        del spec  # The networks already know the shapes.
        return Learner(networks, self.config, key)
