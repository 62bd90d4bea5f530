"""MuZero configuration: the self-play settings AlphaZero has too (self-play, search, replay,
evaluation games: agents/common/self_play_config.py) and those of the learned model."""

from __future__ import annotations

import dataclasses

from trellis.agents.common.self_play_config import GUMBEL_SOURCE, SelfPlayConfig
from trellis.agents.presets import Preset
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
    `scale_gradient`). The value targets are the games' outcomes (the paper's, on board games)
    or, with `td_steps` = n, bootstrapped from the search's root value n moves on where the
    game goes on longer (its pseudocode's `make_target`; agents/muzero/losses.py).
    """

    latent_size: int = setting(64, "units of the model's latent state", ge=1)
    num_unroll_steps: int = setting(
        5, "K: moves the model is unrolled from each sampled position (MuZero: 5)", ge=1)
    reward_cost: float = setting(1.0, "weight of the reward loss", ge=0)
    td_steps: int = setting(
        0, "n: value targets bootstrapped from the search's root value n moves on where the "
        "game goes on longer (0: the game's outcome, MuZero's board games)", ge=0)
    dynamics_grad_scale: float = setting(
        0.5, "scale of the latent's gradient where it enters the dynamics (MuZero: 0.5)",
        gt=0, le=1)

    def check(self) -> None:
        super().check()
        # A position's next K moves, and the n after the last of them, lie in its iteration's
        # moves and the next's.
        if self.num_unroll_steps + self.td_steps > self.unroll_length:
            raise self.invalid("num_unroll_steps", f"<= unroll_length - td_steps = "
                               f"{self.unroll_length - self.td_steps}")


# Tic-tac-toe (`--preset=auto` picks it for pgx:tic_tac_toe: launch/flags/presets.py): no game
# lost to minimax after 10 minutes on 2 cores, seeds 0-3 (agents/muzero/README.md). What bounds
# the model is what self-play shows it more than its fit: with AlphaZero's preset it fitted its
# own games and lost half its games to minimax. Three random opening moves, then a quarter of
# the later moves at random, put it in positions its own play never reaches (a threat left
# open: without the later ones seeds 0, 1 and 2 lost 1, 3 and 0 positions of minimax's lines);
# 2 x 256 units and a latent of 128 fit faster than the defaults (on exact targets,
# benchmarks/muzero_model.py --fit, a fifth of their value and reward losses after 6,000
# updates); 32 updates an iteration fit that wider data; the budget is what 10 minutes then
# play.
TIC_TAC_TOE = Preset(
    source="Trellis's own runs on a 2-core CPU, agents/muzero/README.md (tic-tac-toe, "
           "2026-12-07)",
    settings={"search_policy": "gumbel", "num_simulations": 64, "unroll_length": 9,
              "replay_size": 1_000_000, "total_env_steps": 550_000,
              "learning_rate_schedule": "linear", "eval_opponent": "minimax",
              "eval_every_updates": 8_000, "random_opening_moves": 3,
              "random_move_probability": 0.25,
              "eval_simulations": 200, "hidden_sizes": (256, 256), "latent_size": 128,
              "updates_per_iteration": 32},
    sources={"search_policy": GUMBEL_SOURCE})
