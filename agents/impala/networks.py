"""IMPALA networks: a torso, an optional LSTM core, a policy head (logits) and a value head.

Every network here is time-major and carries a state, so the acting policy (T = 1) and the
learner ([T + 1, B] unrolls) call the same function; the feed-forward one has an empty state.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

import flax.linen as nn
import jax
import numpy as np

from trellis.agents.common import (
    LSTMCore,
    ObservationNormalizer,
    lstm_initial_state,
    make_torso,
)
from trellis.agents.common.params import Params, pure_apply
from trellis.envs.specs import EnvSpec

State = Mapping[str, jax.Array]


class PolicyValueNet(nn.Module):
    """torso -> [LSTM core] -> logits and value, on [T, B, ...] observations.

    `__call__(obs[T, B, ...], first[T, B], state) -> (logits[T, B, A], value[T, B], state)`;
    without a core (`lstm_size` 0) `first` is unused and the state is returned as given ({}).
    With a `normalizer` (`ObservationNormalizer`) the variables hold its running moments in
    the collection "obs_norm" beside "params".
    """

    num_actions: int
    torso: nn.Module
    lstm_size: int = 0
    normalizer: nn.Module | None = None

    @nn.compact
    def __call__(self, obs: jax.Array, first: jax.Array, state: State
                 ) -> tuple[jax.Array, jax.Array, State]:
        if self.normalizer is not None:
            obs = self.normalizer(obs)
        h = self.torso(obs)  # [T, B, F]
        if self.lstm_size:
            state, h = LSTMCore(self.lstm_size)(state, h, first)
        logits = nn.Dense(self.num_actions, kernel_init=nn.initializers.orthogonal(0.01))(h)
        value = nn.Dense(1, kernel_init=nn.initializers.orthogonal(1.0))(h)[..., 0]
        return logits, value, state


@dataclasses.dataclass(frozen=True)
class ImpalaNetworks:
    """Pure functions of the IMPALA network.

    `init(key) -> params`; `apply(params, obs[T, B, ...], first[T, B], state) -> (logits
    [T, B, A], values [T, B], state)`, the state {name: [B, ...]} taken before step 0 and
    returned after step T - 1; `initial_state(n) -> {name: [n, ...]}` (numpy; {} without core).
    """

    init: Callable[[jax.Array], Params]
    apply: Callable[[Params, jax.Array, jax.Array, State], tuple[jax.Array, jax.Array, State]]
    initial_state: Callable[[int], dict[str, np.ndarray]]


def num_actions(spec: EnvSpec) -> int:
    """The number of discrete actions of `spec`, the size of the policy's logits.

    Raises:
      ValueError: the action space is not discrete.
    """
    if spec.num_actions is None:
        raise ValueError("IMPALA here handles discrete actions; use --agent=sac or ppo for Box.")
    return spec.num_actions


def make_networks(spec: EnvSpec, hidden_sizes: Sequence[int], core: str = "none",
                  lstm_size: int = 128, normalize_observations: bool = False,
                  pixel_torso: str = "nature") -> ImpalaNetworks:
    """The IMPALA network for `spec`.

    Args:
      spec: the env's spec (discrete actions).
      hidden_sizes: the MLP torso's widths (vector observations).
      core: "none" (feed-forward) or "lstm".
      lstm_size: the LSTM's width.
      normalize_observations: normalize vector observations by running moments that the
        learner keeps in the variables' "obs_norm" collection (ignored for pixels).
      pixel_torso: "nature" (the DQN paper's conv torso), "resnet" (the IMPALA paper's deep
        residual torso) or "minatar" (the MinAtar paper's) for pixel observations.

    Raises:
      ValueError: the action space is not discrete.
    """
    actions = num_actions(spec)
    recurrent = core == "lstm"
    torso = make_torso(spec, hidden_sizes, pixel_torso)
    normalizer = (ObservationNormalizer(spec.observation_shape)
                  if normalize_observations and not spec.pixels else None)
    net = PolicyValueNet(actions, torso, lstm_size if recurrent else 0, normalizer)

    def initial_state(n: int) -> dict[str, np.ndarray]:
        return lstm_initial_state(n, lstm_size) if recurrent else {}

    # numpy, not jax arrays: building the networks runs no program on the device.
    dummy = np.zeros((1, 1) + spec.observation_shape, spec.observation_dtype)
    first = np.ones((1, 1), bool)
    return ImpalaNetworks(
        init=lambda key: net.init(key, dummy, first, initial_state(1)),
        apply=pure_apply(net),
        initial_state=initial_state,
    )
