"""TD3 configuration, and DDPG as its preset with the three tricks off."""

from __future__ import annotations

import dataclasses

from trellis.agents.common.continuous import ActorCriticConfig
from trellis.builders.contract.config import setting


@dataclasses.dataclass(frozen=True)
class TD3Config(ActorCriticConfig):
    """Hyper-parameters of TD3 (Fujimoto, van Hoof and Meger, 2018, "Addressing Function
    Approximation Error in Actor-Critic Methods").

    The paper's three changes to DDPG are settings: clipped double Q (`twin_critics`), delayed
    policy and target updates (`policy_delay`) and target policy smoothing (`target_noise`,
    `target_noise_clip`). Noise scales are fractions of the action range's half-width, so one
    default serves every env's bounds. Replay, batch and network sizes are SAC's defaults here
    (tuned for Pendulum-v1 with run.py's 2 x 32 envs on 2 cores); the paper's own are 256 x 256
    MLPs, Adam 1e-3 (3e-4 in the authors' later code), batch 256, tau 0.005.
    """

    twin_critics: bool = setting(True, "clipped double Q: the target takes the smaller of two")
    policy_delay: int = setting(
        2, "critic updates per policy (and target) update", ge=1)
    exploration_noise: float = setting(
        0.1, "std of the Gaussian noise on acting, in half-ranges of the action", ge=0)
    target_noise: float = setting(
        0.2, "std of the target policy smoothing noise, in half-ranges of the action", ge=0)
    target_noise_clip: float = setting(
        0.5, "the smoothing noise is clipped to +-this, in half-ranges of the action", ge=0)


@dataclasses.dataclass(frozen=True)
class DDPGConfig(TD3Config):
    """DDPG (Lillicrap et al., 2016) as TD3 with its three tricks off: one critic, the policy
    and targets updated every step, no target smoothing. Gaussian exploration noise, not the
    paper's Ornstein-Uhlenbeck process, which TD3's authors found no better."""

    twin_critics: bool = False
    policy_delay: int = 1
    target_noise: float = 0.0
