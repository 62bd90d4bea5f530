"""Environments: factories for Gymnasium and gymnax ids, and env specs."""

from trellis.envs.factory import GymnasiumFactory, UnknownEnvError, make_env_factory
from trellis.envs.gymnax_envs import GymnaxFactory
from trellis.envs.specs import EnvSpec, spec_from_spaces

__all__ = ["GymnasiumFactory", "EnvSpec", "GymnaxFactory", "UnknownEnvError", "make_env_factory",
           "spec_from_spaces"]
