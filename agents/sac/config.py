"""SAC configuration."""

from __future__ import annotations

import dataclasses

from trellis.builders.config import require


@dataclasses.dataclass(frozen=True)
class SACConfig:
    """Hyper-parameters of Soft Actor-Critic with twin critics and a learned temperature
    (Haarnoja et al., 2018, "Soft Actor-Critic Algorithms and Applications").

    Defaults learn Pendulum-v1 on a 2-core machine with run.py's 2 x 32 envs.
    """

    # Data from inference: each learner step receives `batch_size` unrolls of
    # `unroll_length` steps, turned into n-step transitions and inserted into replay.
    unroll_length: int = 8
    batch_size: int = 64
    max_queue_size: int = 2  # Unroll batches in flight before inference waits.

    # Returns.
    discount: float = 0.99
    n_step: int = 1

    # Uniform replay.
    replay_size: int = 200_000
    min_replay_size: int = 5_000  # No updates before the table holds this many transitions.

    # Optimisation: per learner step, `updates_per_step` SGD steps on uniform samples of
    # `sample_batch_size` transitions; the target critics track the online ones by Polyak
    # averaging with step size `tau` after every SGD step.
    updates_per_step: int = 128
    sample_batch_size: int = 256
    learning_rate: float = 1e-3  # Of the policy, the critics and the temperature alike.
    max_grad_norm: float = 40.0
    adam_eps: float = 1e-8
    tau: float = 0.005

    # Temperature: alpha starts at `initial_temperature`; the target entropy is
    # -action_dim (the paper's heuristic) unless set here.
    initial_temperature: float = 1.0
    target_entropy: float | None = None

    # Networks: MLP torsos for the policy and each of the two critics.
    hidden_sizes: tuple[int, ...] = (64, 64)
    # The policy's log std is clipped to this range, so exp() neither vanishes nor explodes.
    log_std_min: float = -5.0
    log_std_max: float = 2.0

    def __post_init__(self):
        def check(ok: bool, message: str) -> None:
            require(ok, f"SACConfig: {message}")

        for name in ("unroll_length", "batch_size", "max_queue_size", "n_step", "replay_size",
                     "min_replay_size", "updates_per_step", "sample_batch_size"):
            value = getattr(self, name)
            check(value >= 1, f"{name} must be >= 1, got {value}")
        check(self.min_replay_size <= self.replay_size,
              f"min_replay_size={self.min_replay_size} must be <= replay_size="
              f"{self.replay_size}")
        check(0.0 <= self.discount <= 1.0, f"discount must be in [0, 1], got {self.discount}")
        check(0.0 < self.tau <= 1.0, f"tau must be in (0, 1], got {self.tau}")
        for name in ("learning_rate", "max_grad_norm", "adam_eps", "initial_temperature"):
            value = getattr(self, name)
            check(value > 0, f"{name} must be > 0, got {value}")
        check(self.log_std_min < self.log_std_max,
              f"log_std_min={self.log_std_min} must be < log_std_max={self.log_std_max}")
        check(len(self.hidden_sizes) >= 1 and all(h > 0 for h in self.hidden_sizes),
              f"hidden_sizes must be positive, got {self.hidden_sizes}")
