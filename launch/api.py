"""The Python API, for notebooks and scripts: `trellis.train(...)` and `trellis.load(run_dir)`.

    import trellis
    run = trellis.train(agent="ppo", env="CartPole-v1", platform="local_mt",
                        stop_at_return=450)
    run.summary["mean_return"], run.metrics[-1]["env_steps"]
    policy = trellis.load(run.directory)
    action = policy(observation)
    policy.export("exported/")

`train` takes the command line's settings as keyword arguments (`learning_rate=1e-3` is
`--learning_rate=1e-3`) and runs the command line's own path (launch/run.py's `execute`): the
same validation, presets and platform defaults, the same run directory, config.json and
summary. An env is an id, or an object `envs.as_env_factory` takes (a Gymnasium env
constructor, a gymnax, Brax, Playground or JaxMARL-API env, an env factory): it is registered
in this process under the id its factory names, which the run's config.json records.

An agent is a registered agent's name, or an agent object of any kind (a builder:
docs/your_own_agent.md), e.g. `train(agent=A2CBuilder(A2CConfig(learning_rate=1e-3)), ...)`:
it is registered in this process under its class's name (`agents.registry.register`), which
config.json and the run directory's name record, and it trains with the config it was made
with (its settings are set there, not as `train`'s keyword arguments). `load(run_dir,
agent=OBJECT)` gives the policy of such a run in another process.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

from trellis.agents.registry import register as register_agent
from trellis.builders.contract.agent import Capabilities
from trellis.builders.contract.config import Config
from trellis.builders.experiments.rundir import METRICS
from trellis.envs import register
from trellis.envs.objects import as_env_factory
from trellis.launch import run as run_command
from trellis.launch.flags import UsageError, parse
from trellis.launch.flags.values import shown
from trellis.launch.loaded_policy import LoadedPolicy, SearchPolicy, load_policy

__all__ = ["LoadedPolicy", "Run", "SearchPolicy", "load", "train"]


@dataclasses.dataclass(frozen=True)
class Run:
    """A finished run (`train`'s result).

    Attributes:
      directory: the run directory (config.json, metrics.jsonl, checkpoints, summary.json).
      summary: summary.json's record: stopped_by, env_steps, mean_return, exit_code, ...
    """

    directory: str
    summary: Mapping[str, Any]

    @property
    def metrics(self) -> list[dict[str, Any]]:
        """metrics.jsonl's records, one per log interval (env_steps, return_mean, ...)."""
        with open(os.path.join(self.directory, METRICS)) as f:
            return [json.loads(line) for line in f if line.strip()]

    def load(self, **kwargs: Any) -> LoadedPolicy | SearchPolicy:
        """`load(self.directory, **kwargs)`."""
        return load(self.directory, **kwargs)


def train(agent: object = None, env: object = None, platform: str | None = None,
          **settings: Any) -> Run:
    """Trains `agent` on `env` until the settings say stop, as `run.py` would.

    Args:
      agent: an agent's name (--agent), or an agent object of any kind (a builder; see the
        module docstring), which trains with its own config; None: the command line's default
        (impala), or the resumed run's.
      env: an env id (--env), or an env object (see the module docstring); None: the command
        line's default (CartPole-v1), or the resumed run's.
      platform: local_mt, local_mp, ray or anakin (--platform); None: the command line's
        default (local_mp: a script that runs it needs Python's `if __name__ == "__main__":`
        guard, as any multiprocessing does).
      **settings: any of the command line's settings by name (`run.py --agent=AGENT --help`
        lists them), e.g. `stop_at_return=450`, `logdir="runs/mine"`, `quiet=True`,
        `resume=RUN_DIR`; `env_kwargs` may be a dict. With an agent object, the run's and the
        experiment's settings only (its own are its config's).

    Returns:
      The run: its directory and summary (`Run`); the summary's `exit_code` is not 0 where
      a node failed (its `error` says why).

    Raises:
      trellis.launch.flags.UsageError: a bad setting (one line naming it and what is allowed).
      trellis.launch.run.RunError: the run cannot start (its directory holds a run, ...).
      TypeError: `agent` is neither a name nor an agent object, or `env` neither an id nor
        an env object.
    """
    name = None if agent is None else agent_name(agent)
    # An agent object's settings are its config's: below no preset or platform default.
    own: dict[str, Any] = {}
    if name is not None and not isinstance(agent, str):
        own = _own_settings(name, agent, settings)
    given = {"agent": name, "env": None if env is None else env_id(env), "platform": platform}
    values = {**{k: v for k, v in given.items() if v is not None}, **settings}
    argv = [f"--{key}={_text(value)}" for key, value in values.items()]
    with run_command.launching(argv):
        run = parse(argv, prog="trellis.train", defaults=own)
        run_dir, summary = run_command.execute(run, argv)
    return Run(run_dir, summary)


def load(run_dir: str, *, agent: object = None, env: object = None, step: int | None = None,
         member: int = 0, seed: int = 0) -> LoadedPolicy | SearchPolicy:
    """The trained policy of a run directory (launch/loaded_policy.py): `policy(obs)` acts,
    `policy.export(DIR)` writes it for jax alone (`LoadedPolicy`); a self-play run's player is
    its search, `policy(game_state)` (`SearchPolicy`, AlphaZero; not exported).

    Args:
      run_dir: the run directory.
      agent: the agent object a run was trained with, when this process has not registered
        it (`train` did not run it here; a registered agent's name needs nothing).
      env: the env object a run was trained on, when this process has not registered it (an
        env id needs nothing).
      step: the checkpoint's env steps; None: the newest readable one (a damaged newer one
        is passed over with one warning).
      member: an anakin population's member (an evolution strategy's: its mean).
      seed: the key of sampled actions (`policy(obs, sample=True)`) and of searches.

    Raises:
      TypeError: `agent` is not an agent object, or `env` not an env object.
      trellis.launch.flags.UsageError: no run in `run_dir` (config.json missing or invalid).
      builders.experiments.restore.RestoreError, .checkpointing.CheckpointError: no checkpoint
        (or not `step`).
    """
    if agent is not None:
        agent_name(agent)
    if env is not None:
        env_id(env)
    return load_policy(run_dir, step, member, seed)


def agent_name(agent: object) -> str:
    """The name of `agent` for the command line's --agent: a name as it is; an agent object's
    class's name, under which the object is registered in this process
    (`agents.registry.register`).

    Raises:
      TypeError: `agent` is neither a string nor an agent object (one with `capabilities` and
        a `config` on builders.contract.config.Config).
    """
    if isinstance(agent, str):
        return agent
    if not (isinstance(getattr(agent, "capabilities", None), Capabilities)
            and isinstance(getattr(agent, "config", None), Config)):
        raise TypeError(
            f"agent must be a registered agent's name (e.g. 'ppo') or an agent object (a "
            f"builder with `capabilities` and a `config` on "
            f"trellis.builders.contract.config.Config: docs/your_own_agent.md), got "
            f"{agent!r} ({type(agent).__name__})")
    name = type(agent).__name__
    register_agent(name, agent)
    return name


def env_id(env: object) -> str:
    """The id of `env` for the command line's --env: an id as it is; an env object's factory's
    id, under which the factory is registered in this process (`envs.register`)."""
    if isinstance(env, str):
        return env
    factory = as_env_factory(env)
    register(factory.env_id, lambda _: factory)
    return factory.env_id


def _own_settings(name: str, agent: Any, settings: Mapping[str, Any]) -> dict[str, Any]:
    """The settings of an agent object's config, by name: those it trains with.

    Raises:
      trellis.launch.flags.UsageError: `settings` (train's keyword arguments) name some of
        them (an object trains with the config it was made with).
    """
    own = {f.name: getattr(agent.config, f.name) for f in dataclasses.fields(agent.config)}
    given = sorted(set(settings) & set(own))
    if given:
        config = type(agent.config).__name__
        raise UsageError(f"{', '.join(given)}: settings of agent {name}'s config ({config}); "
                         f"an agent object trains with the config it was made with: "
                         f"{name}({config}({given[0]}=...))")
    return own


def _text(value: Any) -> str:
    """A setting's value as its flag's text."""
    if isinstance(value, Mapping):  # env_kwargs: a JSON object.
        return json.dumps(dict(value))
    return shown(tuple(value) if isinstance(value, list) else value)
