"""DQN configuration; Ape-X is a preset of it (`ApexConfig`, `--agent=apex`)."""

from __future__ import annotations

import dataclasses

from trellis.builders.config import require


@dataclasses.dataclass(frozen=True)
class DQNConfig:
    """Hyper-parameters of DQN with double Q-learning, a dueling head, n-step returns and
    prioritized replay (Mnih et al., 2015; van Hasselt et al., 2016; Wang et al., 2016;
    Schaul et al., 2016).

    Defaults learn CartPole-v1 on a 2-core machine with run.py's 2 x 32 envs.
    """

    # Data from inference: each learner step receives `batch_size` unrolls of
    # `unroll_length` steps, turned into n-step transitions and inserted into replay.
    unroll_length: int = 4
    batch_size: int = 64
    max_queue_size: int = 2  # Unroll batches in flight before inference waits.

    # Returns.
    discount: float = 0.99
    n_step: int = 3

    # Prioritized replay: P(i) ~ p_i^priority_exponent; importance weights
    # (N P(i))^-importance_exponent, normalised by the batch's largest.
    replay_size: int = 100_000
    min_replay_size: int = 2_000  # No updates before the table holds this many transitions.
    priority_exponent: float = 0.6
    importance_exponent: float = 0.4
    priority_epsilon: float = 1e-3  # Added to |TD error| so no transition starves.

    # Optimisation: per learner step, `updates_per_step` SGD steps on prioritized samples of
    # `sample_batch_size` transitions; the target network copies the online one every
    # `target_update_period` SGD steps.
    updates_per_step: int = 32
    sample_batch_size: int = 128
    target_update_period: int = 100
    learning_rate: float = 1e-3
    max_grad_norm: float = 10.0
    adam_eps: float = 1e-8
    huber_delta: float = 1.0

    # Network: MLP torso (conv for pixels) and a dueling head.
    hidden_sizes: tuple[int, ...] = (128, 128)

    # Exploration (epsilon-greedy). Env slot k acts with epsilon
    #   max(ladder_k, linear decay from 1 to 0 over `epsilon_decay_updates` SGD steps),
    #   ladder_k = epsilon ** (1 + epsilon_alpha * i / (num_epsilons - 1)), i = k mod num_epsilons
    # (ladder_k = epsilon when num_epsilons == 1): one decaying epsilon for DQN, the fixed
    # per-actor epsilons of Ape-X (Horgan et al., 2018) with num_epsilons > 1.
    epsilon: float = 0.01
    num_epsilons: int = 1
    epsilon_alpha: float = 7.0
    epsilon_decay_updates: int = 4_000  # 0: no decay.

    def __post_init__(self):
        def check(ok: bool, message: str) -> None:
            require(ok, f"DQNConfig: {message}")

        for name in ("unroll_length", "batch_size", "max_queue_size", "n_step", "replay_size",
                     "min_replay_size", "updates_per_step", "sample_batch_size",
                     "target_update_period", "num_epsilons"):
            value = getattr(self, name)
            check(value >= 1, f"{name} must be >= 1, got {value}")
        check(self.min_replay_size <= self.replay_size,
              f"min_replay_size={self.min_replay_size} must be <= replay_size="
              f"{self.replay_size}")
        check(0.0 <= self.discount <= 1.0, f"discount must be in [0, 1], got {self.discount}")
        for name in ("priority_exponent", "importance_exponent", "epsilon_alpha",
                     "epsilon_decay_updates", "max_grad_norm"):
            value = getattr(self, name)
            check(value >= 0, f"{name} must be >= 0, got {value}")
        for name in ("priority_epsilon", "learning_rate", "adam_eps", "huber_delta"):
            value = getattr(self, name)
            check(value > 0, f"{name} must be > 0, got {value}")
        check(0.0 <= self.epsilon <= 1.0, f"epsilon must be in [0, 1], got {self.epsilon}")
        check(len(self.hidden_sizes) >= 1 and all(h > 0 for h in self.hidden_sizes),
              f"hidden_sizes must be positive, got {self.hidden_sizes}")

    @property
    def epsilons(self) -> tuple[float, ...]:
        """The ladder of per-slot epsilons (before the decay is applied)."""
        n = self.num_epsilons
        if n == 1:
            return (self.epsilon,)
        return tuple(self.epsilon ** (1 + self.epsilon_alpha * i / (n - 1)) for i in range(n))


@dataclasses.dataclass(frozen=True)
class ApexConfig(DQNConfig):
    """Ape-X (Horgan et al., 2018): DQN with fixed per-actor epsilons
    0.4 ** (1 + 7 i / (N - 1)) over N = 8 env-slot classes and no decay."""

    epsilon: float = 0.4
    num_epsilons: int = 8
    epsilon_decay_updates: int = 0
