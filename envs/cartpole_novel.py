"""CartPoleNoVel-v1: CartPole-v1 without the velocities, a memory task.

The observation is (cart position, pole angle) only; a policy has to infer the two velocities
from past observations, so a feed-forward agent cannot balance the pole for long while a
recurrent one can. Dynamics, rewards and the 500-step limit are CartPole-v1's; the vector
version wraps Gymnasium's numpy CartPole, so all envs of a worker step in one call.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleEnv, CartPoleVectorEnv

ENV_ID = "CartPoleNoVel-v1"
_KEPT = [0, 2]  # Of CartPole's (x, x_dot, theta, theta_dot).


def _positions(obs: np.ndarray) -> np.ndarray:
    return obs[..., _KEPT]


def _space(full: gym.Space[Any]) -> gym.spaces.Box:
    """CartPole's Box `full` without the velocities."""
    if not isinstance(full, gym.spaces.Box):
        raise TypeError(f"CartPole's observations are a Box, got {full!r}")
    return gym.spaces.Box(full.low[..., _KEPT], full.high[..., _KEPT], dtype=np.float32)


def make_env(**kwargs: Any) -> gym.Env[Any, Any]:
    """One env (the registered entry point; Gymnasium adds the 500-step TimeLimit)."""
    env = CartPoleEnv(**kwargs)
    return gym.wrappers.TransformObservation(env, _positions, _space(env.observation_space))


def make_vector_env(num_envs: int = 1, **kwargs: Any) -> gym.vector.VectorEnv[Any, Any, Any]:
    """`num_envs` envs in one numpy CartPole (the registered vector entry point)."""
    envs = CartPoleVectorEnv(num_envs=num_envs, **kwargs)
    return gym.wrappers.vector.TransformObservation(
        envs, _positions, _space(envs.observation_space),
        _space(envs.single_observation_space))


def register() -> None:
    """Registers `CartPoleNoVel-v1` with Gymnasium (once; later calls do nothing)."""
    if ENV_ID in gym.registry:
        return
    gym.register(
        id=ENV_ID,
        entry_point=make_env,
        vector_entry_point=make_vector_env,
        max_episode_steps=500,
        reward_threshold=475.0,
    )
