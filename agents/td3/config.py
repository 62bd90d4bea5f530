"""TD3 configuration, and DDPG as its preset with the three tricks off."""

from __future__ import annotations

import dataclasses

from trellis.agents.common.continuous import ActorCriticConfig
from trellis.agents.presets import Preset
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


# `--preset=mujoco` (chosen by itself for Gymnasium's MuJoCo envs; docs/presets.md): CleanRL's
# td3_continuous_action.py (Huang et al., 2022), whose noise scales are half-ranges of the
# action as Trellis's are. CleanRL acts in one env and does not clip gradients (Trellis's
# max_grad_norm stays 40); the replay ratio keeps its one update per env step.
_CLEANRL = "CleanRL cleanrl/td3_continuous_action.py (its Args' defaults)"
_TRELLIS = "Trellis: acting in 2 x 4 envs, each learner step's unrolls; no counterpart"
MUJOCO = Preset(
    source=_CLEANRL,
    settings={
        "min_replay_size": 25_000,  # learning_starts.
        "replay_ratio": 1.0,  # One update per env step.
        "learning_rate": 3e-4,
        "replay_size": 1_000_000,
        "sample_batch_size": 256,
        "tau": 0.005,
        "discount": 0.99,
        "n_step": 1,
        "hidden_sizes": (256, 256),
        "twin_critics": True,
        "policy_delay": 2,  # policy_frequency.
        "exploration_noise": 0.1,
        "target_noise": 0.2,  # policy_noise.
        "target_noise_clip": 0.5,
        "num_actors": 2,
        "envs_per_actor": 4,
        "unroll_length": 8,
        "batch_size": 8,
        "updates_per_step": 64,
    },
    sources={name: _TRELLIS for name in ("num_actors", "envs_per_actor", "unroll_length",
                                         "batch_size", "updates_per_step")})
