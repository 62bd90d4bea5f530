"""IMPALA configuration."""

from __future__ import annotations

import dataclasses

from trellis.builders.config import AgentConfig, setting


@dataclasses.dataclass(frozen=True)
class ImpalaConfig(AgentConfig):
    """Hyper-parameters of IMPALA (Espeholt et al., 2018).

    Defaults solve CartPole-v1 fast on a 2-core machine: short unrolls and a high learning
    rate give many small updates per env step (tuned with the sweep in agents/impala/README).
    """

    # Network. The core's own settings (lstm_size) apply only with core "lstm".
    core: str = setting("none", "recurrent core after the torso: none (feed-forward) or lstm",
                        choices=("none", "lstm"))
    lstm_size: int = setting(128, "width of the LSTM core (with --core=lstm)", ge=1)

    unroll_length: int = 5
    batch_size: int = 32
    max_queue_size: int = 8  # Bounds the policy lag.
    learning_rate: float = 5e-3
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
