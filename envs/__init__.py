"""Environments: factories for Gymnasium ids, env specs and the CPU env worker."""

from envs.factory import EnvFactory, UnknownEnvError
from envs.specs import EnvSpec, spec_from_spaces
from envs.worker import EnvWorker, EpisodeTracker

__all__ = [
    "EnvFactory", "EnvSpec", "EnvWorker", "EpisodeTracker", "UnknownEnvError", "spec_from_spaces",
]
