"""Continuous control pieces the actor-critic agents share (SAC, TD3, D4PG, MPO): their
config's replay defaults, the check that an env has flat bounded actions, the squash into
those bounds, a deterministic policy and critics on [obs, action] and their inits, and the
acting params and policy of a deterministic actor."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Protocol

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from trellis.agents.common.params import Params
from trellis.agents.common.torsos import MLPTorso
from trellis.builders.contract.agent import Policy, State
from trellis.builders.contract.config import ReplayConfig, setting
from trellis.envs.specs import EnvSpec


@dataclasses.dataclass(frozen=True)
class ActorCriticConfig(ReplayConfig):
    """What the off-policy actor-critics (SAC, TD3, D4PG) share: replay and batch sizes tuned
    for Pendulum-v1 with run.py's 2 x 32 envs on a 2-core machine (64 unrolls of 8 steps per
    learner step, then 128 SGD steps of 256 samples: one SGD step per 4 env steps; learning
    from 5,000 transitions) and Polyak-averaged targets."""

    unroll_length: int = 8
    batch_size: int = 64
    learning_rate: float = 1e-3  # Of every network alike.
    n_step: int = 1
    replay_size: int = 200_000
    min_replay_size: int = 5_000
    updates_per_step: int = 128
    sample_batch_size: int = 256

    tau: float = setting(0.005, "Polyak step size of the target networks", gt=0, le=1)


def continuous_action_dim(spec: EnvSpec, agent: str) -> int:
    """The action dimension of an env with flat vector observations and flat, bounded Box
    actions.

    Raises:
      ValueError: discrete or non-flat actions, infinite bounds, or pixel observations, naming
        `agent` and what would work.
    """
    if spec.discrete or len(spec.action_shape) != 1:
        raise ValueError(f"{agent} needs flat Box actions, got num_actions={spec.num_actions}, "
                         f"action_shape={spec.action_shape}; use --agent=dqn or ppo for "
                         "discrete actions.")
    action_bounds(spec, agent)
    if len(spec.observation_shape) != 1:
        raise ValueError(f"{agent} here takes flat vector observations, got shape "
                         f"{spec.observation_shape}.")
    return spec.action_shape[0]


def actor_critic_inits(spec: EnvSpec, action_dim: int, policy: nn.Module, critic: nn.Module
                       ) -> tuple[Callable[[jax.Array], Params], Callable[[jax.Array], Params]]:
    """(init_policy, init_critic): the params of `policy` on an observation of `spec`, and of
    `critic` on an observation and an action, each from a key."""
    obs = np.zeros((1,) + spec.observation_shape, spec.observation_dtype)
    action = np.zeros((1, action_dim), np.float32)
    return (lambda key: policy.init(key, obs)), (lambda key: critic.init(key, obs, action))


def action_bounds(spec: EnvSpec, agent: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(low, high): the finite bounds of an env's Box actions.

    Raises:
      ValueError: no bounds (discrete actions), or infinite ones, naming `agent`.
    """
    low, high = spec.action_low, spec.action_high
    if (low is None or high is None or not low + high
            or not all(math.isfinite(b) for b in low + high)):
        raise ValueError(f"{agent} squashes actions into the env's bounds; got "
                         f"low={spec.action_low}, high={spec.action_high}. Wrap the env to give "
                         "finite bounds.")
    return low, high


@dataclasses.dataclass(frozen=True)
class Bounds:
    """An env's Box bounds; `squash` maps the real line onto them, a = offset + scale tanh(u)."""

    low: tuple[float, ...]
    high: tuple[float, ...]

    @property
    def scale(self) -> jax.Array:
        return (jnp.asarray(self.high) - jnp.asarray(self.low)) / 2.0

    @property
    def offset(self) -> jax.Array:
        return (jnp.asarray(self.high) + jnp.asarray(self.low)) / 2.0

    def squash(self, u: jax.Array) -> jax.Array:
        return self.offset + self.scale * jnp.tanh(u)

    def clip(self, action: jax.Array) -> jax.Array:
        return jnp.clip(action, jnp.asarray(self.low), jnp.asarray(self.high))


class DeterministicPolicy(nn.Module):
    """obs -> the pre-squash action u [..., D] (TD3, D4PG: `Bounds.squash(u)` is the action)."""

    hidden_sizes: Sequence[int]
    action_dim: int

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        return nn.Dense(self.action_dim)(MLPTorso(tuple(self.hidden_sizes))(obs))


class Critics(nn.Module):
    """(obs, action) -> `num_critics` critics' outputs, [..., num_critics, num_outputs] (or
    [..., num_critics] when `num_outputs` is 1: Q-values); each critic has its own MLP.

    SAC and TD3 use two scalar critics (clipped double Q), DDPG one, D4PG one whose outputs
    are the logits of a categorical return distribution.
    """

    hidden_sizes: Sequence[int]
    num_critics: int = 2
    num_outputs: int = 1

    @nn.compact
    def __call__(self, obs: jax.Array, action: jax.Array) -> jax.Array:
        x = jnp.concatenate([obs.astype(jnp.float32), action.astype(jnp.float32)], axis=-1)
        out = jnp.stack([nn.Dense(self.num_outputs)(MLPTorso(tuple(self.hidden_sizes))(x))
                         for _ in range(self.num_critics)], axis=-2)
        return out[..., 0] if self.num_outputs == 1 else out


class ActorCriticState(Protocol):
    """What `actor_params` reads of an actor-critic's training state (SAC's, TD3's, D4PG's)."""

    @property
    def policy_params(self) -> Params: ...


class DeterministicActorState(ActorCriticState, Protocol):
    """What `deterministic_actor_params` reads of TD3's and D4PG's training state."""

    @property
    def step(self) -> jax.Array: ...


def actor_params(state: ActorCriticState) -> dict[str, Params]:
    """What an actor-critic's policy reads (`Training.acting_params`): its actor's params,
    `{"policy": state.policy_params}`, so inference and anakin never carry the critics."""
    return {"policy": state.policy_params}


def deterministic_actor_params(state: DeterministicActorState) -> dict[str, Params]:
    """What a deterministic actor's policy reads (TD3's, D4PG's `Training.acting_params`):
    `actor_params`, and `learned`, whether the learner has taken an SGD step: until it has,
    `deterministic_policy` acts uniformly at random."""
    return {**actor_params(state), "learned": state.step > 0}


def deterministic_policy(act: Callable[[Params, jax.Array], jax.Array], bounds: Bounds,
                         exploration_noise: float, evaluation: bool) -> Policy:
    """The acting policy of a deterministic actor (TD3, DDPG, D4PG), feed-forward:
    `policy(params, key, obs[N, D_obs], state, first) -> (actions[N, D], {}, state)` reads
    `params["policy"]` and `params["learned"]` (`deterministic_actor_params`). Evaluating, it
    acts mu(s); training, mu(s) plus Gaussian noise of std `exploration_noise` half-ranges,
    clipped to the bounds, once the learner has stepped, and uniformly within the bounds
    before: the replay's first `min_replay_size` transitions then span the action box rather
    than the noisy actions of an untrained actor (the TD3 authors' start steps, CleanRL's and
    Stable-Baselines3's `learning_starts`).

    Args:
      act: `act(policy_params, obs) -> mu(obs)`, already in bounds.
      bounds: the env's action bounds.
      exploration_noise: the noise's std in half-widths of the action range.
      evaluation: mu(s) alone.
    """

    def policy(params: Params, key: jax.Array, obs: jax.Array, state: State, first: jax.Array
               ) -> tuple[jax.Array, dict[str, jax.Array], State]:
        del first  # Feed-forward: nothing to reset.
        action = act(params["policy"], obs)
        if evaluation:
            return action, {}, state
        noise_key, uniform_key = jax.random.split(key)
        noise = jax.random.normal(noise_key, action.shape, action.dtype)
        noisy = bounds.clip(action + exploration_noise * bounds.scale * noise)
        uniform = jax.random.uniform(uniform_key, action.shape, action.dtype,
                                     jnp.asarray(bounds.low), jnp.asarray(bounds.high))
        return jnp.where(params["learned"], noisy, uniform), {}, state

    return policy
