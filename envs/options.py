"""Env keyword arguments and wrappers (`--env_kwargs`, `--env_wrappers`) on a factory, where
its family takes them.

  - Gymnasium ids: keyword arguments of gymnasium.make (so of the env's constructor), and
    wrappers applied to each env in every env worker (envs/factory.GymnasiumFactory).
  - gymnax ids: fields of the env's EnvParams (e.g. max_steps_in_episode).
  - JaxMARL ids (and JAX multi-agent envs of one's own): keyword arguments of jaxmarl.make
    (or of the env's `make_env`).

Other families take neither: their factories are refused in one line rather than the options
silently dropped. Wrappers apply to Gymnasium envs only: the JAX families' envs are pure
functions, not gymnasium.Env objects.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from trellis.envs.contract import EnvFactory
from trellis.envs.errors import UnknownEnvError
from trellis.envs.factory import GymnasiumFactory, Wrapper
from trellis.envs.gymnax_envs import GymnaxFactory
from trellis.envs.jaxmarl_envs import JaxMARLFactory

KWARGS_FAMILIES = ("Gymnasium ids (gymnasium.make's), gymnax ids (env params) and jaxmarl ids "
                   "(jaxmarl.make's)")


def _merged(given: tuple[tuple[str, Any], ...], kwargs: Mapping[str, Any]
            ) -> tuple[tuple[str, Any], ...]:
    return tuple({**dict(given), **kwargs}.items())


def with_env_options(factory: EnvFactory, kwargs: Mapping[str, Any] | None = None,
                     wrappers: Sequence[str | Wrapper] = ()) -> EnvFactory:
    """`factory` with env keyword arguments (over its own) and wrappers (after its own).

    Args:
      factory: the env's factory.
      kwargs: keyword arguments for the env, by name.
      wrappers: callables taking an env and returning one, or "MODULE:NAME" of one.

    Raises:
      UnknownEnvError: the factory's family takes no such option (one line).
    """
    if not kwargs and not wrappers:
        return factory
    if isinstance(factory, GymnasiumFactory):
        return dataclasses.replace(factory, kwargs=_merged(factory.kwargs, kwargs or {}),
                                   wrappers=(*factory.wrappers, *wrappers))
    if wrappers:
        raise UnknownEnvError(f"env wrappers apply to Gymnasium envs; {factory.env_id}'s envs "
                              "are not gymnasium.Env objects")
    if isinstance(factory, GymnaxFactory):
        return dataclasses.replace(factory, params=_merged(factory.params, kwargs or {}))
    if isinstance(factory, JaxMARLFactory):
        return dataclasses.replace(factory, kwargs=_merged(factory.kwargs, kwargs or {}))
    raise UnknownEnvError(f"env kwargs apply to {KWARGS_FAMILIES}; {factory.env_id} takes none")
