"""QMIX and VDN configuration: JaxMARL's published PQN-VDN settings on MPE by default, each
with its source."""

from __future__ import annotations

import dataclasses

from trellis.agents.common.multi_agent import PolicyMappingConfig
from trellis.agents.common.q_learning import QLambdaConfig
from trellis.builders.contract.config import setting

# The sources of the defaults below (settings, not code):
# - JaxMARL's feed-forward PQN-VDN on MPE (github.com/FLAIROx/JaxMARL at 3ca758b,
#   baselines/QLearning/config/alg/pqn_vdn_ff_mpe.yaml), named here by its keys (NUM_ENVS...);
# - its QMIX on MPE (qmix_mpe.yaml at 41b8060) for the mixer's sizes
#   (MIXER_EMBEDDING_DIM, MIXER_HYPERNET_HIDDEN_DIM).

VDN = "vdn"
QMIX = "qmix"
MIXERS = (VDN, QMIX)


@dataclasses.dataclass(frozen=True)
class QMIXConfig(PolicyMappingConfig, QLambdaConfig):
    """Hyper-parameters of value-decomposition Q-learning on a cooperative multi-agent env:
    each policy's Q-network (layer-normed, as PQN's) gives its agents' Q-values; the team's
    Q is their sum (VDN, Sunehag et al., 2018) or a monotonic mix of them conditioned on the
    env's global state (QMIX, Rashid et al., 2018). It learns as PQN does (Gallici et al.,
    2024): the team's Q(lambda) targets over each batch of unrolls of many parallel envs,
    several epochs of minibatches, no replay and no target network; epsilon-greedy acting per
    agent. The optimizer is Adam after global-norm clipping.

    On anakin `batch_size` is the number of envs (NUM_ENVS); on the host platforms it is the
    number of env workers' unrolls per update.
    """

    unroll_length: int = 16  # NUM_STEPS.
    batch_size: int = 256  # NUM_ENVS.
    # On-policy data: the targets use the learner's Q at the batch (on anakin the Q that
    # acted).
    max_queue_size: int = 1
    hidden_sizes: tuple[int, ...] = (256, 256)  # HIDDEN_SIZE x NUM_LAYERS, layer-normed.
    discount: float = 0.9  # GAMMA.
    learning_rate: float = 5e-4  # LR (LR_LINEAR_DECAY: False).
    max_grad_norm: float = 1.0  # MAX_GRAD_NORM.

    mixer: str = setting(QMIX, "how agents' Qs make the team's: qmix (a monotonic mix on the "
                         "global state) or vdn (their sum)", choices=MIXERS)
    mixing_embed_size: int = setting(32, "QMIX's mixing layer width (MIXER_EMBEDDING_DIM)",
                                     ge=1)
    hypernet_hidden_size: int = setting(
        64, "hidden units of QMIX's hypernetworks (MIXER_HYPERNET_HIDDEN_DIM)", ge=1)
    q_lambda: float = 0.3  # LAMBDA.
    num_epochs: int = 4  # NUM_EPOCHS.
    num_minibatches: int = 16  # NUM_MINIBATCHES.
    # EPS_DECAY 0.1 of TOTAL_TIMESTEPS 2e6 = 200k.
    epsilon_start: float = 1.0  # EPS_START.
    epsilon_finish: float = 0.1  # EPS_FINISH.
    epsilon_decay_env_steps: int = 200_000
    reward_scale: float = 1.0  # REW_SCALE.


@dataclasses.dataclass(frozen=True)
class VDNConfig(QMIXConfig):
    """VDN's settings: QMIX's with the team's Q the sum of its agents' (JaxMARL's PQN-VDN)."""

    mixer: str = VDN
