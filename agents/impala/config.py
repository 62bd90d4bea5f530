"""IMPALA configuration."""

from __future__ import annotations

import dataclasses

from trellis.builders.config import require


@dataclasses.dataclass(frozen=True)
class ImpalaConfig:
    """Hyper-parameters of IMPALA (Espeholt et al., 2018).

    Defaults solve CartPole-v1 fast on a 2-core machine: short unrolls and a high learning
    rate give many small updates per env step (tuned with the sweep in agents/impala/README).
    """

    # Data: each learner batch is `batch_size` unrolls of `unroll_length` steps.
    unroll_length: int = 5
    batch_size: int = 32
    max_queue_size: int = 8  # Unroll batches in flight; bounds the policy lag.

    # Network.
    hidden_sizes: tuple[int, ...] = (64, 64)

    # Loss.
    discount: float = 0.99
    baseline_cost: float = 0.5
    entropy_cost: float = 0.01
    clip_rho_threshold: float = 1.0
    clip_pg_rho_threshold: float = 1.0
    vtrace_lambda: float = 1.0

    # Optimiser.
    learning_rate: float = 5e-3
    max_grad_norm: float = 40.0
    adam_eps: float = 1e-6

    def __post_init__(self):
        def check(ok: bool, message: str) -> None:
            require(ok, f"ImpalaConfig: {message}")

        check(self.unroll_length >= 1, f"unroll_length must be >= 1, got {self.unroll_length}")
        check(self.batch_size >= 1, f"batch_size must be >= 1, got {self.batch_size}")
        check(self.max_queue_size >= 1, f"max_queue_size must be >= 1, got {self.max_queue_size}")
        check(
            len(self.hidden_sizes) >= 1 and all(h > 0 for h in self.hidden_sizes),
            f"hidden_sizes must be positive, got {self.hidden_sizes}",
        )
        check(0.0 <= self.discount <= 1.0, f"discount must be in [0, 1], got {self.discount}")
        check(0.0 <= self.vtrace_lambda <= 1.0,
              f"vtrace_lambda must be in [0, 1], got {self.vtrace_lambda}")
        for name in ("baseline_cost", "entropy_cost", "clip_rho_threshold",
                     "clip_pg_rho_threshold", "max_grad_norm", "adam_eps"):
            value = getattr(self, name)
            check(value >= 0.0, f"{name} must be >= 0, got {value}")
        check(self.learning_rate > 0.0, f"learning_rate must be > 0, got {self.learning_rate}")
