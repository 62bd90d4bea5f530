"""QMIX's and VDN's networks: a layer-normed Q-network per policy (as PQN's) and the mixer
that makes the team's Q of its agents' (VDN's sum, QMIX's monotonic hypernetwork mix)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from trellis.agents.common.params import Params, pure_apply
from trellis.agents.qmix.config import QMIX, QMIXConfig
from trellis.builders.contract.policy_mapping import PolicyGroup, add_agent_ids, stack
from trellis.envs.multi_agent import MultiAgentSpec, MultiAgentStep


class LayerNormQNetwork(nn.Module):
    """Q(o, .): Dense -> LayerNorm -> relu per hidden layer (PQN's vector network, which
    JaxMARL's PQN-VDN uses: NORM_TYPE layer_norm), then a linear head."""

    hidden_sizes: Sequence[int]
    num_actions: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:  # [..., D] -> [..., A]
        x = x.astype(jnp.float32)
        for size in self.hidden_sizes:
            x = nn.relu(nn.LayerNorm()(nn.Dense(size)(x)))
        return nn.Dense(self.num_actions)(x)


class _HyperNet(nn.Module):
    """state -> |a weight vector|: two layers (relu between), made non-negative by abs."""

    hidden_size: int
    size: int

    @nn.compact
    def __call__(self, state: jax.Array) -> jax.Array:
        return jnp.abs(nn.Dense(self.size)(nn.relu(nn.Dense(self.hidden_size)(state))))


class QMixer(nn.Module):
    """QMIX's mixing network (Rashid et al., 2018, "QMIX: Monotonic Value Function
    Factorisation for Deep Multi-Agent Reinforcement Learning", https://arxiv.org/abs/1803.11485):
    Q_tot = w2 . elu(W1 q + b1) + b2, where hypernetworks of the global state give W1 and w2
    (non-negative: abs, so dQ_tot/dq_a >= 0 and the argmax per agent is the team's), b1 (one
    layer) and b2 (two layers, relu between)."""

    num_agents: int
    embed_size: int
    hypernet_hidden_size: int

    @nn.compact
    def __call__(self, q: jax.Array, state: jax.Array) -> jax.Array:  # [..., n], [..., S]
        state = state.reshape(state.shape[: q.ndim - 1] + (-1,)).astype(jnp.float32)
        w1 = _HyperNet(self.hypernet_hidden_size, self.num_agents * self.embed_size)(state)
        w1 = w1.reshape(q.shape[:-1] + (self.num_agents, self.embed_size))
        b1 = nn.Dense(self.embed_size)(state)
        hidden = nn.elu(jnp.einsum("...n,...ne->...e", q, w1) + b1)
        w2 = _HyperNet(self.hypernet_hidden_size, self.embed_size)(state)
        b2 = nn.Dense(1)(nn.relu(nn.Dense(self.embed_size)(state)))[..., 0]
        return jnp.sum(hidden * w2, axis=-1) + b2  # [...]


def vdn_mix(params: Params, q: jax.Array, state: jax.Array | None) -> jax.Array:
    """VDN's team Q (Sunehag et al., 2018, https://arxiv.org/abs/1706.05296): the sum of the
    agents' Qs, [..., n] -> [...]; no params, no state."""
    del params, state
    return jnp.sum(q, axis=-1)


@dataclasses.dataclass(frozen=True)
class QNetwork:
    """One policy's Q-network: `init(key) -> params`, `apply(params, x) -> [..., A]`."""

    init: Callable[[jax.Array], Params]
    apply: Callable[[Params, jax.Array], jax.Array]
    num_actions: int


@dataclasses.dataclass(frozen=True)
class QMIXNetworks:
    """A Q-network per policy of the mapping, and the mixer of every agent's Q.

    Attributes:
      groups: the policies and their agents (`PolicyMapping.groups`), in the mixer's order.
      q: {policy id: its QNetwork}; its input is `inputs(group, step)`.
      mixer_init: `mixer_init(key) -> params` ({} for VDN).
      mix: `mix(params, q [..., n], global_state [..., S] or None) -> Q_tot [...]`, the agents
        in `agents`' order.
    """

    groups: tuple[PolicyGroup, ...]
    q: Mapping[str, QNetwork]
    mixer_init: Callable[[jax.Array], Params]
    mix: Callable[[Params, jax.Array, jax.Array | None], jax.Array]

    @property
    def agents(self) -> tuple[str, ...]:
        return tuple(a for g in self.groups for a in g.agents)

    def inputs(self, group: PolicyGroup, step: MultiAgentStep) -> jax.Array:
        """[N, n, D] of the group's n agents in N envs: each agent's observation with its
        one-hot id where the policy serves several (`add_agent_ids`)."""
        x: jax.Array = add_agent_ids(group, stack(group, step.obs, jnp), jnp)
        return x

    def init(self, key: jax.Array) -> Params:
        """{"agents": {policy: params}, "mixer": params}."""
        keys = jax.random.split(key, len(self.groups) + 1)
        return {"agents": {g.policy: self.q[g.policy].init(k)
                           for g, k in zip(self.groups, keys[1:], strict=True)},
                "mixer": self.mixer_init(keys[0])}


def make_networks(spec: MultiAgentSpec, config: QMIXConfig) -> QMIXNetworks:
    """The layer-normed Q-network of each policy of `config.mapping`, and the mixer.

    Raises:
      builders.contract.policy_mapping.PolicyMappingError: the mapping does not fit the agents.
      ValueError: continuous actions, or QMIX on an env without a global state.
    """
    groups = config.mapping.groups(spec)
    q: dict[str, QNetwork] = {}
    for group in groups:
        num_actions = group.spec.num_actions
        if num_actions is None:
            raise ValueError(f"{config.mixer} needs discrete actions; policy {group.policy!r} "
                             f"has actions {group.spec.action_shape} (use --agent=ippo)")
        net = LayerNormQNetwork(tuple(config.hidden_sizes), num_actions)
        dummy = np.zeros((1,) + group.spec.observation_shape, np.float32)
        q[group.policy] = QNetwork(_initializer(net, (dummy,)), pure_apply(net), num_actions)
    if config.mixer != QMIX:
        return QMIXNetworks(groups, q, lambda key: {}, vdn_mix)
    if spec.global_state_shape is None:
        raise ValueError("qmix's mixer needs the env's global state; this env has none (use "
                         "--agent=vdn)")
    mixer = QMixer(spec.num_agents, config.mixing_embed_size, config.hypernet_hidden_size)
    dummies = (np.zeros((1, spec.num_agents), np.float32),
               np.zeros((1,) + spec.global_state_shape, np.float32))
    return QMIXNetworks(groups, q, _initializer(mixer, dummies), pure_apply(mixer))


def _initializer(net: nn.Module, dummies: tuple[np.ndarray, ...]
                 ) -> Callable[[jax.Array], Params]:
    def init(key: jax.Array) -> Params:
        params: Params = net.init(key, *dummies)
        return params

    return init
