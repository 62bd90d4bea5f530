"""SAC configuration."""

from __future__ import annotations

import dataclasses

from trellis.agents.common.continuous import ActorCriticConfig
from trellis.agents.presets import Preset
from trellis.builders.contract.config import setting


@dataclasses.dataclass(frozen=True)
class SACConfig(ActorCriticConfig):
    """Hyper-parameters of Soft Actor-Critic with twin critics and a learned temperature
    (Haarnoja et al., 2018, "Soft Actor-Critic Algorithms and Applications").

    Defaults (`ActorCriticConfig`'s) learn Pendulum-v1 on a 2-core machine with run.py's
    2 x 32 envs. Replay is uniform; the target critics track the online ones by Polyak
    averaging with step size `tau` after every SGD step.
    """

    # Temperature: alpha starts at `initial_temperature`; the target entropy is
    # -action_dim (the paper's heuristic) unless set here.
    initial_temperature: float = setting(1.0, "initial entropy temperature alpha", gt=0)
    target_entropy: float | None = setting(None, "target entropy; none: -action_dim")
    # The policy's log std is clipped to this range, so exp() neither vanishes nor explodes.
    log_std_min: float = setting(-5.0, "lower clip of the policy's log std")
    log_std_max: float = setting(2.0, "upper clip of the policy's log std; > log_std_min")

    def check(self) -> None:
        super().check()
        if self.log_std_min >= self.log_std_max:
            raise self.invalid("log_std_min", f"< log_std_max = {self.log_std_max}")


# `--preset=mujoco` (chosen by itself for Gymnasium's MuJoCo envs; docs/presets.md): RL
# Baselines3 Zoo's SAC on MuJoCo (its published HalfCheetah, Hopper, Walker2d, Ant and Humanoid
# runs), which sets only learning_starts and leaves the rest at Stable-Baselines3's SAC
# defaults. SB3 does not clip gradients (Trellis's max_grad_norm stays 40) and acts in one env;
# the replay ratio keeps its one update per env step over Trellis's envs.
_ZOO = ("RL Baselines3 Zoo hyperparams/sac.yml (HalfCheetah-v3 &mujoco-defaults) on "
        "Stable-Baselines3's SAC defaults")
_TRELLIS = "Trellis: acting in 2 x 4 envs, each learner step's unrolls; no counterpart"
MUJOCO = Preset(
    source=_ZOO,
    settings={
        "min_replay_size": 10_000,  # The zoo's learning_starts.
        "replay_ratio": 1.0,  # train_freq 1, gradient_steps 1.
        "learning_rate": 3e-4,
        "replay_size": 1_000_000,
        "sample_batch_size": 256,
        "tau": 0.005,
        "discount": 0.99,
        "n_step": 1,
        "hidden_sizes": (256, 256),
        "initial_temperature": 1.0,  # ent_coef "auto": learned, starting at 1.
        "target_entropy": None,  # "auto": -action_dim.
        "log_std_min": -20.0,  # SB3's LOG_STD_MIN and LOG_STD_MAX.
        "log_std_max": 2.0,
        "num_actors": 2,
        "envs_per_actor": 4,
        "unroll_length": 8,
        "batch_size": 8,
        "updates_per_step": 64,
    },
    sources={name: _TRELLIS for name in ("num_actors", "envs_per_actor", "unroll_length",
                                         "batch_size", "updates_per_step")})


# `--preset=dmc` (chosen by itself for Playground's DeepMind Control Suite tasks;
# docs/presets.md): Playground's published Brax SAC settings for the suite (mujoco_playground
# 0.2.0, config/dm_control_suite_params.py, brax_sac_config), with Brax's SAC defaults where
# that file sets nothing (brax/training/agents/sac: tau, 256 x 256, alpha starting at 1,
# one-step targets). Brax steps its 128 envs once, then makes 8 SGD steps of 512: on anakin
# that is batch_size 128 envs, unrolls of 1 step and 8 / 128 SGD steps per env step.
_PLAYGROUND_SAC = ("Playground mujoco_playground/config/dm_control_suite_params.py "
                   "(brax_sac_config)")
_BRAX_SAC = "Brax brax/training/agents/sac (train's and make_sac_networks' defaults)"
DMC = Preset(
    source=_PLAYGROUND_SAC,
    settings={
        "batch_size": 128,  # num_envs (anakin: the envs of a member).
        "unroll_length": 1,
        "replay_ratio": 0.0625,  # grad_updates_per_step 8 per step of the 128 envs.
        "sample_batch_size": 512,  # batch_size.
        "learning_rate": 1e-3,
        "discount": 0.99,  # discounting.
        "replay_size": 4_194_304,  # max_replay_size.
        "min_replay_size": 8_192,
        "total_env_steps": 5_000_000,  # num_timesteps.
        "tau": 0.005,
        "n_step": 1,
        "hidden_sizes": (256, 256),
        "initial_temperature": 1.0,  # log_alpha 0.
    },
    sources={
        "unroll_length": ("Trellis: Brax's one env step between its SGD steps (with "
                          "replay_ratio, its 8 per 128 env steps)"),
        "tau": _BRAX_SAC,
        "n_step": _BRAX_SAC,
        "hidden_sizes": _BRAX_SAC,
        "initial_temperature": _BRAX_SAC,
    })
