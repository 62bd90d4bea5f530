"""IMPALA configuration."""

from __future__ import annotations

import dataclasses

from trellis.builders.contract.config import AgentConfig, setting

# The defaults that depend on the core; a field left at None takes its core's value here.
# Feed-forward: CartPole-v1 fast on a 2-core machine, and a solved policy that holds: at a
# constant 4e-3 it collapsed within 1M env steps in 5 of 12 runs, decayed linearly over the 1M
# in none (agents/impala/README.md). LSTM: CartPoleNoVel-v1, where the core infers velocities
# from successive positions, which it sees only when they are normalized (their step-to-step
# change is ~0.01 raw); it also wants a slower learning rate and a narrower torso (the sweep in
# agents/impala/README.md), kept constant: it solves after 0.6-1.4M of run.py's 2M env steps,
# where the schedule would have halved its rate. Pixels: the
# feed-forward agent keeps the DQN paper's small conv torso (fast on CPUs), the recurrent one
# the IMPALA paper's.
CORE_DEFAULTS = {
    "none": {"learning_rate": 4e-3, "learning_rate_schedule": "linear", "hidden_sizes": (64, 64),
             "normalize_observations": False, "pixel_torso": "nature"},
    "lstm": {"learning_rate": 3e-3, "learning_rate_schedule": "constant", "hidden_sizes": (64,),
             "normalize_observations": True, "pixel_torso": "resnet"},
}


@dataclasses.dataclass(frozen=True)
class ImpalaConfig(AgentConfig):
    """Hyper-parameters of IMPALA (Espeholt et al., 2018).

    Feed-forward defaults solve CartPole-v1 fast on a 2-core machine: short unrolls and a
    high learning rate give many small updates per env step (tuned with the sweep in
    agents/impala/README). Fields set to None take the core's value from `CORE_DEFAULTS`
    when the config is made, so a config always holds the values it runs with.
    """

    # The fields `CORE_DEFAULTS` names default to None and hold it only until `__post_init__`
    # puts their core's value there (the flags read `| None` from these annotations, to take
    # "none" for "the core's default"). hidden_sizes, learning_rate and learning_rate_schedule
    # so widen AgentConfig's types with a None that a made config never holds, which a type
    # checker cannot see through `__post_init__`: hence the ignores on those three.

    # Network. The core's own settings (lstm_size) apply only with core "lstm".
    core: str = setting("none", "recurrent core after the torso: none (feed-forward) or lstm",
                        choices=("none", "lstm"))
    lstm_size: int = setting(64, "width of the LSTM core (with --core=lstm)", ge=1)
    hidden_sizes: tuple[int, ...] | None = setting(  # type: ignore[assignment]
        None, "widths of the MLP torso's hidden layers, comma-separated; none: 64,64, or 64 "
        "with --core=lstm", ge=1)
    pixel_torso: str | None = setting(
        None, "torso for pixel observations: nature (the DQN paper's conv layers), resnet (the "
        "IMPALA paper's deep residual torso) or minatar (the MinAtar paper's one 3x3 conv and "
        "128 units, for its 10x10 grids); none: nature, or resnet with --core=lstm",
        choices=("nature", "resnet", "minatar"))
    normalize_observations: bool | None = setting(
        None, "normalize vector observations by their running mean and variance over the "
        "learner's batches; none: only with --core=lstm")

    unroll_length: int = 5
    batch_size: int = 32
    max_queue_size: int = 8  # Bounds the policy lag.
    learning_rate: float | None = setting(  # type: ignore[assignment]
        None, "Adam's learning rate; none: 4e-3, or 3e-3 with --core=lstm", gt=0)
    learning_rate_schedule: str | None = setting(  # type: ignore[assignment]
        None, "the learning rate's schedule: constant, or linear (falling to 0 at the end of "
        "the env-step budget, --total_env_steps; the IMPALA paper's); none: linear, or constant "
        "with --core=lstm", choices=("constant", "linear"))
    max_grad_norm: float = 40.0
    adam_eps: float = 1e-6

    # Loss.
    baseline_cost: float = setting(0.5, "weight of the value (baseline) loss", ge=0)
    entropy_cost: float = setting(0.01, "weight of the entropy bonus", ge=0)
    clip_rho_threshold: float = setting(
        1.0, "V-trace: clip of the importance weights in the value targets", ge=0)
    clip_pg_rho_threshold: float = setting(
        1.0, "V-trace: clip of the importance weights in the policy gradient", ge=0)
    vtrace_lambda: float = setting(
        1.0, "V-trace: lambda mixing n-step targets (1: full V-trace)", ge=0, le=1)
    reward_clip: float | None = setting(
        None, "the learner clips rewards to [-reward_clip, reward_clip] (Atari: 1); the "
        "reported returns stay unclipped; none: no clipping", gt=0)
    center_rewards: bool = setting(
        False, "the learner subtracts the batch's mean reward (over the steps it learns from, "
        "after reward_clip) before V-trace, so the baseline need not learn the returns' "
        "constant part; keep it off where episodes can terminate early: it changes what "
        "living longer is worth (independent IMPALA on MPE: on)")

    def __post_init__(self) -> None:
        for name, value in CORE_DEFAULTS.get(self.core, {}).items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, value)
        super().__post_init__()  # Validates the resolved values (and an unknown core).
