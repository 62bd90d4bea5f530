"""PPO networks: separate policy and value torsos, and the action distribution.

Discrete actions get a categorical policy (logits); continuous (Box) actions a diagonal
Gaussian with a learned, state-independent log standard deviation (Schulman et al., 2017,
Section 6.1). The distributions are written out here (a few lines each, checked against
distrax in tests/test_ppo_losses.py) so the agent needs no dependency beyond the core.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Protocol

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from trellis.agents.common import ObservationNormalizer, diagonal_gaussian_log_prob, make_torso
from trellis.agents.common.params import Params, pure_apply
from trellis.envs.specs import EnvSpec

DistParams = Any  # logits [..., A], or (mean, log_std) each [..., D].


class ActionDistribution(Protocol):
    """The policy's distribution, as pure functions of the network's `DistParams`.

    `learn_field` names the batch field the learner evaluates log-probabilities on: the
    action itself, or (Gaussian) the unclipped sample recorded as an extra, because the env
    receives the sample clipped to its bounds.
    """

    learn_field: ClassVar[str]

    def sample(self, key: jax.Array, params: DistParams) -> tuple[jax.Array, jax.Array]:
        """(action for the env, action the log-probability refers to)."""
        ...

    def mode(self, params: DistParams) -> jax.Array: ...

    def log_prob(self, params: DistParams, action: jax.Array) -> jax.Array: ...

    def entropy(self, params: DistParams) -> jax.Array: ...


@dataclasses.dataclass(frozen=True)
class Categorical:
    """Categorical over `num_actions` from logits [..., A]."""

    learn_field: ClassVar[str] = "action"

    def sample(self, key: jax.Array, logits: jax.Array) -> tuple[jax.Array, jax.Array]:
        action = jax.random.categorical(key, logits).astype(jnp.int32)
        return action, action

    def mode(self, logits: jax.Array) -> jax.Array:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)

    def log_prob(self, logits: jax.Array, action: jax.Array) -> jax.Array:
        log_pi = jax.nn.log_softmax(logits)
        return jnp.take_along_axis(log_pi, action[..., None].astype(jnp.int32), axis=-1)[..., 0]

    def entropy(self, logits: jax.Array) -> jax.Array:
        log_pi = jax.nn.log_softmax(logits)
        return -jnp.sum(jnp.exp(log_pi) * log_pi, axis=-1)


@dataclasses.dataclass(frozen=True)
class DiagonalGaussian:
    """Diagonal Gaussian from (mean, log_std), each [..., D]; env actions clipped to bounds."""

    learn_field: ClassVar[str] = "raw_action"

    low: tuple[float, ...]
    high: tuple[float, ...]

    def sample(self, key: jax.Array, params: tuple[jax.Array, jax.Array]
               ) -> tuple[jax.Array, jax.Array]:
        mean, log_std = params
        raw = mean + jnp.exp(log_std) * jax.random.normal(key, mean.shape, mean.dtype)
        return self._clip(raw), raw

    def mode(self, params: tuple[jax.Array, jax.Array]) -> jax.Array:
        return self._clip(params[0])

    def log_prob(self, params: tuple[jax.Array, jax.Array], action: jax.Array) -> jax.Array:
        mean, log_std = params
        return diagonal_gaussian_log_prob(mean, log_std, action)

    def entropy(self, params: tuple[jax.Array, jax.Array]) -> jax.Array:
        _, log_std = params
        return jnp.sum(log_std + 0.5 * math.log(2 * math.pi * math.e), axis=-1)

    def _clip(self, action: jax.Array) -> jax.Array:
        return jnp.clip(action, jnp.asarray(self.low), jnp.asarray(self.high))


class ActorCritic(nn.Module):
    """Policy head on one torso, value head on another (no shared features to fight over), or
    both heads on the policy's torso where `value_torso` is None."""

    policy_torso: nn.Module
    value_torso: nn.Module | None
    num_outputs: int
    gaussian: bool
    normalizer: nn.Module | None = None

    @nn.compact
    def __call__(self, obs: jax.Array) -> tuple[DistParams, jax.Array]:
        if self.normalizer is not None:
            obs = self.normalizer(obs)
        # Small policy init: actions start near uniform (or mean 0), as in the PPO paper's
        # code; the value head starts at unit scale.
        features = self.policy_torso(obs)
        out = nn.Dense(self.num_outputs, kernel_init=nn.initializers.orthogonal(0.01))(features)
        dist_params: DistParams = out
        if self.gaussian:
            log_std = self.param("log_std", nn.initializers.zeros, (self.num_outputs,))
            dist_params = (out, jnp.broadcast_to(log_std, out.shape))
        if self.value_torso is not None:
            features = self.value_torso(obs)
        value = nn.Dense(1, kernel_init=nn.initializers.orthogonal(1.0))(features)[..., 0]
        return dist_params, value


@dataclasses.dataclass(frozen=True)
class PPONetworks:
    """Pure functions: `init(key) -> params`, `apply(params, obs) -> (dist_params, value)`,
    and the action distribution over `dist_params`."""

    init: Callable[[jax.Array], Params]
    apply: Callable[[Params, jax.Array], tuple[DistParams, jax.Array]]
    distribution: ActionDistribution


def make_networks(spec: EnvSpec, hidden_sizes: Sequence[int],
                  normalize_observations: bool = False, pixel_torso: str = "nature",
                  shared_torso: bool = False) -> PPONetworks:
    """Categorical policy for Discrete actions, diagonal Gaussian for 1-D Box actions; with
    `normalize_observations`, vector observations are normalised by running moments that the
    learner keeps in the params' "obs_norm" collection (`ObservationNormalizer`); pixel
    observations go through the torso `pixel_torso` names (`agents.common.make_torso`); one
    torso for both heads with `shared_torso`, else one each.

    Raises:
      ValueError: Box actions of rank other than 1, or without finite bounds.
    """
    distribution: ActionDistribution
    if spec.num_actions is not None:
        num_outputs, distribution = spec.num_actions, Categorical()
    else:
        if len(spec.action_shape) != 1:
            raise ValueError(f"PPO handles flat Box actions, got shape {spec.action_shape}.")
        low, high = spec.action_low, spec.action_high
        if (low is None or high is None or not low + high
                or not all(math.isfinite(b) for b in low + high)):
            raise ValueError(
                f"PPO clips Gaussian actions to the env's bounds; got low={spec.action_low}, "
                f"high={spec.action_high}. Wrap the env to give finite bounds."
            )
        num_outputs = spec.action_shape[0]
        distribution = DiagonalGaussian(low, high)
    net = ActorCritic(
        policy_torso=make_torso(spec, hidden_sizes, pixel_torso),
        value_torso=None if shared_torso else make_torso(spec, hidden_sizes, pixel_torso),
        num_outputs=num_outputs,
        gaussian=not spec.discrete,
        normalizer=(ObservationNormalizer(spec.observation_shape)
                    if normalize_observations and not spec.pixels else None),
    )
    dummy = np.zeros((1,) + spec.observation_shape, spec.observation_dtype)
    return PPONetworks(
        init=lambda key: net.init(key, dummy), apply=pure_apply(net), distribution=distribution
    )
