"""IMPALA builder: the one place that wires networks, policy, learner and queue spec."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from trellis.agents.common import AgentBuilder
from trellis.agents.common.params import Params
from trellis.agents.impala.config import ImpalaConfig
from trellis.agents.impala.learner import make_training
from trellis.agents.impala.networks import ImpalaNetworks, make_networks, num_actions
from trellis.builders.contract.agent import (
    UNROLLS,
    ArraySpec,
    Capabilities,
    Policy,
    State,
    Training,
)
from trellis.envs.specs import EnvSpec


class ImpalaBuilder(AgentBuilder[EnvSpec]):
    """Builder for IMPALA; acting is SEED-style through the central inference server."""

    config: ImpalaConfig

    def make_networks(self, spec: EnvSpec) -> ImpalaNetworks:
        c = self.config
        # Never None in a made config: `ImpalaConfig.__post_init__` put the core's values there.
        assert (c.hidden_sizes is not None and c.normalize_observations is not None
                and c.pixel_torso is not None)
        return make_networks(spec, c.hidden_sizes, c.core, c.lstm_size,
                             c.normalize_observations, c.pixel_torso)

    def initial_state(self, spec: EnvSpec, num_slots: int) -> dict[str, np.ndarray]:
        """The LSTM core's zero state per slot; {} when feed-forward."""
        return self.make_networks(spec).initial_state(num_slots)

    def extras_spec(self, spec: EnvSpec) -> dict[str, ArraySpec]:
        """What the inference server records per step beside the action."""
        return {"logits": ArraySpec((num_actions(spec),), "float32")}

    def make_policy(self, networks: ImpalaNetworks, evaluation: bool = False) -> Policy:
        """`policy(params, key, obs[N, ...], state, first[N]) -> (actions[N], extras, state)`:
        one step of the network (T = 1); greedy when evaluating."""

        def policy(params: Params, key: jax.Array, obs: jax.Array, state: State,
                   first: jax.Array) -> tuple[jax.Array, dict[str, jax.Array], State]:
            logits, _, state = networks.apply(params, obs[None], first[None], state)
            logits = logits[0]  # [N, A]
            if evaluation:
                actions = jnp.argmax(logits, axis=-1)
            else:
                actions = jax.random.categorical(key, logits)
            return actions.astype(jnp.int32), {"logits": logits}, state

        return policy

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(UNROLLS, recurrent=self.config.core == "lstm", anakin=True)

    def make_training(self, networks: ImpalaNetworks, spec: EnvSpec) -> Training:
        del spec  # The networks already know the shapes.
        return make_training(networks, self.config)
