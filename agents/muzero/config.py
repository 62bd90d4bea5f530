"""MuZero configuration: the self-play settings AlphaZero has too (self-play, search, replay,
evaluation games: agents/common/self_play_config.py) and those of the learned model."""

from __future__ import annotations

import dataclasses

from trellis.agents.common.self_play_config import SelfPlayConfig
from trellis.builders.contract.config import setting


@dataclasses.dataclass(frozen=True)
class MuZeroConfig(SelfPlayConfig):
    """Hyper-parameters of MuZero (Schrittwieser et al., 2020, "Mastering Atari, Go, chess and
    shogi by planning with a learned model") on a two-player pgx game.

    Self-play, search, replay and evaluation games are `SelfPlayConfig`'s settings, as
    AlphaZero's; the search steps the learned model instead of the game. The model:
    `hidden_sizes` for each of the representation, dynamics and prediction networks, a latent
    state of `latent_size` units min-max scaled to [0, 1] (the paper's appendix G). Learning
    unrolls the model `num_unroll_steps` moves from each sampled position (the paper's K = 5),
    each step's loss gradient scaled by 1 / K and the latent's gradient by
    `dynamics_grad_scale` (0.5) where it enters the dynamics (the paper's pseudocode,
    `scale_gradient`).
    """

    latent_size: int = setting(64, "units of the model's latent state", ge=1)
    num_unroll_steps: int = setting(
        5, "K: moves the model is unrolled from each sampled position (MuZero: 5)", ge=1)
    reward_cost: float = setting(1.0, "weight of the reward loss", ge=0)
    dynamics_grad_scale: float = setting(
        0.5, "scale of the latent's gradient where it enters the dynamics (MuZero: 0.5)",
        gt=0, le=1)

    def check(self) -> None:
        super().check()
        if self.num_unroll_steps > self.unroll_length:
            # A position's next K moves lie in its iteration's moves and the next's.
            raise self.invalid("num_unroll_steps", f"<= unroll_length = {self.unroll_length}")
