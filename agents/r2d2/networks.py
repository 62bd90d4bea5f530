"""R2D2 network: a torso, the shared LSTM core and a dueling Q head (Kapturowski et al.,
2019, section 2.3; Wang et al., 2016)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from trellis.agents.common import LSTMCore, lstm_initial_state, make_torso
from trellis.agents.common.params import Params, pure_apply
from trellis.envs.specs import EnvSpec


class RecurrentQNet(nn.Module):
    """torso -> LSTM (restarting at `first`) -> Q(s, a) = V(s) + A(s, a) - mean_a A(s, a).

    Call: `(state, obs[T, B, ...], first[T, B]) -> (new_state, q[T, B, A])`.
    """

    num_actions: int
    torso: nn.Module
    lstm_size: int

    @nn.compact
    def __call__(self, state: Mapping[str, jax.Array], obs: jax.Array, first: jax.Array
                 ) -> tuple[dict[str, jax.Array], jax.Array]:
        x = self.torso(obs)  # [T, B, D]
        state, y = LSTMCore(self.lstm_size)(state, x, first)  # [T, B, H]
        value = nn.Dense(1)(y)  # [T, B, 1]
        advantages = nn.Dense(self.num_actions)(y)  # [T, B, A]
        # Subtracting the mean advantage makes V and A identifiable (Wang et al., eq. 9).
        return state, value + advantages - jnp.mean(advantages, axis=-1, keepdims=True)


@dataclasses.dataclass(frozen=True)
class R2D2Networks:
    """Pure functions of the network.

    Attributes:
      init: `init(key) -> params`.
      apply: `apply(params, state, obs[T, B, ...], first[T, B]) -> (state, q[T, B, A])`, with
        `state` = {"c", "h": [B, H]} (other keys are ignored and not returned).
      initial_state: `initial_state(num_slots) -> {"c", "h": [num_slots, H]}`, zeros.
      num_actions: A.
    """

    init: Callable[[jax.Array], Params]
    apply: Callable[[Params, Mapping[str, jax.Array], jax.Array, jax.Array],
                    tuple[dict[str, jax.Array], jax.Array]]
    initial_state: Callable[[int], dict[str, np.ndarray]]
    num_actions: int


def make_networks(spec: EnvSpec, hidden_sizes: Sequence[int], lstm_size: int) -> R2D2Networks:
    """Raises ValueError for continuous actions (Q-learning needs a finite action set)."""
    if spec.num_actions is None:
        raise ValueError("R2D2 needs discrete actions; use --agent=ppo or sac for Box actions.")
    net = RecurrentQNet(spec.num_actions, make_torso(spec, hidden_sizes), lstm_size)

    def initial_state(num_slots: int) -> dict[str, np.ndarray]:
        return lstm_initial_state(num_slots, lstm_size)

    def init(key: jax.Array) -> Params:
        obs = jnp.zeros((1, 1) + spec.observation_shape, spec.observation_dtype)
        return net.init(key, initial_state(1), obs, jnp.ones((1, 1), bool))

    return R2D2Networks(init=init, apply=pure_apply(net), initial_state=initial_state,
                        num_actions=spec.num_actions)
