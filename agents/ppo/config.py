"""PPO configuration."""

from __future__ import annotations

import dataclasses

from trellis.agents.presets import Preset
from trellis.builders.contract.config import MinibatchConfig, setting

# The defaults that differ on a platform; run.py applies them (flags, --config and --resume
# still override them). On anakin the whole loop runs in one program and an env step costs
# ~0.2 us, so the update bounds the speed: one epoch of two minibatches on 16 envs and one
# layer of 32 (a hundredth of the default's multiply-adds per env step) still solve
# CartPole-v1 in 120,000-310,000 env steps, sooner in wall time; populations then fill the
# cores that one member leaves idle (docs/anakin.md).
PLATFORM_DEFAULTS = {
    "anakin": {"batch_size": 16, "num_epochs": 1, "num_minibatches": 2, "hidden_sizes": (32,),
               "learning_rate": 5e-3},
}


@dataclasses.dataclass(frozen=True)
class PPOConfig(MinibatchConfig):
    """Hyper-parameters of PPO (Schulman et al., 2017).

    Defaults solve CartPole-v1 fast on a 2-core machine with run.py's 2 x 32 envs (tuned with
    the sweep in agents/ppo/README.md).
    """

    unroll_length: int = 16
    batch_size: int = 64
    max_queue_size: int = 1  # Bounds how off-policy the data is.
    learning_rate: float = 2.5e-3
    max_grad_norm: float = 0.5
    adam_eps: float = 1e-5

    pixel_torso: str = setting(
        "nature", "torso for pixel observations: nature (the DQN paper's conv layers), resnet "
        "(the IMPALA paper's deep residual torso) or minatar (the MinAtar paper's one 3x3 conv "
        "and 128 units, for its 10x10 grids)", choices=("nature", "resnet", "minatar"))

    shared_torso: bool = setting(
        False, "the policy and value heads on one torso, trained by both losses (cleanrl's "
        "Atari PPO and Sample Factory share it); false: a torso each")

    # Optimisation per batch: `num_epochs` passes, each over `num_minibatches` minibatches
    # of the batch's T * B transitions, shuffled.
    num_epochs: int = 4
    num_minibatches: int = 4

    # Returns and advantages: GAE on the values recorded when acting (PPO), or V-trace on the
    # learner's own values and importance weights (APPO: Sample Factory's algorithm, for data
    # that lags the learner's policy).
    advantages: str = setting("gae", "how advantages and value targets are computed",
                              choices=("gae", "vtrace"))
    gae_lambda: float = setting(0.95, "GAE's lambda (V-trace's trace lambda too)", ge=0, le=1)
    vtrace_clip_rho: float = setting(
        1.0, "V-trace: the clip of the importance weights (rho bar and the advantages')", gt=0)
    normalize_advantages: bool = setting(True, "normalise advantages per minibatch")

    # Loss.
    clip_epsilon: float = setting(0.2, "clip range of the probability ratio", gt=0)
    value_clip_epsilon: float | None = setting(
        None, "clip range of the value change; none: no value clipping", gt=0)
    value_cost: float = setting(0.5, "weight of the value loss", ge=0)
    entropy_cost: float = setting(0.0, "weight of the entropy bonus", ge=0)

    # Scales (Brax's PPO `normalize_observations` and `reward_scaling`, which its published
    # settings for physics tasks use: agents/ppo/README.md).
    normalize_observations: bool = setting(
        False, "normalise vector observations by running moments (in the params, checkpointed)")
    reward_scale: float = setting(1.0, "the learner multiplies rewards by this", gt=0)
    reward_clip: float | None = setting(
        None, "the learner clips rewards to [-reward_clip, reward_clip] before reward_scale "
        "(Atari: 1); the reported returns stay unclipped; none: no clipping", gt=0)


@dataclasses.dataclass(frozen=True)
class APPOConfig(PPOConfig):
    """APPO, Sample Factory's asynchronous PPO (Petrenko et al., 2020, "Sample Factory:
    Egocentric 3D Control from Pixels at 100000 FPS with Asynchronous Reinforcement
    Learning"): PPO's clipped surrogate on V-trace advantages and value targets, so data that
    lags the learner's policy (a deeper unroll queue, many env workers) is corrected for.

    Here V-trace runs once per update on the whole batch with the learner's params before its
    first epoch; Sample Factory recomputes it per minibatch of trajectories."""

    advantages: str = "vtrace"
    gae_lambda: float = 1.0  # V-trace's lambda: IMPALA's and Sample Factory's default.
    max_queue_size: int = 4  # Batches inference may run ahead: the lag V-trace corrects.


@dataclasses.dataclass(frozen=True)
class A2CConfig(PPOConfig):
    """A2C (Mnih et al., 2016, the synchronous variant of A3C) as PPO with one gradient step
    per batch: one epoch of one minibatch. At that step the policy is the one that acted, so
    PPO's ratio is 1, the clip never binds and the clipped surrogate's gradient is the policy
    gradient with (GAE) advantages, A2C's; the value and entropy terms are A2C's too."""

    num_epochs: int = 1
    num_minibatches: int = 1
    # Smaller, more frequent batches, as A2C's synchronous updates are: on a 2-core machine
    # with run.py's 2 x 32 envs, CartPole-v1 reached 475 in 139,424 env steps with these and
    # did not in 500,000 with PPO's 16 x 64 (one step per batch needs more batches).
    unroll_length: int = 8
    batch_size: int = 16



# `--preset=mujoco` (chosen by itself for Gymnasium's MuJoCo envs; docs/presets.md): CleanRL's
# ppo_continuous_action.py (Huang et al., 2022; "The 37 Implementation Details of PPO"): one env
# of 2,048 steps per batch, 10 epochs of 32 minibatches, the learning rate annealed to 0.
# Where Trellis differs: CleanRL also normalises rewards by a running return's variance and
# clips observations and rewards to +-10 (Trellis normalises observations only), and its
# 64 x 64 torso uses tanh and orthogonal initialisation (Trellis's MLP torso's own).
_CLEANRL = "CleanRL cleanrl/ppo_continuous_action.py (its Args' defaults and env wrappers)"
MUJOCO = Preset(
    source=_CLEANRL,
    settings={
        "num_actors": 1,  # num_envs 1.
        "envs_per_actor": 1,
        "unroll_length": 2048,  # num_steps.
        "batch_size": 1,
        "num_epochs": 10,  # update_epochs.
        "num_minibatches": 32,
        "learning_rate": 3e-4,
        "learning_rate_schedule": "linear",  # anneal_lr.
        "adam_eps": 1e-5,
        "discount": 0.99,
        "gae_lambda": 0.95,
        "normalize_advantages": True,
        "clip_epsilon": 0.2,
        "value_clip_epsilon": 0.2,  # clip_vloss, with the policy's clip range.
        "entropy_cost": 0.0,
        "value_cost": 0.5,
        "max_grad_norm": 0.5,
        "hidden_sizes": (64, 64),
        "normalize_observations": True,  # gym.wrappers.NormalizeObservation.
    })


# `--preset=dmc` (chosen by itself for Playground's DeepMind Control Suite tasks,
# playground:CartpoleBalance ...; docs/presets.md says which settings map exactly): Playground's
# published Brax PPO settings for the suite (Zakka et al., 2025; mujoco_playground 0.2.0,
# config/dm_control_suite_params.py, brax_ppo_config), with Brax's PPO defaults where that file
# sets nothing (brax/training/agents/ppo/train.py: clipping_epsilon, gae_lambda). Brax collects
# batch_size x num_minibatches = 32,768 unrolls of 30 steps (16 rollouts of its 2,048 envs) per
# update, then makes 16 epochs of 32 minibatches of 1,024 unrolls; Trellis's anakin PPO updates
# on each rollout of its batch_size envs, so 2 minibatches of one 2,048-env rollout keep Brax's
# minibatch (30,720 transitions), its epochs and its SGD steps per env step.
_PLAYGROUND = ("Playground mujoco_playground/config/dm_control_suite_params.py "
               "(brax_ppo_config)")
_BRAX = "Brax brax/training/agents/ppo/train.py (train's defaults)"
_APPROXIMATE = ("Trellis: one 2,048-env rollout per update, so 2 minibatches keep Playground's "
                "minibatch of 1,024 unrolls x 30 and its SGD steps per env step (its 32 "
                "minibatches are of 16 rollouts)")
DMC = Preset(
    source=_PLAYGROUND,
    settings={
        "batch_size": 2048,  # num_envs (anakin: the envs of a member).
        "unroll_length": 30,
        "num_epochs": 16,  # num_updates_per_batch.
        "num_minibatches": 2,
        "learning_rate": 1e-3,
        "entropy_cost": 1e-2,
        "discount": 0.995,  # discounting.
        "reward_scale": 10.0,  # reward_scaling.
        "normalize_observations": True,
        "clip_epsilon": 0.3,  # clipping_epsilon.
        "gae_lambda": 0.95,
        "hidden_sizes": (256, 256),
        "total_env_steps": 60_000_000,  # num_timesteps.
    },
    sources={
        "num_minibatches": _APPROXIMATE,
        "clip_epsilon": _BRAX,
        "gae_lambda": _BRAX,
        "hidden_sizes": ("Trellis: one width for both torsos (Brax's policy is 32 x 4, its "
                         "value 256 x 5, swish; Trellis's MLP torso is tanh)"),
    })
