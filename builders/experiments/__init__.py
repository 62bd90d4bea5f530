"""The experiment layer, above the agents: what turns an agent into a running experiment.

`session` (the one host-side driver every platform shares), `program` (the SEED-style program
graph with its `learner_node`, `inference`, `env_worker` and `evaluation` nodes), `anakin` (the
whole loop in one jitted program), `tuning` (Ray Tune trials), and the run's bookkeeping:
`counter`, `stop`, `checkpointing`, `rundir`, `progress`, `curves`.
"""
