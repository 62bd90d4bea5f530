"""The agent contract: what an agent is, below the agents (docs/architecture.md).

`agent` holds what every kind of agent provides, the gradient learners' `Builder`, the Learner
and Policy protocols and the specs they exchange; `population` and `self_play` the protocols of
the other two kinds (population search, self-play search); `hparams` the hyper-parameters a
training state holds (`--member_hparams`, PBT, the learning-rate schedule); `config` the config
base with declared bounds and the experiment settings. Nothing here knows of
platforms, programs or run directories.
"""
