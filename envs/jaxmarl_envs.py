"""Multi-agent envs written in JAX: JaxMARL's (`--env=jaxmarl:MPE_simple_spread_v3`) and
Trellis's own with JaxMARL's API (`--env=warehouses`, envs/warehouses.py; `_OWN_ENVS`).

`JaxMARLFactory.make` gives a `jax_multi_agent.MultiAgentJaxEnv` (pure functions in the
convention of envs/multi_agent.py, for --platform=anakin). JaxMARL's dones do not say why an
agent is done: they are truncations for the ids whose episodes end only at a time limit (MPE:
`max_steps`, `_TIME_LIMIT_ONLY`), terminations otherwise.

Nothing heavy at import time: envs/factory.py imports this module in processes that must not
load JAX; JaxMARL (the `marl` extra) is imported when an env is built.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import io
import sys
from collections.abc import Iterator
from typing import Any

from trellis.envs.errors import UnknownEnvError, check_registered
from trellis.envs.multi_agent import MultiAgentSpec

PREFIX = "jaxmarl:"
# Trellis's own envs with JaxMARL's API, as id: the module whose `make(**kwargs)` builds one.
_OWN_ENVS = {"warehouses": "trellis.envs.warehouses"}
# JaxMARL ids whose episodes end only at their time limit: their dones are truncations.
_TIME_LIMIT_ONLY = ("MPE_",)


def is_jaxmarl_id(env_id: str) -> bool:
    return env_id.startswith(PREFIX) or env_id in _OWN_ENVS


def _jaxmarl():
    try:
        with _quiet_import():
            import jaxmarl
    except ImportError as e:
        raise UnknownEnvError(
            "jaxmarl envs need the jaxmarl package: pip install -e '.[marl]'") from e
    return jaxmarl


@contextlib.contextmanager
def _quiet_import() -> Iterator[None]:
    """JaxMARL's import prints two lines about optional submodules (into run.py's progress),
    and its mabrax module sets sys.stdout and sys.stderr to sys.__stdout__ and sys.__stderr__
    (a notebook's prints would leave the notebook from then on): the lines go nowhere, and the
    streams are put back."""
    saved = sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__
    sys.stdout = sys.__stdout__ = io.StringIO()
    try:
        yield
    finally:
        sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__ = saved


@dataclasses.dataclass(frozen=True)
class JaxMARLFactory:
    """Builds JaxMARL's envs, or Trellis's own with its API, for one id.

    Attributes:
      env_id: "jaxmarl:" and a JaxMARL id, e.g. "jaxmarl:MPE_simple_spread_v3", or one of
        `_OWN_ENVS` ("warehouses").
      kwargs: keyword arguments of `jaxmarl.make` (or the own env's `make`), e.g.
        (("num_agents", 4),).
    """

    env_id: str
    kwargs: tuple[tuple[str, Any], ...] = ()

    jax_native = True  # Steps inside jitted code: --platform=anakin.
    multi_agent = True  # Its spec is a MultiAgentSpec (envs/multi_agent.py).

    @property
    def jaxmarl_id(self) -> str:
        return self.env_id[len(PREFIX):]

    def validate(self) -> None:
        """Raises UnknownEnvError (naming close matches) for an id JaxMARL does not register."""
        if self.env_id not in _OWN_ENVS:
            check_registered(PREFIX, self.jaxmarl_id, _jaxmarl().registered_envs,
                             "a JaxMARL id")

    def make(self):
        """The env as a `jax_multi_agent.MultiAgentJaxEnv` (JAX loaded here, not at import)."""
        from trellis.envs.jax_multi_agent import MultiAgentJaxEnv

        self.validate()
        if self.env_id in _OWN_ENVS:
            env = importlib.import_module(_OWN_ENVS[self.env_id]).make(**dict(self.kwargs))
            return MultiAgentJaxEnv(env, env.time_limit_only)
        env = _jaxmarl().make(self.jaxmarl_id, **dict(self.kwargs))
        return MultiAgentJaxEnv(env, self.jaxmarl_id.startswith(_TIME_LIMIT_ONLY))

    def spec(self) -> MultiAgentSpec:
        return self.make().spec()

    def reward_threshold(self) -> float | None:
        return None  # JaxMARL's envs declare none.
