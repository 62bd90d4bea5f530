"""DQN networks: a torso from agents.common and a Q head with Rainbow's options: dueling
(Wang et al., 2016), categorical atoms (C51, Bellemare et al., 2017) and noisy linear layers
(Fortunato et al., 2018)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from trellis.agents.common import make_torso
from trellis.agents.common.params import Params, pure_apply
from trellis.agents.dqn.config import DQNConfig
from trellis.envs.specs import EnvSpec


def factorised_noise(key: jax.Array, size: int) -> jax.Array:
    """f(e) = sign(e) sqrt(|e|) of e ~ N(0, 1)^size (Fortunato et al., 2018, eq. 11)."""
    e = jax.random.normal(key, (size,))
    return jnp.sign(e) * jnp.sqrt(jnp.abs(e))


class NoisyDense(nn.Module):
    """A linear layer with factorised Gaussian noise on its weights (Fortunato et al., 2018,
    section 3.2): y = (mu_w + sigma_w * f(e_in) f(e_out)^T) x + mu_b + sigma_b * f(e_out).

    Initialised as the paper's factorised case: mu ~ U[-1/sqrt(p), 1/sqrt(p)] and
    sigma = sigma0 / sqrt(p) for p inputs. With `noise` None it is the plain layer of the mean
    weights (evaluation); a key draws one noise sample for the whole batch.
    """

    features: int
    sigma0: float = 0.5

    @nn.compact
    def __call__(self, x: jax.Array, noise: jax.Array | None) -> jax.Array:  # [..., p]
        p = x.shape[-1]
        bound = 1.0 / np.sqrt(p)

        def uniform(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
            return jax.random.uniform(key, shape, jnp.float32, -bound, bound)

        sigma = nn.initializers.constant(self.sigma0 / np.sqrt(p))
        kernel = self.param("kernel", uniform, (p, self.features))
        bias = self.param("bias", uniform, (self.features,))
        sigma_kernel = self.param("sigma_kernel", sigma, (p, self.features))
        sigma_bias = self.param("sigma_bias", sigma, (self.features,))
        y = x @ kernel + bias
        if noise is None:
            return y
        in_key, out_key = jax.random.split(noise)
        e_in = factorised_noise(in_key, p)
        e_out = factorised_noise(out_key, self.features)
        # ((x * e_in) @ sigma_w) * e_out: the rank-one noise without forming the [p, q] matrix.
        return y + ((x * e_in) @ sigma_kernel) * e_out + sigma_bias * e_out


class QNetwork(nn.Module):
    """Q-values [..., A, 1], or the logits of a return distribution over `num_atoms` atoms
    [..., A, K], for each action.

    Dueling: V(s) + A(s, a) - mean_a A(s, a), per atom (on the logits for C51, as Rainbow's
    head); subtracting the mean advantage makes V and A identifiable without changing the
    greedy action (Wang et al., 2016, eq. 9). Noisy: the head's linear layers are
    `NoisyDense` (the torso's stay deterministic), each with its own noise from `noise`.
    """

    num_actions: int
    torso: nn.Module
    dueling: bool = True
    num_atoms: int = 1
    noisy: bool = False
    noisy_sigma0: float = 0.5

    @nn.compact
    def __call__(self, obs: jax.Array, noise: jax.Array | None = None) -> jax.Array:
        h = self.torso(obs)  # [..., H]
        k, a = self.num_atoms, self.num_actions

        def linear(features: int, index: int) -> jax.Array:
            if not self.noisy:
                return nn.Dense(features)(h)
            layer_noise = None if noise is None else jax.random.fold_in(noise, index)
            return NoisyDense(features, self.noisy_sigma0)(h, layer_noise)

        if not self.dueling:
            return linear(a * k, 0).reshape(h.shape[:-1] + (a, k))
        value = linear(k, 0).reshape(h.shape[:-1] + (1, k))
        advantages = linear(a * k, 1).reshape(h.shape[:-1] + (a, k))
        return value + advantages - jnp.mean(advantages, axis=-2, keepdims=True)


def expected_q(head: jax.Array, atoms: jax.Array | None) -> jax.Array:
    """Q-values [..., A] of a head's output [..., A, K]: the output itself when K = 1
    (`atoms` None), else the mean of the return distribution, sum_k softmax(logits)_k z_k."""
    if atoms is None:
        return head[..., 0]
    return jnp.sum(jax.nn.softmax(head, axis=-1) * atoms, axis=-1)


@dataclasses.dataclass(frozen=True)
class DQNNetworks:
    """Pure functions: `init(key) -> params`; `apply(params, obs, noise) -> [..., A, K]`, the
    head's output (K = 1: Q-values; K > 1: logits over `atoms`), with `noise` a key for noisy
    nets or None (the mean weights; ignored without noisy nets).

    Attributes:
      atoms: [K] the return support of a C51 head; None for Q-values.
    """

    init: Callable[[jax.Array], Params]
    apply: Callable[[Params, jax.Array, jax.Array | None], jax.Array]
    num_actions: int
    atoms: jax.Array | None

    def q_values(self, params: Params, obs: jax.Array, noise: jax.Array | None = None
                 ) -> jax.Array:
        """Q-values [..., A] at `obs` [..., *obs_shape]."""
        return expected_q(self.apply(params, obs, noise), self.atoms)


def make_networks(spec: EnvSpec, config: DQNConfig) -> DQNNetworks:
    """The torso `config` sets (MLP of hidden_sizes, or pixel_torso for frames) and its Q head.

    Raises:
      ValueError: continuous actions (Q-learning needs a finite action set).
    """
    if spec.num_actions is None:
        raise ValueError("DQN needs discrete actions; use --agent=ppo or sac for Box actions.")
    c = config
    net = QNetwork(spec.num_actions, make_torso(spec, c.hidden_sizes, c.pixel_torso),
                   dueling=c.dueling, num_atoms=c.num_atoms, noisy=c.noisy,
                   noisy_sigma0=c.noisy_sigma0)
    dummy = np.zeros((1,) + spec.observation_shape, spec.observation_dtype)
    atoms = jnp.linspace(c.v_min, c.v_max, c.num_atoms) if c.distributional else None
    return DQNNetworks(init=lambda key: net.init(key, dummy), apply=pure_apply(net),
                       num_actions=spec.num_actions, atoms=atoms)
