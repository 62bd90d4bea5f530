"""PettingZoo's parallel envs on the host: `--env=pettingzoo:mpe2/simple_spread_v3`.

An id is `pettingzoo:FAMILY/NAME`: FAMILY is `mpe2` (the maintained MPE package) or one of
PettingZoo's own families (`sisl`, `butterfly`, `classic`, ...), NAME a module of it that has a
`parallel_env` (e.g. `sisl/pursuit_v5`, `butterfly/knights_archers_zombies_v11`). Families whose
modules need packages that are not installed (pistonball needs pymunk, multiwalker Box2D) say
so in one line.

`PettingZooVector` steps K envs in lockstep for an env worker and gives each step in the
multi-agent array convention of envs/multi_agent.py (`MultiAgentStep`, every agent id present,
`alive` masks): an agent that finishes early stays in the arrays, masked; an agent that joins
mid-episode is masked until it does. Autoreset is on the next step, as for the single-agent
env workers: the step after an env's episode ended (no agent alive) resets it, ignores the
actions and gives the new episode's first step. Env i of a vector reset with `seed` is reset
with `seed + i` (as Gymnasium's vector envs do), later resets continue its own RNG.

Nothing heavy at import time: PettingZoo and the family's module load when a factory builds.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
import threading
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from trellis.envs.contract import Players
from trellis.envs.errors import UnknownEnvError, check_registered
from trellis.envs.multi_agent import MultiAgentSpec, MultiAgentStep
from trellis.envs.specs import EnvSpec, spec_from_spaces

PREFIX = "pettingzoo:"
# Where each family's modules live: mpe2 is its own package, the others are PettingZoo's.
_PACKAGES = {"mpe2": "mpe2", "atari": "pettingzoo.atari", "butterfly": "pettingzoo.butterfly",
             "classic": "pettingzoo.classic", "sisl": "pettingzoo.sisl"}


def _family_envs(package: str) -> list[str]:
    """The env modules of a family's package (names ending in a version, e.g. `_v3`).

    Raises:
      UnknownEnvError: the package is not installed.
    """
    try:
        module = importlib.import_module(package)
    except ImportError as e:
        raise UnknownEnvError(f"pettingzoo: envs need the {e.name!r} package: pip install -e "
                              "'.[marl]'") from e
    names = [m.name for m in pkgutil.iter_modules(module.__path__)]
    return sorted(n for n in names if n.rsplit("_v", 1)[-1].isdigit() and "_v" in n)


def _float32(spec: EnvSpec) -> EnvSpec:
    """float64 observations (knights_archers_zombies) as float32, what the networks take."""
    if spec.observation_dtype != "float64":
        return spec
    return dataclasses.replace(spec, observation_dtype="float32")


# mpe2's envs load pygame fonts when made and call `pygame.quit()` when closed, for the whole
# process; neither is thread-safe: 4 threads making and closing mpe2 envs at once segfaulted in
# 2 of 3 runs (pygame's "parachute" reports it), as a local_mt run did now and then. Making and
# closing take this lock, and envs that do not render are not closed (`close`): 0 of 3 then.
_PYGAME = threading.Lock()


def close(env: Any) -> None:
    """Closes an env that renders; one that does not is only dropped (its `close` would only
    quit pygame under every other env of the process)."""
    if getattr(env, "render_mode", None) is not None:
        with _PYGAME:
            env.close()


def parallel_spec(env: Any) -> MultiAgentSpec:
    """The spec of a PettingZoo parallel env: every possible agent's spaces, and the global
    state's shape where the env has a `state_space` (mpe2's: every agent's observation)."""
    specs = {agent: _float32(spec_from_spaces(env.observation_space(agent),
                                              env.action_space(agent)))
             for agent in env.possible_agents}
    state_space = getattr(env, "state_space", None)
    state_shape = None if state_space is None else tuple(int(d) for d in state_space.shape)
    return MultiAgentSpec(tuple(env.possible_agents), specs, state_shape)


@dataclasses.dataclass(frozen=True)
class PettingZooFactory:
    """Builds PettingZoo parallel envs for one id (see the module docstring).

    Attributes:
      env_id: "pettingzoo:FAMILY/NAME", e.g. "pettingzoo:mpe2/simple_spread_v3".
      kwargs: keyword arguments of the module's `parallel_env`, e.g. (("N", 3),).
    """

    env_id: str
    kwargs: tuple[tuple[str, Any], ...] = ()

    jax_native = False  # Stepped by env workers on the host.
    players = Players.MULTI_AGENT

    @property
    def _family_name(self) -> tuple[str, str]:
        family, _, name = self.env_id[len(PREFIX):].partition("/")
        return family, name

    def validate(self) -> None:
        """Raises UnknownEnvError for an unknown family or env (naming close matches), or
        when the family's module needs a package that is not installed."""
        family, name = self._family_name
        check_registered(PREFIX, family, _PACKAGES, "a PettingZoo family")
        check_registered(f"{PREFIX}{family}/", name, _family_envs(_PACKAGES[family]),
                         f"an env of PettingZoo's {family} family")

    def _module(self) -> Any:
        self.validate()
        family, name = self._family_name
        try:
            return importlib.import_module(f"{_PACKAGES[family]}.{name}")
        except ImportError as e:
            raise UnknownEnvError(
                f"env {self.env_id!r} needs the {e.name!r} package, which is not installed "
                f"(mpe2, sisl/pursuit_v5 and butterfly/knights_archers_zombies_v11 need none "
                f"beyond Trellis's marl extra)") from e

    def make(self, seed: int | None = None) -> Any:
        """One PettingZoo parallel env, reset with `seed` when given."""
        module = self._module()
        with _PYGAME:  # Env workers on threads (local_mt) make their envs at the same time.
            env = module.parallel_env(**dict(self.kwargs))
        if seed is not None:
            env.reset(seed=seed)
        return env

    def make_vector(self, num_envs: int, seed: int) -> PettingZooVector:
        """`num_envs` envs stepped in lockstep, reset with seeds `seed`, `seed + 1`, ..."""
        envs = PettingZooVector([self.make() for _ in range(num_envs)], self.spec())
        envs.reset(seed=seed)
        return envs

    def spec(self) -> MultiAgentSpec:
        """The spec of its envs (`parallel_spec`)."""
        env = self.make(seed=0)
        try:
            return parallel_spec(env)
        finally:
            close(env)

    def reward_threshold(self) -> float | None:
        """PettingZoo declares none."""
        return None


class PettingZooVector:
    """K PettingZoo parallel envs stepped in lockstep, in the multi-agent array convention.

    Args:
      envs: the K envs (not reset yet).
      spec: their spec (`PettingZooFactory.spec`).
    """

    def __init__(self, envs: list[Any], spec: MultiAgentSpec) -> None:
        self._envs = envs
        self._spec = spec
        self._k = len(envs)
        self._done = np.zeros(self._k, bool)  # The env's episode ended on the last step.
        self._alive: list[set[str]] = [set() for _ in envs]  # Who acts on the current step.

    @property
    def num_envs(self) -> int:
        return self._k

    def reset(self, seed: int | None = None) -> MultiAgentStep:
        """Resets every env (env i with `seed + i`); their first steps."""
        step = self._empty()
        for i, env in enumerate(self._envs):
            self._reset_env(i, env, None if seed is None else seed + i, step)
        return step

    def step(self, actions: Mapping[str, np.ndarray]) -> MultiAgentStep:
        """One step of every env with `actions` {agent: [K, ...]}; an env whose episode ended
        on the last step is reset instead (its actions ignored)."""
        step = self._empty()
        for i, env in enumerate(self._envs):
            if self._done[i]:
                self._reset_env(i, env, None, step)
                continue
            acting = self._alive[i]
            obs, reward, terminated, truncated, _ = env.step(
                {agent: actions[agent][i] for agent in self._spec.agents if agent in acting})
            after = set(env.agents)
            for agent in acting | (after & set(obs)):
                ended = bool(terminated.get(agent, False) or truncated.get(agent, False))
                if agent in obs:
                    step.obs[agent][i] = obs[agent]
                step.reward[agent][i] = reward.get(agent, 0.0)
                step.terminated[agent][i] = terminated.get(agent, False)
                step.truncated[agent][i] = truncated.get(agent, False)
                step.alive[agent][i] = agent in after and not ended
            self._after_step(i, env, step)
        return step

    def close(self) -> None:
        for env in self._envs:
            close(env)

    def _reset_env(self, i: int, env: Any, seed: int | None, step: MultiAgentStep) -> None:
        obs, _ = env.reset(seed=seed)
        for agent in env.agents:
            step.obs[agent][i] = obs[agent]
            step.alive[agent][i] = True
        step.first[i] = True
        self._after_step(i, env, step)

    def _after_step(self, i: int, env: Any, step: MultiAgentStep) -> None:
        self._alive[i] = {agent for agent in self._spec.agents if step.alive[agent][i]}
        self._done[i] = not self._alive[i]
        if step.global_state is not None:
            step.global_state[i] = env.state()

    def _empty(self) -> MultiAgentStep:
        k, specs = self._k, self._spec.specs

        def per_agent(make: Callable[[EnvSpec], np.ndarray]) -> dict[str, np.ndarray]:
            return {agent: make(specs[agent]) for agent in self._spec.agents}

        shape = self._spec.global_state_shape
        return MultiAgentStep(
            obs=per_agent(lambda s: s.zeros_observation((k,))),
            reward=per_agent(lambda s: np.zeros(k, np.float32)),
            terminated=per_agent(lambda s: np.zeros(k, bool)),
            truncated=per_agent(lambda s: np.zeros(k, bool)),
            alive=per_agent(lambda s: np.zeros(k, bool)),
            first=np.zeros(k, bool),
            global_state=None if shape is None else np.zeros((k, *shape), np.float32))
