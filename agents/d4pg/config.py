"""D4PG configuration."""

from __future__ import annotations

import dataclasses

from trellis.agents.common.continuous import ActorCriticConfig
from trellis.builders.contract.config import setting


@dataclasses.dataclass(frozen=True)
class D4PGConfig(ActorCriticConfig):
    """Hyper-parameters of D4PG (Barth-Maron et al., 2018, "Distributed Distributional
    Deterministic Policy Gradients").

    A categorical critic over `num_atoms` returns in [v_min, v_max] (the paper's 51 atoms;
    set the range to the env's discounted returns: the defaults fit Pendulum-v1's, whose
    rewards lie in [-16.3, 0]; the paper used [-150, 150] for the DeepMind control suite),
    N-step returns (the paper's 5), Gaussian exploration noise on a deterministic policy, and
    Ape-X-style acting: every env worker feeds one replay table through central inference,
    sampled uniformly by default or by priority (`priority_exponent` > 0, the paper's
    prioritized variant, priorities the critic's cross-entropy). Replay and batch sizes are
    SAC's Pendulum defaults here (run.py's 2 x 32 envs on 2 cores).
    """

    n_step: int = 5
    num_atoms: int = setting(51, "atoms of the critic's categorical return distribution", ge=2)
    v_min: float = setting(-1500.0, "the smallest return atom")
    v_max: float = setting(0.0, "the largest return atom; > v_min")
    exploration_noise: float = setting(
        0.3, "std of the Gaussian noise on acting, in half-ranges of the action", ge=0)
    priority_exponent: float = setting(
        0.0, "prioritized replay's exponent; 0: uniform sampling", ge=0)
    importance_exponent: float = setting(
        0.4, "prioritized replay: importance-weight exponent", ge=0)
    priority_epsilon: float = setting(1e-3, "added to the priorities so none starves", gt=0)

    def check(self) -> None:
        super().check()
        if self.v_min >= self.v_max:
            raise self.invalid("v_min", f"< v_max = {self.v_max}")

    @property
    def prioritized(self) -> bool:
        return self.priority_exponent > 0
