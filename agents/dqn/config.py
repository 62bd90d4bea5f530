"""DQN configuration; Ape-X is a preset of it (`ApexConfig`, `--agent=apex`)."""

from __future__ import annotations

import dataclasses

from trellis.builders.contract.config import ReplayConfig, setting


@dataclasses.dataclass(frozen=True)
class DQNConfig(ReplayConfig):
    """Hyper-parameters of DQN with double Q-learning, a dueling head, n-step returns and
    prioritized replay (Mnih et al., 2015; van Hasselt et al., 2016; Wang et al., 2016;
    Schaul et al., 2016).

    Defaults learn CartPole-v1 on a 2-core machine with run.py's 2 x 32 envs.
    """

    unroll_length: int = 4
    batch_size: int = 64
    hidden_sizes: tuple[int, ...] = (128, 128)  # MLP torso (conv for pixels), dueling head.
    max_grad_norm: float = 10.0

    # Prioritized replay: P(i) ~ p_i^priority_exponent; importance weights
    # (N P(i))^-importance_exponent, normalised by the batch's largest.
    priority_exponent: float = setting(0.6, "prioritized replay: priority exponent", ge=0)
    importance_exponent: float = setting(
        0.4, "prioritized replay: importance-weight exponent", ge=0)
    priority_epsilon: float = setting(1e-3, "added to |TD error| so no transition starves", gt=0)

    target_update_period: int = setting(
        100, "SGD steps between copies of the online network to the target", ge=1)
    huber_delta: float = setting(1.0, "Huber loss threshold on the TD error", gt=0)

    # Exploration (epsilon-greedy). Env slot k acts with epsilon
    #   max(ladder_k, linear decay from 1 to 0 over `epsilon_decay_updates` SGD steps),
    #   ladder_k = epsilon ** (1 + epsilon_alpha * i / (num_epsilons - 1)), i = k mod num_epsilons
    # (ladder_k = epsilon when num_epsilons == 1): one decaying epsilon for DQN, the fixed
    # per-actor epsilons of Ape-X (Horgan et al., 2018) with num_epsilons > 1.
    epsilon: float = setting(0.01, "exploration epsilon (the base of the ladder)", ge=0, le=1)
    num_epsilons: int = setting(1, "classes of env slots with their own epsilon", ge=1)
    epsilon_alpha: float = setting(7.0, "exponent spread of the epsilon ladder", ge=0)
    epsilon_decay_updates: int = setting(
        4_000, "SGD steps of the decay from 1 to the ladder's epsilons; 0: no decay", ge=0)

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
