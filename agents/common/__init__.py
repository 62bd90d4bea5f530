"""What the agents share, one module per concern; agents import from here, never from each other.

- `torsos`, `recurrent`, `normalization`, `distributions`: network pieces;
- `training`: the training state, the optimizer, hyper-parameters held as arrays (and
  `STATE_HPARAMS`, which an agent's `Training` passes on to the experiment layer);
- `learners`: the host shells that run a pure update on a device mesh (`DataParallelLearner`,
  and `ReplayLearner` over the n-step transitions of `replay`);
- `builder`: `AgentBuilder`, the base of every builder;
- `self_play_config`, `self_play`, `baselines`: the self-play search agents' (AlphaZero's,
  MuZero's) settings, loop and players to measure them against; the last two need the
  `search` extra (mctx), so they are imported from their modules, not from here.

A new agent is its networks, losses and update, and a short `AgentBuilder` subclass
(notebooks/custom_agent.ipynb).
"""

from trellis.agents.common.builder import AgentBuilder
from trellis.agents.common.distributions import diagonal_gaussian_log_prob
from trellis.agents.common.learners import Batch, DataParallelLearner, ReplayLearner
from trellis.agents.common.normalization import (
    OBS_NORM,
    ObservationNormalizer,
    initial_moments,
    update_moments,
)
from trellis.agents.common.recurrent import LSTMCore, LSTMState, lstm_initial_state, reset_where
from trellis.agents.common.replay import TransitionReplay, unrolls_to_transitions
from trellis.agents.common.torsos import (
    ConvTorso,
    ImpalaResNetTorso,
    MLPTorso,
    ResidualBlock,
    channels_first,
    make_torso,
)
from trellis.agents.common.training import (
    STATE_HPARAMS,
    StateHyperParams,
    TargetNetworkState,
    TrainingState,
    get_hparams,
    importance_weights,
    init_target_network_state,
    init_training_state,
    learning_rate_factor,
    make_optimizer,
    scale_by_learning_rate_factor,
    set_hparams,
    set_learning_rate_factor,
    with_learning_rate_factor,
    without_learning_rate_factor,
)

__all__ = [
    "OBS_NORM", "STATE_HPARAMS", "AgentBuilder", "Batch", "ConvTorso", "DataParallelLearner",
    "ImpalaResNetTorso", "LSTMCore", "LSTMState", "MLPTorso", "ObservationNormalizer",
    "ReplayLearner", "ResidualBlock", "StateHyperParams", "TargetNetworkState", "TrainingState",
    "TransitionReplay", "channels_first", "diagonal_gaussian_log_prob", "get_hparams",
    "importance_weights", "init_target_network_state", "init_training_state", "initial_moments",
    "learning_rate_factor", "lstm_initial_state", "make_optimizer", "make_torso", "reset_where",
    "scale_by_learning_rate_factor", "set_hparams", "set_learning_rate_factor",
    "unrolls_to_transitions", "update_moments", "with_learning_rate_factor",
    "without_learning_rate_factor",
]
