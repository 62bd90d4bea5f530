"""Builders: the Builder protocol and the generic wiring of agents into program graphs."""

from builders.base import ArraySpec, Builder, ExperimentConfig, Learner, Policy, QueueSpec
from builders.inference import InferenceServer, UnrollRecorder, step_specs
from builders.learner_node import LearnerNode, UnrollBatcher
from builders.program import make_program

__all__ = [
    "ArraySpec", "Builder", "ExperimentConfig", "InferenceServer", "Learner", "LearnerNode",
    "Policy", "QueueSpec", "UnrollBatcher", "UnrollRecorder", "make_program", "step_specs",
]
