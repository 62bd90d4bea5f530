"""Multi-agent envs written in JAX: JaxMARL's (`--env=jaxmarl:MPE_simple_spread_v3`) and
envs of one's own with JaxMARL's API (Trellis's `--env=warehouses`, envs/warehouses.py).

`JaxMARLFactory.make` gives a `jax_multi_agent.MultiAgentJaxEnv` (pure functions in the
convention of envs/multi_agent.py, for --platform=anakin). JaxMARL's dones do not say why an
agent is done: they are truncations for the ids whose episodes end only at a time limit (MPE:
`max_steps`, `_TIME_LIMIT_ONLY`), terminations otherwise. An env of one's own is built by its
factory's `make_env` and says so itself (its `time_limit_only`, False when it has none); give
it an id with `envs.registry.register_jax_multi_agent`.

Nothing heavy at import time: envs/factory.py imports this module in processes that must not
load JAX; JaxMARL (the `marl` extra) is imported when an env is built.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import io
import sys
import types
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from trellis.envs.contract import Players
from trellis.envs.errors import UnknownEnvError, check_registered
from trellis.envs.multi_agent import MultiAgentSpec

if TYPE_CHECKING:  # Its module loads JAX, which env workers importing this one must not.
    from trellis.envs.jax_multi_agent import MultiAgentJaxEnv

PREFIX = "jaxmarl:"
# JaxMARL ids whose episodes end only at their time limit: their dones are truncations.
_TIME_LIMIT_ONLY = ("MPE_",)


def make_warehouses(**kwargs: Any) -> Any:
    """envs/warehouses.py's env (its module loads JAX, so it is imported when an env is made,
    not when the registry names it)."""
    return importlib.import_module("trellis.envs.warehouses").make(**kwargs)


def _jaxmarl() -> types.ModuleType:
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
    # typeshed declares sys.__stdout__ and __stderr__ Final (the interpreter's own streams);
    # what mabrax copies from is exactly them, so they are replaced here and put back.
    sys.stdout = sys.__stdout__ = io.StringIO()  # type: ignore[misc, assignment]
    try:
        yield
    finally:
        sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__ = saved  # type: ignore[misc]


@dataclasses.dataclass(frozen=True)
class JaxMARLFactory:
    """Builds JaxMARL's envs, or envs of one's own with its API, for one id.

    Attributes:
      env_id: "jaxmarl:" and a JaxMARL id, e.g. "jaxmarl:MPE_simple_spread_v3", or the id of
        an env of one's own (e.g. "warehouses").
      kwargs: keyword arguments of `jaxmarl.make` (or of `make_env`), e.g.
        (("num_agents", 4),).
      make_env: for an env of one's own, what builds it from `kwargs`: an object with
        JaxMARL's `MultiAgentEnv` API (jax_multi_agent.MultiAgentJaxEnv lists it). None:
        JaxMARL's env `env_id` names.
    """

    env_id: str
    kwargs: tuple[tuple[str, Any], ...] = ()
    make_env: Callable[..., Any] | None = None

    jax_native = True  # Steps inside jitted code: --platform=anakin.
    players = Players.MULTI_AGENT  # Its spec is a MultiAgentSpec (envs/multi_agent.py).

    @property
    def jaxmarl_id(self) -> str:
        return self.env_id[len(PREFIX):]

    def validate(self) -> None:
        """Raises UnknownEnvError (naming close matches) for an id JaxMARL does not register."""
        if self.make_env is None:
            check_registered(PREFIX, self.jaxmarl_id, _jaxmarl().registered_envs,
                             "a JaxMARL id")

    def make(self) -> MultiAgentJaxEnv:
        """The env as a `jax_multi_agent.MultiAgentJaxEnv` (JAX loaded here, not at import)."""
        from trellis.envs.jax_multi_agent import MultiAgentJaxEnv

        self.validate()
        if self.make_env is not None:
            env = self.make_env(**dict(self.kwargs))
            return MultiAgentJaxEnv(env, bool(getattr(env, "time_limit_only", False)))
        env = _jaxmarl().make(self.jaxmarl_id, **dict(self.kwargs))
        return MultiAgentJaxEnv(env, self.jaxmarl_id.startswith(_TIME_LIMIT_ONLY))

    def spec(self) -> MultiAgentSpec:
        return self.make().spec()

    def reward_threshold(self) -> float | None:
        return None  # JaxMARL's envs declare none.
