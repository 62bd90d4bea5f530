"""Environments: factories for Gymnasium ids and env specs."""

from trellis.envs.factory import EnvFactory, UnknownEnvError
from trellis.envs.specs import EnvSpec, spec_from_spaces

__all__ = ["EnvFactory", "EnvSpec", "UnknownEnvError", "spec_from_spaces"]
