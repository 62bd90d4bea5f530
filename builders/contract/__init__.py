"""The agent contract: what an agent is, below the agents (docs/architecture.md).

`agent` holds the Builder, Learner and Policy protocols and the specs they exchange; `config`
the config base with declared bounds and the experiment settings. Nothing here knows of
platforms, programs or run directories.
"""
