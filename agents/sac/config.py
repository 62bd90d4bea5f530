"""SAC configuration."""

from __future__ import annotations

import dataclasses

from trellis.agents.common.continuous import ActorCriticConfig
from trellis.builders.contract.config import setting


@dataclasses.dataclass(frozen=True)
class SACConfig(ActorCriticConfig):
    """Hyper-parameters of Soft Actor-Critic with twin critics and a learned temperature
    (Haarnoja et al., 2018, "Soft Actor-Critic Algorithms and Applications").

    Defaults (`ActorCriticConfig`'s) learn Pendulum-v1 on a 2-core machine with run.py's
    2 x 32 envs. Replay is uniform; the target critics track the online ones by Polyak
    averaging with step size `tau` after every SGD step.
    """

    # Temperature: alpha starts at `initial_temperature`; the target entropy is
    # -action_dim (the paper's heuristic) unless set here.
    initial_temperature: float = setting(1.0, "initial entropy temperature alpha", gt=0)
    target_entropy: float | None = setting(None, "target entropy; none: -action_dim")
    # The policy's log std is clipped to this range, so exp() neither vanishes nor explodes.
    log_std_min: float = setting(-5.0, "lower clip of the policy's log std")
    log_std_max: float = setting(2.0, "upper clip of the policy's log std; > log_std_min")

    def check(self) -> None:
        super().check()
        if self.log_std_min >= self.log_std_max:
            raise self.invalid("log_std_min", f"< log_std_max = {self.log_std_max}")
