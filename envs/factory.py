"""The env factory for Gymnasium ids, the one an id gets when no other family claims it
(envs/registry.py).

A factory is a small frozen dataclass, so it pickles cheaply into any node and builds the
envs where they run (an env worker process), never in the launcher.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib
from collections.abc import Callable
from typing import Any, cast

import cloudpickle
import gymnasium as gym
from gymnasium.envs.registration import EnvSpec as Registration
from gymnasium.envs.registration import load_env_creator

from trellis.envs import cartpole_novel, popgym_envs
from trellis.envs.contract import Players
from trellis.envs.errors import UnknownEnvError
from trellis.envs.specs import EnvSpec, vector_spec

# Ids whose packages register on import (MuJoCo ships with gymnasium; ALE ids have their own
# factories, envs/atari.py), as prefix: (module, the pyproject extra that installs it).
_PLUGIN_MODULES = {popgym_envs.PREFIX: ("popgym", "popgym")}
# Ids whose envs need wrapping to fit EnvSpec, as prefix: wrapper.
_ADAPTERS = {popgym_envs.PREFIX: popgym_envs.adapt}


def _register_plugins(env_id: str) -> None:
    cartpole_novel.register()  # Trellis's own ids.
    for prefix, (module, extra) in _PLUGIN_MODULES.items():
        if env_id.startswith(prefix):
            try:
                gym.register_envs(__import__(module))
            except ImportError as e:
                raise UnknownEnvError(
                    f"env {env_id!r} needs the {module!r} package: pip install -e '.[{extra}]'"
                ) from e


def _adapters(env_id: str) -> list[Wrapper]:
    return [adapt for prefix, adapt in _ADAPTERS.items() if env_id.startswith(prefix)]


# A Gymnasium env wrapper: a callable taking an env and returning one (a wrapper class too).
Wrapper = Callable[[gym.Env[Any, Any]], gym.Env[Any, Any]]


def load_wrapper(name: str) -> Wrapper:
    """The env wrapper "MODULE:NAME" names (NAME may be dotted, "MODULE:Class.method").

    Raises:
      UnknownEnvError: `name` is not of that form, MODULE cannot be imported, or it has no
        NAME, or NAME is not callable.
    """
    module, colon, attribute = name.partition(":")
    if not (colon and module and attribute):
        raise UnknownEnvError(f"env wrapper {name!r} must be MODULE:NAME, e.g. "
                              "gymnasium.wrappers:FlattenObservation")
    try:
        found: Any = importlib.import_module(module)
        for part in attribute.split("."):
            found = getattr(found, part)
    except ImportError as e:
        raise UnknownEnvError(f"env wrapper {name!r}: cannot import {module!r} ({e})") from e
    except AttributeError:
        raise UnknownEnvError(f"env wrapper {name!r}: {module!r} has no {attribute!r}") from None
    if not callable(found):
        raise UnknownEnvError(f"env wrapper {name!r} is a {type(found).__name__}, not a "
                              "callable taking an env and returning one")
    return cast(Wrapper, found)


def _from_main(entry_point: Any) -> Any:
    """An entry point "__main__:NAME" as what it names in this process; another as it is."""
    named_in_main = isinstance(entry_point, str) and entry_point.startswith("__main__:")
    return load_env_creator(entry_point) if named_in_main else entry_point


def _portable(registration: Registration) -> Registration:
    """`registration` as another process can use it: an entry point "__main__:NAME" (which
    would name that process's main module) replaced by what it names here, so that it
    travels by value.

    Raises:
      TypeError: it cannot be pickled; one line saying why and what would work.
    """
    portable = dataclasses.replace(
        registration, entry_point=_from_main(registration.entry_point),
        vector_entry_point=_from_main(registration.vector_entry_point))
    try:
        cloudpickle.dumps(portable)
    except Exception as e:  # Whatever an object's own reduction raises.
        raise TypeError(
            f"env {registration.id!r} is registered with what cannot be pickled to the env "
            f"workers ({type(e).__name__}: {e}); register it in a module they can import and "
            f"use --env=MODULE:{registration.id}") from e
    return portable


@dataclasses.dataclass(frozen=True)
class GymnasiumFactory:
    """Builds Gymnasium envs for one id.

    An id registered in the launching process only (in a notebook cell, under a script's
    `if __name__ == "__main__"`, with an env class defined there or in a function) reaches the
    env workers too: pickled, a factory carries its process's registration of the id
    (`__getstate__`; cloudpickle sends what `__main__` or a function defines by value), and
    an unpickled one builds its envs from that registration. A registration that cannot be
    pickled fails the pickling, in one line.

    Attributes:
      env_id: a registered Gymnasium id, e.g. "CartPole-v1", "HalfCheetah-v5", or
        Gymnasium's "MODULE:ID", which imports MODULE (where ID is registered) first in
        every process that builds envs, e.g. "mycart:MyCart-v0".
      kwargs: keyword arguments passed to gymnasium.make.
      wrappers: applied to each env in order, after Trellis's own adapters: callables taking
        an env and returning one, or "MODULE:NAME" of one (imported where the env is built).
      carried: the registration of the id in the process that pickled this factory; set by
        unpickling only (see above).
    """

    env_id: str
    kwargs: tuple[tuple[str, Any], ...] = ()
    wrappers: tuple[str | Wrapper, ...] = ()
    carried: Registration | None = dataclasses.field(
        default=None, init=False, repr=False, compare=False)

    jax_native = False  # Stepped by env workers on the host, not inside jitted code.
    players = Players.SINGLE_AGENT

    @property
    def module(self) -> str | None:
        """MODULE of a "MODULE:ID" id, else None."""
        module, colon, _ = self.env_id.partition(":")
        return module if colon else None

    @property
    def gymnasium_id(self) -> str:
        """The id in Gymnasium's registry (ID of "MODULE:ID")."""
        return self.env_id.partition(":")[2] if self.module is not None else self.env_id

    def __getstate__(self) -> dict[str, Any]:
        """The fields, with this process's registration of the id as `carried`."""
        return {**self.__dict__, "carried": _portable(self.registration())}

    def registration(self) -> Registration:
        """The id's Gymnasium registration: the one carried from the process that pickled this
        factory, else this process's, once MODULE (and Trellis's plugins for the id) is
        imported.

        Raises:
          UnknownEnvError: MODULE cannot be imported, or the id is not registered (naming
            close matches).
        """
        _register_plugins(self.gymnasium_id)
        if self.module is not None:
            try:
                importlib.import_module(self.module)
            except ImportError as e:
                raise UnknownEnvError(
                    f"env {self.env_id!r}: cannot import module {self.module!r} ({e}); put its "
                    "package on PYTHONPATH or pip install it") from e
        registration = self.carried or gym.registry.get(self.gymnasium_id)
        if registration is None:
            raise UnknownEnvError(self._unknown())
        return registration

    def _unknown(self) -> str:
        close = difflib.get_close_matches(self.gymnasium_id, list(gym.registry), n=5,
                                          cutoff=0.5)
        prefix = "" if self.module is None else f"{self.module}:"
        hint = f" Did you mean: {', '.join(prefix + c for c in close)}?" if close else ""
        what = ("not a registered Gymnasium id" if self.module is None else
                f"importing {self.module!r} registered no Gymnasium id {self.gymnasium_id!r}")
        return (f"unknown env {self.env_id!r}: {what}.{hint} (List them with: python -c "
                "'import gymnasium; gymnasium.pprint_registry()')")

    def _wrappers(self) -> list[Wrapper]:
        """Trellis's adapters for the id, then `wrappers`, loaded."""
        return [*_adapters(self.gymnasium_id),
                *(load_wrapper(w) if isinstance(w, str) else w for w in self.wrappers)]

    def validate(self) -> None:
        """Raises UnknownEnvError (one line) when MODULE cannot be imported, the id is not
        registered (naming close matches), a wrapper cannot be loaded, or an env cannot be
        built with the kwargs and wrappers (a keyword its constructor does not take; POPGym's
        ids with MultiDiscrete actions, which Trellis's adapter refuses)."""
        self.registration()
        if self.kwargs or self._wrappers():
            # What a constructor takes is known only once it is called, and the spaces only
            # once an env is built.
            try:
                self._make_one().close()
            except TypeError as e:
                raise UnknownEnvError(f"env {self.env_id!r}: {e}") from e

    def _make_one(self, **kwargs: Any) -> gym.Env[Any, Any]:
        env = gym.make(self.registration(), **{**dict(self.kwargs), **kwargs})
        for wrap in self._wrappers():
            env = wrap(env)
        return env

    def make(self, seed: int | None = None,
             render_mode: str | None = None) -> gym.Env[Any, Any]:
        """One env, wrapped, reset with `seed` when given (for evaluation and spec queries);
        `render_mode` as gymnasium.make's."""
        env = self._make_one(**({} if render_mode is None else {"render_mode": render_mode}))
        if seed is not None:
            env.reset(seed=seed)
        return env

    def make_vector(self, num_envs: int, seed: int) -> gym.vector.VectorEnv[Any, Any, Any]:
        """`num_envs` envs as one Gymnasium vector env with next-step autoreset.

        The env's own vectorised implementation is used when it has one and nothing is
        passed to or wrapped around its envs (CartPole's numpy version steps all envs in one
        call); otherwise a SyncVectorEnv of wrapped envs. Either way, the autoreset mode is
        NEXT_STEP, which EnvWorker relies on.
        """
        registration = self.registration()
        wrappers = self._wrappers()
        mode = ("vector_entry_point"
                if registration.vector_entry_point and not self.kwargs and not wrappers
                else "sync")
        envs = gym.make_vec(
            registration, num_envs=num_envs, vectorization_mode=mode,
            # Gymnasium's annotation says a wrapper returns a gym.Wrapper; it applies any
            # callable that returns an env.
            wrappers=wrappers if mode == "sync" else None,  # type: ignore[arg-type]
            **dict(self.kwargs))
        autoreset = envs.metadata.get("autoreset_mode", gym.vector.AutoresetMode.NEXT_STEP)
        if autoreset != gym.vector.AutoresetMode.NEXT_STEP:
            raise RuntimeError(f"{self.env_id}: expected NEXT_STEP autoreset, got {autoreset}")
        envs.reset(seed=seed)
        return envs

    def make_recorded(self, seed: int) -> gym.vector.SyncVectorEnv:
        """One env as a vector env of one, rendering rgb arrays (the env contract's
        `RecordedHostEnvFactory`): the env `make` builds, as `make_vector`'s sync envs are
        (an id's own vectorised implementation gives the same observations).

        Raises:
          gymnasium.error.Error: the env does not render rgb arrays.
        """
        envs = gym.vector.SyncVectorEnv(
            [functools.partial(self.make, render_mode="rgb_array")],
            autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP)
        envs.reset(seed=seed)
        return envs

    def reward_threshold(self) -> float | None:
        """The id's Gymnasium reward_threshold (what --stop_at_return=auto stops at)."""
        return self.registration().reward_threshold

    def spec(self) -> EnvSpec:
        """Spec of one env as the env workers see it (through `make_vector`).

        Vectorised implementations may preprocess (ALE's gives stacked 84x84 grey frames),
        so the spec comes from the vector env's single-env spaces, not from `gym.make`.
        """
        return vector_spec(self)
