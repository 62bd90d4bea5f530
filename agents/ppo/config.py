"""PPO configuration."""

from __future__ import annotations

import dataclasses

from trellis.builders.config import require


@dataclasses.dataclass(frozen=True)
class PPOConfig:
    """Hyper-parameters of PPO (Schulman et al., 2017).

    Defaults solve CartPole-v1 fast on a 2-core machine with run.py's 2 x 32 envs (tuned with
    the sweep in agents/ppo/README.md).
    """

    # Data: each learner batch is `batch_size` unrolls of `unroll_length` steps.
    unroll_length: int = 16
    batch_size: int = 64
    max_queue_size: int = 1  # Unroll batches in flight; bounds how off-policy the data is.

    # Optimisation per batch: `num_epochs` passes, each over `num_minibatches` minibatches
    # of the batch's T * B transitions, shuffled.
    num_epochs: int = 4
    num_minibatches: int = 4

    # Network.
    hidden_sizes: tuple[int, ...] = (64, 64)

    # Returns and advantages.
    discount: float = 0.99
    gae_lambda: float = 0.95
    normalize_advantages: bool = True

    # Loss.
    clip_epsilon: float = 0.2
    value_clip_epsilon: float | None = None  # None: no value clipping.
    value_cost: float = 0.5
    entropy_cost: float = 0.0

    # Optimiser.
    learning_rate: float = 2.5e-3
    max_grad_norm: float = 0.5
    adam_eps: float = 1e-5

    def __post_init__(self):
        def check(ok: bool, message: str) -> None:
            require(ok, f"PPOConfig: {message}")

        for name in ("unroll_length", "batch_size", "max_queue_size", "num_epochs",
                     "num_minibatches"):
            value = getattr(self, name)
            check(value >= 1, f"{name} must be >= 1, got {value}")
        check(
            self.num_transitions % self.num_minibatches == 0,
            f"num_minibatches={self.num_minibatches} must divide the unroll_length * batch_size "
            f"= {self.num_transitions} transitions of a batch",
        )
        check(
            len(self.hidden_sizes) >= 1 and all(h > 0 for h in self.hidden_sizes),
            f"hidden_sizes must be positive, got {self.hidden_sizes}",
        )
        check(0.0 <= self.discount <= 1.0, f"discount must be in [0, 1], got {self.discount}")
        check(0.0 <= self.gae_lambda <= 1.0,
              f"gae_lambda must be in [0, 1], got {self.gae_lambda}")
        check(self.clip_epsilon > 0.0, f"clip_epsilon must be > 0, got {self.clip_epsilon}")
        check(
            self.value_clip_epsilon is None or self.value_clip_epsilon > 0.0,
            f"value_clip_epsilon must be > 0 or None (no clipping), got {self.value_clip_epsilon}",
        )
        for name in ("value_cost", "entropy_cost", "max_grad_norm", "adam_eps"):
            value = getattr(self, name)
            check(value >= 0.0, f"{name} must be >= 0, got {value}")
        check(self.learning_rate > 0.0, f"learning_rate must be > 0, got {self.learning_rate}")

    @property
    def num_transitions(self) -> int:
        """Transitions per learner batch, T * B."""
        return self.unroll_length * self.batch_size

    @property
    def minibatch_size(self) -> int:
        return self.num_transitions // self.num_minibatches
