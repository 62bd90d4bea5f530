"""Turns (builder, env factory, experiment config) into a launchable program graph."""

from __future__ import annotations

import launch
from builders.base import Builder, ExperimentConfig
from builders.learner_node import LearnerNode
from envs.factory import EnvFactory
from envs.worker import EnvWorker


def make_program(
    builder: Builder, env_factory: EnvFactory, config: ExperimentConfig, name: str = "trellis"
) -> launch.Program:
    """SEED-style graph: one learner node (inference inside), `num_actors` env workers.

    Returns:
      The program; its "learner" group holds one node whose handle is the env workers'
      inference server and answers `stats()`.
    """
    program = launch.Program(name)
    with program.group("learner"):
        learner = program.add_node(launch.CourierNode(LearnerNode, builder, env_factory, config))
    with program.group("actor"):
        for i in range(config.num_actors):
            seed = config.seed * 10_007 + i + 1  # Distinct per actor, reproducible per run.
            program.add_node(launch.CourierNode(
                EnvWorker, env_factory, learner, i, config.envs_per_actor, seed
            ))
    return program
