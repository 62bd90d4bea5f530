"""Builders: the agent contract and the experiment layer, one subpackage each.

- `trellis.builders.contract`, below the agents: the Builder, Learner and Policy protocols, the
  capabilities an agent declares, the specs, and the config base with declared bounds;
- `trellis.builders.experiments`, above them: the session driver, the program graph and its
  nodes, the anakin loop, Ray Tune trials and the run directory.

This file imports nothing, so that an agent importing the contract does not load the
experiment layer.
"""
