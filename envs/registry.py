"""The env registry: which factory an env id gets (`--env=ID`, `make_env_factory(ID)`).

A family is a function from an id to its factory (envs/contract.EnvFactory), most often the
factory class itself. An id is looked up whole first ("warehouses"), then by the longest
registered prefix it starts with ("gymnax:" for "gymnax:CartPole-v1"); an id that nothing
claims is a Gymnasium id (envs/factory.GymnasiumFactory).

Three sources fill the registry, a later one replacing an earlier one's id or prefix:

1. Trellis's own families (`_BUILTINS`), named without importing their libraries: importing
   `trellis.envs` stays light (env worker processes import it; none of them loads JAX).
2. Installed packages, through the `trellis.envs` entry-point group, loaded at the registry's
   first use. Each entry point is a callable taking no arguments that calls `register`; in
   the package's pyproject.toml:

       [project.entry-points."trellis.envs"]
       mygrid = "mygrid.trellis_envs:register_all"

3. `register` (and `register_jax_multi_agent`) calls in the process: a script, a notebook
   cell, a test.

Registrations live in the process that makes them. What reaches the env worker processes is
the factory the registry made (pickled), so its class must be importable there.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
from collections.abc import Callable
from typing import Any

from trellis.envs import (
    brax_envs,
    envpool_envs,
    gymnax_envs,
    jaxmarl_envs,
    minatar_envs,
    pettingzoo_envs,
    pgx_envs,
    playground_envs,
    sleep_env,
)
from trellis.envs.atari import ALE_PREFIX, ale_factory
from trellis.envs.brax_envs import BraxFactory
from trellis.envs.contract import EnvFactory
from trellis.envs.envpool_envs import EnvpoolFactory
from trellis.envs.factory import GymnasiumFactory
from trellis.envs.gymnax_envs import GymnaxFactory
from trellis.envs.jaxmarl_envs import JaxMARLFactory, make_warehouses
from trellis.envs.minatar_envs import MinatarFactory
from trellis.envs.pettingzoo_envs import PettingZooFactory
from trellis.envs.pgx_envs import PgxFactory
from trellis.envs.playground_envs import PlaygroundFactory
from trellis.envs.sleep_env import SleepFactory

# A family: makes the factory of an id.
FactoryFn = Callable[[str], EnvFactory]
ENTRY_POINT_GROUP = "trellis.envs"

# Trellis's families, as (prefix, family) and (whole id, family).
_BUILTIN_PREFIXES: tuple[tuple[str, FactoryFn], ...] = (
    (gymnax_envs.PREFIX, GymnaxFactory),
    (pgx_envs.PREFIX, PgxFactory),
    (brax_envs.PREFIX, BraxFactory),
    (playground_envs.PREFIX, PlaygroundFactory),
    (envpool_envs.PREFIX, EnvpoolFactory),
    (minatar_envs.PREFIX, MinatarFactory),
    (pettingzoo_envs.PREFIX, PettingZooFactory),
    (jaxmarl_envs.PREFIX, JaxMARLFactory),
    (sleep_env.PREFIX, SleepFactory),
    (ALE_PREFIX, ale_factory),  # envpool's game where it is installed, else ALE's own.
)
_BUILTIN_IDS: tuple[tuple[str, FactoryFn], ...] = (
    ("warehouses", functools.partial(JaxMARLFactory, make_env=make_warehouses)),
)


class EnvRegistryError(ValueError):
    """A registration that cannot be made, an entry point that fails, or a family that does
    not make an env factory (one line: what, the value, what would work)."""


@dataclasses.dataclass
class _Registry:
    """Ids and prefixes to families (see the module docstring)."""

    ids: dict[str, FactoryFn] = dataclasses.field(default_factory=lambda: dict(_BUILTIN_IDS))
    prefixes: dict[str, FactoryFn] = dataclasses.field(
        default_factory=lambda: dict(_BUILTIN_PREFIXES))
    entry_points_loaded: bool = False

    def register(self, name: str, factory_fn: FactoryFn, prefix: bool) -> None:
        # Entry points first, so that the process's own registrations replace theirs.
        self.load_entry_points()
        if not name:
            raise EnvRegistryError("an env id or prefix to register is a non-empty string, "
                                   "got ''")
        if not callable(factory_fn):
            raise EnvRegistryError(f"register({name!r}, ...) takes a function from an env id "
                                   f"to its factory (e.g. the factory class), got "
                                   f"{factory_fn!r}")
        (self.prefixes if prefix else self.ids)[name] = factory_fn

    def family(self, env_id: str) -> FactoryFn:
        self.load_entry_points()
        if env_id in self.ids:
            return self.ids[env_id]
        matches = [p for p in self.prefixes if env_id.startswith(p)]
        return self.prefixes[max(matches, key=len)] if matches else GymnasiumFactory

    def load_entry_points(self) -> None:
        if self.entry_points_loaded:
            return
        self.entry_points_loaded = True  # Before loading: their `register` calls come here.
        for entry_point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            try:
                entry_point.load()()
            except Exception as e:  # A package's own code: whatever it raises, say whose.
                raise EnvRegistryError(
                    f"the {ENTRY_POINT_GROUP!r} entry point {entry_point.name!r} "
                    f"({entry_point.value}) failed: {type(e).__name__}: {e}") from e


_REGISTRY = _Registry()


def register(name_or_prefix: str, factory_fn: FactoryFn, *, prefix: bool = False) -> None:
    """Makes `factory_fn` the family of an env id, or of every id starting with a prefix.

    Args:
      name_or_prefix: a whole id (e.g. "mygrid-v0") or, with `prefix`, the start of ids
        (e.g. "mygrid:", for "mygrid:small" and "mygrid:large").
      factory_fn: makes the factory (envs/contract.EnvFactory) of an id it is given, e.g.
        the factory class itself.
      prefix: `name_or_prefix` is a prefix.

    Raises:
      EnvRegistryError: an empty id or prefix, or a `factory_fn` that is not callable.
    """
    _REGISTRY.register(name_or_prefix, factory_fn, prefix)


def register_jax_multi_agent(env_id: str, make_env: Callable[..., Any]) -> None:
    """Gives an id to a multi-agent env written in JAX with JaxMARL's `MultiAgentEnv` API
    (`reset`, `step_env`, `agents`, `observation_space(agent)`, `action_space(agent)`;
    optionally `global_state(state)` and `time_limit_only`), for --platform=anakin.

    Args:
      env_id: the id, e.g. "mygrid".
      make_env: builds the env from the factory's keyword arguments (e.g. the env's class).
    """
    register(env_id, functools.partial(JaxMARLFactory, make_env=make_env))


def make_env_factory(env_id: str) -> EnvFactory:
    """The factory of `env_id` from its registered family (see the module docstring):
    "gymnax:ID", "brax:NAME" and "playground:NAME" give gymnax's, Brax's and MuJoCo
    Playground's envs (JAX, for --platform=anakin); "pgx:GAME" pgx's two-player games (JAX,
    for self-play); "jaxmarl:ID" JaxMARL's multi-agent envs (JAX; "warehouses" too);
    "envpool:ID" batches of envpool's envs and "minatar:GAME" of MinAtar's games for env
    workers; "pettingzoo:FAMILY/NAME" PettingZoo's parallel multi-agent envs for env workers;
    "sleep:MS" envs that only sleep MS ms per step (scaling measurements); "ALE/NAME-v5" Atari
    games on envpool where it is installed, else ALE's own vector env (envs/atari.py);
    anything else a Gymnasium id.

    Raises:
      EnvRegistryError: an entry point of the `trellis.envs` group fails, or the family
        makes something that is not an env factory.
    """
    factory = _REGISTRY.family(env_id)(env_id)
    if not isinstance(factory, EnvFactory):
        raise EnvRegistryError(
            f"the family registered for {env_id!r} made {factory!r}, not an env factory: it "
            "needs env_id, jax_native, players, validate(), spec() and reward_threshold() "
            "(trellis.envs.EnvFactory)")
    return factory
