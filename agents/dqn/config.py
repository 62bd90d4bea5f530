"""DQN configuration: each of Rainbow's parts is a setting, so Rainbow (`RainbowConfig`,
`--agent=rainbow`) and Ape-X (`ApexConfig`, `--agent=apex`) are DQN with other defaults."""

from __future__ import annotations

import dataclasses

from trellis.agents.presets import Preset
from trellis.builders.contract.config import ReplayConfig, setting


@dataclasses.dataclass(frozen=True)
class DQNConfig(ReplayConfig):
    """Hyper-parameters of DQN (Mnih et al., 2015) with Rainbow's parts (Hessel et al., 2018),
    each a setting: double Q-learning (van Hasselt et al., 2016), prioritized replay (Schaul
    et al., 2016; priority_exponent 0 turns it off), a dueling head (Wang et al., 2016),
    n-step returns (n_step 1 turns them off), a categorical return distribution (C51,
    Bellemare et al., 2017; num_atoms 1 turns it off) and noisy nets (Fortunato et al., 2018).

    Defaults (double Q, prioritized, dueling, 3-step; no C51, no noisy nets) learn CartPole-v1
    on a 2-core machine with run.py's 2 x 32 envs.
    """

    unroll_length: int = 4
    batch_size: int = 64
    hidden_sizes: tuple[int, ...] = (128, 128)  # MLP torso (conv for pixels), then the head.
    max_grad_norm: float = 10.0
    pixel_torso: str = setting(
        "nature", "torso for pixel observations: nature (the DQN paper's conv layers), resnet "
        "(the IMPALA paper's deep residual torso) or minatar (the MinAtar paper's one 3x3 conv "
        "and 128 units, for its 10x10 grids)", choices=("nature", "resnet", "minatar"))

    # Rainbow's parts (n-step returns: ReplayConfig's n_step; prioritized replay: below).
    double_q: bool = setting(
        True, "double Q-learning: the online network picks the bootstrap action, the target "
        "network values it; false: the target network's own greedy action")
    dueling: bool = setting(True, "dueling head, Q = V + A - mean(A); false: one linear head")
    num_atoms: int = setting(
        1, "atoms of the categorical return distribution over [v_min, v_max] (C51: 51), "
        "learned by cross-entropy; 1: expected Q-values and the Huber loss", ge=1)
    v_min: float = setting(-10.0, "C51: the smallest return atom")
    v_max: float = setting(10.0, "C51: the largest return atom")
    noisy: bool = setting(
        False, "noisy nets: the head's linear layers get factorised Gaussian noise on their "
        "weights, resampled every policy call and SGD step, and explore with it (evaluation "
        "uses the mean weights)")
    noisy_sigma0: float = setting(
        0.5, "noisy nets: initial noise scale sigma0 (sigma = sigma0 / sqrt(fan-in))", gt=0)

    # Prioritized replay: P(i) ~ p_i^priority_exponent; importance weights
    # (N P(i))^-importance_exponent, normalised by the batch's largest.
    priority_exponent: float = setting(
        0.6, "prioritized replay: priority exponent; 0: uniform sampling (and importance "
        "weights of 1)", ge=0)
    importance_exponent: float = setting(
        0.4, "prioritized replay: importance-weight exponent", ge=0)
    priority_epsilon: float = setting(1e-3, "added to |TD error| so no transition starves", gt=0)

    target_update_period: int = setting(
        100, "SGD steps between copies of the online network to the target", ge=1)
    huber_delta: float = setting(
        1.0, "Huber loss threshold on the TD error (num_atoms 1)", gt=0)

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

    def check(self) -> None:
        super().check()
        if self.num_atoms > 1 and self.v_max <= self.v_min:
            raise self.invalid("v_max", f"> v_min = {self.v_min} (the atoms' support)")

    @property
    def distributional(self) -> bool:
        """Whether the head outputs a categorical return distribution (C51)."""
        return self.num_atoms > 1

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


@dataclasses.dataclass(frozen=True)
class RainbowConfig(DQNConfig):
    """Rainbow (Hessel et al., 2018): DQN with all six parts on. Over DQN's defaults it adds a
    51-atom C51 head over [-10, 10] and noisy nets (sigma0 0.5), which replace epsilon-greedy
    exploration (epsilon 0, as in the paper), with the paper's priority exponent 0.5."""

    num_atoms: int = 51
    noisy: bool = True
    priority_exponent: float = 0.5
    epsilon: float = 0.0
    epsilon_decay_updates: int = 0


# `--preset=minatar` (chosen by itself for MinAtar's games; docs/presets.md): Dopamine's MinAtar
# configs (its labs/environments/minatar, the JAX agents "Revisiting Rainbow", Obando-Ceron and
# Castro 2021, built on), which act in one env and take one SGD step every 4 env steps
# (replay_ratio 0.25); their target update every
# 1,000 env steps is 250 SGD steps here, their epsilon decay over 250,000 env steps (JaxDQNAgent's
# default) 62,500. DQN's is their JaxDQNAgent (1-step, plain max, no dueling head, uniform
# replay, Huber loss); Rainbow's their JaxRainbowAgent's settings (C51 over [-100, 100], 3-step,
# prioritized with Dopamine's exponents 0.5), with Rainbow's noisy nets, dueling head and double
# Q, which Dopamine's simplified agent leaves out, kept on (RainbowConfig).
_DOPAMINE = "Dopamine (Castro et al., 2018) dopamine/labs/environments/minatar/{}_breakout.gin"
_MINATAR_NET = "Young and Tian (2019), MinAtar, section 4's network"
_DOPAMINE_MINATAR = {
    "pixel_torso": "minatar",
    "discount": 0.99,
    "min_replay_size": 1_000,
    "replay_ratio": 0.25,  # update_period 4.
    "target_update_period": 250,  # 1,000 env steps.
    "learning_rate": 2.5e-4,
    "adam_eps": 3.125e-4,
    "replay_size": 100_000,
    "sample_batch_size": 32,
    "epsilon": 0.01,
    "epsilon_decay_updates": 62_500,  # 250,000 env steps.
}
DQN_MINATAR = Preset(
    source=_DOPAMINE.format("dqn"),
    settings={**_DOPAMINE_MINATAR, "n_step": 1, "double_q": False, "dueling": False,
              "priority_exponent": 0.0, "importance_exponent": 0.0},
    sources={"pixel_torso": _MINATAR_NET})
RAINBOW_MINATAR = Preset(
    source=_DOPAMINE.format("rainbow"),
    settings={**_DOPAMINE_MINATAR, "n_step": 3, "num_atoms": 51, "v_min": -100.0,
              "v_max": 100.0, "priority_exponent": 0.5, "importance_exponent": 0.5,
              "epsilon": 0.0, "epsilon_decay_updates": 0},
    sources={"pixel_torso": _MINATAR_NET,
             "epsilon": "Hessel et al. (2018): noisy nets explore, epsilon 0",
             "epsilon_decay_updates": "Hessel et al. (2018): noisy nets explore, epsilon 0"})
