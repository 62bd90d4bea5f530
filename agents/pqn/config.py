"""PQN configuration: the published MinAtar settings by default, each with its source."""

from __future__ import annotations

import dataclasses

from trellis.builders.contract.config import AgentConfig, setting

# The sources of the defaults below (settings, not code):
# - the paper: Gallici et al., 2024, "Simplifying Deep Temporal Difference Learning",
#   https://arxiv.org/abs/2407.04811 (layer norm, no target network, no replay, Q(lambda),
#   RAdam);
# - its code's MinAtar settings: purejaxql (github.com/mttga/purejaxql) at 0cd95ed,
#   purejaxql/config/alg/pqn_minatar.yaml, named here by their keys (NUM_ENVS, ...);
# - its CartPole settings, for vector observations: pqn_cartpole.yaml at 970ecce.


@dataclasses.dataclass(frozen=True)
class PQNConfig(AgentConfig):
    """Hyper-parameters of PQN (Gallici et al., 2024): Q-learning on the unrolls of many
    parallel envs, with Q(lambda) targets over each batch, a layer-normed Q-network, no target
    network and no replay; epsilon-greedy acting with a linearly decaying epsilon; several
    epochs of minibatches per batch. The optimizer is RAdam (the paper's) after global-norm
    clipping: `learning_rate` and `adam_eps` are RAdam's.

    On anakin `batch_size` is the number of envs (NUM_ENVS); on the host platforms it is the
    number of env workers' unrolls per update.
    """

    unroll_length: int = 32  # NUM_STEPS: steps per env and update.
    batch_size: int = 128  # NUM_ENVS.
    # On-policy data: the targets use the learner's Q at the batch, as close as can be to the
    # Q that acted (on anakin the same one).
    max_queue_size: int = 1
    # Vector observations: HIDDEN_SIZE 256 x NUM_LAYERS 2 (pqn_cartpole.yaml). Grids
    # (MinAtar) get the paper's MinAtar torso instead (networks.py).
    hidden_sizes: tuple[int, ...] = (256, 256)
    discount: float = 0.99  # GAMMA.
    learning_rate: float = 5e-4  # LR.
    # LR_LINEAR_DECAY: true (to 0 over the env-step budget, --total_env_steps).
    learning_rate_schedule: str = "linear"
    max_grad_norm: float = 10.0  # MAX_GRAD_NORM.

    q_lambda: float = setting(0.65, "Q(lambda)'s lambda (LAMBDA)", ge=0, le=1)
    num_epochs: int = setting(2, "passes over each batch (NUM_EPOCHS)", ge=1)
    num_minibatches: int = setting(
        32, "minibatches per pass (NUM_MINIBATCHES); must divide unroll_length * batch_size",
        ge=1)

    # Exploration: epsilon falls linearly from epsilon_start to epsilon_finish over
    # epsilon_decay_env_steps, then stays (EPS_DECAY 0.1 of TOTAL_TIMESTEPS_REAL 1e7 = 1M).
    epsilon_start: float = setting(1.0, "exploration epsilon at the start (EPS_START)",
                                   ge=0, le=1)
    epsilon_finish: float = setting(0.05, "exploration epsilon after the decay (EPS_FINISH)",
                                    ge=0, le=1)
    epsilon_decay_env_steps: int = setting(
        1_000_000, "env steps over which epsilon falls from start to finish; 0: finish from "
        "the start", ge=0)

    reward_scale: float = setting(1.0, "the learner multiplies rewards by this (REW_SCALE)",
                                  gt=0)

    def check(self) -> None:
        if self.num_transitions % self.num_minibatches:
            raise self.invalid(
                "num_minibatches", f"a divisor of unroll_length * batch_size = "
                f"{self.num_transitions} (the transitions of a batch)")

    @property
    def num_transitions(self) -> int:
        """Transitions per learner batch, T * B."""
        return self.unroll_length * self.batch_size
