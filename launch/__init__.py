"""Trellis launch: the runtime and, on top of every other layer, the command lines.

- `trellis.launch.runtime` (launch/runtime/): the Launchpad-style program graph, RPC and the
  platforms `local_mt`, `local_mp` and `ray`; the bottom layer, with no JAX and no RL.
- `run.py`, `tune.py`, `evaluate.py`, `plot.py` and their `flags.py`: the command lines, the top
  layer (`python launch/run.py` from a clone, `python -m trellis.launch.run` after an install).

This file imports nothing, so that importing the runtime does not load the command lines.
"""
