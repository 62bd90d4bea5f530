"""The ES policy: a deterministic MLP, and its params as one flat vector."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import flatten_util

from trellis.agents.common import MLPTorso
from trellis.agents.common.continuous import action_bounds
from trellis.agents.common.params import Params, pure_apply
from trellis.envs.specs import EnvSpec


class PolicyNetwork(nn.Module):
    """Tanh MLP to the action: argmax of logits (discrete), or tanh scaled to the bounds."""

    hidden_sizes: Sequence[int]
    num_outputs: int

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:  # [..., obs] -> [..., num_outputs]
        return nn.Dense(self.num_outputs)(MLPTorso(self.hidden_sizes)(obs))


@dataclasses.dataclass(frozen=True)
class ESNetworks:
    """The policy network and the flat-vector view of its params that the search moves.

    Attributes:
      network: the flax module.
      spec: the env's spec.
      num_params: D, the length of the flat vector.
      unravel: flat [D] -> the network's params pytree.
      init_flat: `init_flat(key) -> [D]`, the network's initial params flattened.
    """

    network: PolicyNetwork
    spec: EnvSpec
    num_params: int
    unravel: Callable[[jax.Array], Params]
    init_flat: Callable[[jax.Array], jax.Array]

    def act(self, params: Params, obs: jax.Array) -> jax.Array:
        """The deterministic action of `params` for `obs` [N, ...] -> [N, ...].

        Raises:
          ValueError: Box actions without finite bounds (the action is tanh scaled to them).
        """
        out = pure_apply(self.network)(params, obs)
        if self.spec.num_actions is not None:
            return jnp.argmax(out, axis=-1).astype(self.spec.action_dtype)
        bounds = action_bounds(self.spec, "ES")
        low, high = (jnp.asarray(b, jnp.float32) for b in bounds)
        return low + (jnp.tanh(out) + 1.0) * 0.5 * (high - low)


def make_networks(spec: EnvSpec, hidden_sizes: Sequence[int]) -> ESNetworks:
    outputs = spec.num_actions if spec.num_actions is not None else math.prod(spec.action_shape)
    network = PolicyNetwork(tuple(hidden_sizes), outputs)
    dummy = jnp.zeros((1, *spec.observation_shape), jnp.float32)

    def init_flat(key: jax.Array) -> jax.Array:
        return flatten_util.ravel_pytree(network.init(key, dummy))[0]

    template = jax.eval_shape(network.init, jax.random.PRNGKey(0), dummy)
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), template)
    flat, unravel = flatten_util.ravel_pytree(zeros)
    return ESNetworks(network, spec, int(flat.shape[0]), unravel, init_flat)
