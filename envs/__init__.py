"""Environments: the env contract (`EnvFactory`), the registry of env ids (`register`,
`make_env_factory`), the factories and the specs."""

from trellis.envs.contract import EnvFactory, HostEnvFactory, JaxEnvFactory, Players
from trellis.envs.errors import UnknownEnvError
from trellis.envs.factory import GymnasiumFactory
from trellis.envs.gymnax_envs import GymnaxFactory
from trellis.envs.objects import (
    as_env_factory,
    gymnasium_factory,
    gymnax_factory,
    multi_agent_factory,
    physics_factory,
)
from trellis.envs.options import with_env_options
from trellis.envs.registry import (
    EnvRegistryError,
    make_env_factory,
    register,
    register_jax_multi_agent,
)
from trellis.envs.specs import EnvSpec, spec_from_spaces

__all__ = ["EnvFactory", "EnvRegistryError", "EnvSpec", "GymnasiumFactory", "GymnaxFactory",
           "HostEnvFactory", "JaxEnvFactory", "Players", "UnknownEnvError", "make_env_factory",
           "register", "register_jax_multi_agent", "spec_from_spaces", "as_env_factory",
           "gymnasium_factory", "gymnax_factory", "multi_agent_factory", "physics_factory",
           "with_env_options"]
