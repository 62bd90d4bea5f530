"""Builders: the agent contract, and the experiment layer that turns agents into programs.

Two layers live here (docs/architecture.md; `make lint` checks the arrows):

- the agent contract, below the agents: `base` (the Builder, Learner and Policy protocols,
  ArraySpec, QueueSpec) and `config` (config dataclasses with declared bounds, and the
  experiment settings);
- the experiment layer, above them: `program.make_program` (the SEED-style program graph),
  `inference` (the central inference server), `env_worker`, `learner_node` with its
  `counter` and `stop` rule, `evaluation`, `checkpointing`, and for a whole run
  `experiment.run_experiment` with its run directory (`rundir`, `progress`, `curves`).

This file imports nothing, so that an agent importing the contract does not load the
experiment layer.
"""
