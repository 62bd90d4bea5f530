"""PQN configuration: the published MinAtar settings by default, each with its source."""

from __future__ import annotations

import dataclasses

from trellis.agents.common.q_learning import QLambdaConfig

# The sources of the defaults below (settings, not code):
# - the paper: Gallici et al., 2024, "Simplifying Deep Temporal Difference Learning",
#   https://arxiv.org/abs/2407.04811 (layer norm, no target network, no replay, Q(lambda),
#   RAdam);
# - its code's MinAtar settings: purejaxql (github.com/mttga/purejaxql) at 0cd95ed,
#   purejaxql/config/alg/pqn_minatar.yaml, named here by their keys (NUM_ENVS, ...);
# - its CartPole settings, for vector observations: pqn_cartpole.yaml at 970ecce.


@dataclasses.dataclass(frozen=True)
class PQNConfig(QLambdaConfig):
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

    q_lambda: float = 0.65  # LAMBDA.
    num_epochs: int = 2  # NUM_EPOCHS.
    num_minibatches: int = 32  # NUM_MINIBATCHES.
    # EPS_DECAY 0.1 of TOTAL_TIMESTEPS_REAL 1e7 = 1M.
    epsilon_start: float = 1.0  # EPS_START.
    epsilon_finish: float = 0.05  # EPS_FINISH.
    epsilon_decay_env_steps: int = 1_000_000
    reward_scale: float = 1.0  # REW_SCALE.
