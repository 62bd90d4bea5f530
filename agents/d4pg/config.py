"""D4PG configuration."""

from __future__ import annotations

import dataclasses

from trellis.agents.common.continuous import ActorCriticConfig
from trellis.agents.presets import Preset
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


# `--preset=mujoco` (chosen by itself for Gymnasium's MuJoCo envs; docs/presets.md): neither
# RL Baselines3 Zoo nor CleanRL has D4PG, so Acme's own run on Gymnasium's MuJoCo envs
# (examples/baselines/rl_continuous/run_d4pg.py: its networks, vmax 1,000 for "gym" envs,
# learning rate 3e-4 and sigma 0.2, on acme/agents/jax/d4pg/config.py's defaults). Acme's
# samples_per_insert 32 with batches of 256 is 1/8 of an update per env step: the replay
# ratio 0.125. Acme copies its target networks every 100 updates; Trellis tracks them by
# Polyak averaging (tau stays Trellis's 0.005).
_ACME = ("Acme examples/baselines/rl_continuous/run_d4pg.py on acme/agents/jax/d4pg/config.py's "
         "defaults")
_TRELLIS = "Trellis: acting in 2 x 4 envs, each learner step's unrolls; no counterpart"
MUJOCO = Preset(
    source=_ACME,
    settings={
        "min_replay_size": 1_000,
        "replay_ratio": 0.125,  # samples_per_insert 32 / batch_size 256.
        "learning_rate": 3e-4,
        "replay_size": 1_000_000,
        "sample_batch_size": 256,
        "discount": 0.99,
        "n_step": 5,
        "hidden_sizes": (256, 256, 256),
        "num_atoms": 51,
        "v_min": -1000.0,
        "v_max": 1000.0,
        "exploration_noise": 0.2,  # sigma, on actions scaled to [-1, 1].
        "num_actors": 2,
        "envs_per_actor": 4,
        "unroll_length": 8,
        "batch_size": 8,
        "updates_per_step": 8,
    },
    sources={name: _TRELLIS for name in ("num_actors", "envs_per_actor", "unroll_length",
                                         "batch_size", "updates_per_step")})
