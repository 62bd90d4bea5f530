"""MPO configuration."""

from __future__ import annotations

import dataclasses

from trellis.agents.common.continuous import ActorCriticConfig
from trellis.agents.presets import Preset
from trellis.builders.contract.config import setting

# Acme's defaults (acme/agents/jax/mpo/config.py `MPOConfig` and types.py
# `GaussianPolicyLossConfig`), cited by the settings that take them.
_ACME = "Acme acme/agents/jax/mpo config.py MPOConfig and types.py GaussianPolicyLossConfig"


@dataclasses.dataclass(frozen=True)
class MPOConfig(ActorCriticConfig):
    """Hyper-parameters of MPO (Abdolmaleki et al., 2018, "Maximum a Posteriori Policy
    Optimisation"), as Acme's Gaussian MPO: `num_samples` actions per state from the target
    policy, a temperature dual under `epsilon`, decoupled KL bounds on the mean and the std
    (one multiplier per action dimension each), Acme's action penalization, a critic learned
    from n-step targets, and target networks copied every `target_update_period` SGD steps.

    The constraint settings are Acme's defaults; replay and batch sizes are SAC's Pendulum-v1
    ones (`ActorCriticConfig`: run.py's 2 x 32 envs on 2 cores), with Acme's 5-step returns.
    """

    n_step: int = 5  # Acme: experience_type FromTransitions(n_step=5).
    num_samples: int = setting(20, "actions sampled per state in the E-step (Acme's 20)", ge=2)
    epsilon: float = setting(
        0.1, "E-step: KL bound of the reweighted policy from the target (Acme's 0.1)", gt=0)
    epsilon_mean: float = setting(
        0.0025, "M-step: KL bound on the mean, per action dimension (Acme's 0.0025)", gt=0)
    epsilon_stddev: float = setting(
        1e-6, "M-step: KL bound on the std, per action dimension (Acme's 1e-6)", gt=0)
    action_penalization: bool = setting(
        True, "weigh samples by how little they leave the action bounds (Acme's, MO-MPO)")
    epsilon_penalty: float = setting(
        0.001, "KL bound of the action penalization's E-step (Acme's 0.001)", gt=0)
    # Acme's init_log_temperature / _alpha_mean / _alpha_stddev: the softplus preimages of
    # the multipliers' first values (softplus(10) is 10 to 4 decimals).
    init_temperature: float = setting(10.0, "the temperature's first value (Acme's 10)", gt=0)
    init_alpha_mean: float = setting(10.0, "the mean's KL multiplier's first value", gt=0)
    init_alpha_stddev: float = setting(1000.0, "the std's KL multiplier's first value", gt=0)
    dual_learning_rate: float = setting(
        1e-2, "Adam's learning rate of the Lagrange multipliers (Acme's 0.01)", gt=0)
    target_update_period: int = setting(
        100, "SGD steps between copies of the online networks to the targets (Acme's 100); "
        "0: Polyak averaging by tau after every step", ge=0)
    init_scale: float = setting(0.7, "the policy's std at initialisation, in half-ranges "
                                "(Acme's control networks: 0.7)", gt=0)
    min_scale: float = setting(1e-6, "the smallest std the policy can give", gt=0)


# `--preset=mujoco` (chosen by itself for Gymnasium's MuJoCo envs; docs/presets.md): Acme's
# MPO on its control-suite defaults (acme/agents/jax/mpo/config.py, types.py), with its
# policy's (256, 256, 256) layers (networks.py's `make_control_networks`; one width for both
# networks here: the critic's are 512, 512, 256 there) and a plain Q critic (Acme's default is
# a mixture of Gaussians). samples_per_insert 32 over batches of 256 is 1/8 of an update per
# env step: the replay ratio 0.125.
_ACME_NETWORKS = ("Acme acme/agents/jax/mpo/networks.py make_control_networks: the policy's "
                  "layers (its critic's are 512, 512, 256)")
_TRELLIS = "Trellis: acting in 2 x 4 envs, each learner step's unrolls; no counterpart"
MUJOCO = Preset(
    source=_ACME,
    settings={
        "min_replay_size": 1_000,
        "replay_ratio": 0.125,  # samples_per_insert 32 / batch_size 256.
        "learning_rate": 1e-4,
        "dual_learning_rate": 1e-2,
        "replay_size": 1_000_000,
        "sample_batch_size": 256,
        "discount": 0.99,
        "n_step": 5,
        "hidden_sizes": (256, 256, 256),
        "num_samples": 20,
        "epsilon": 0.1,
        "epsilon_mean": 0.0025,
        "epsilon_stddev": 1e-6,
        "target_update_period": 100,
        "num_actors": 2,
        "envs_per_actor": 4,
        "unroll_length": 8,
        "batch_size": 8,
        "updates_per_step": 8,
    },
    sources={"hidden_sizes": _ACME_NETWORKS,
             **{name: _TRELLIS for name in ("num_actors", "envs_per_actor", "unroll_length",
                                            "batch_size", "updates_per_step")}})
