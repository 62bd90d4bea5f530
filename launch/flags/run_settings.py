"""The run's settings as typed configs: the command line's own options (`RunOptions`), the
Atari envs' frame handling (`AtariConfig`), and `RunSettings`, everything a run is built from
(the validated configs), which builds the agent, the env factory and the platform's settings."""

from __future__ import annotations

import dataclasses
from typing import Any

from trellis.agents.registry import AGENTS, agent_module, agent_names
from trellis.builders.contract.config import Config, ExperimentConfig, setting
from trellis.builders.experiments.pbt import PBTConfig, PopulationPBT
from trellis.builders.experiments.platforms import ANAKIN, HostPlatform, PopulationSettings
from trellis.builders.experiments.tracking import TRACKERS
from trellis.envs.atari import with_settings as with_atari_settings
from trellis.envs.options import KWARGS_FAMILIES
from trellis.launch.flags.env_options import env_factory
from trellis.launch.flags.members import member_hparams, member_search
from trellis.launch.flags.presets import PRESET_NAMES
from trellis.launch.runtime import PLATFORMS
from trellis.reverb_tables import reverb_available

# How this invocation was started, not a setting of the run: not saved in config.json (the run
# directory is where the file lies).
_NOT_SAVED = ("config", "resume", "logdir")


def agent_requirement() -> str:
    """What --agent must be: one of the agents' names (Trellis's and those registered here)."""
    return "one of " + ", ".join(map(repr, agent_names()))


@dataclasses.dataclass(frozen=True)
class RunOptions(Config):
    """The command line's own options (neither the experiment's nor the agent's)."""

    # No `choices`: agent objects registered in the process (agents.registry.register, what
    # trellis.train does with one) are agents too; `check` reads the names when it runs.
    agent: str = setting("impala", f"the agent to train: {', '.join(sorted(AGENTS))}")
    env: str = setting(
        "CartPole-v1", "the env's id: a Gymnasium id (MODULE:ID imports MODULE first, in every "
        "process), or a family's, e.g. gymnax:CartPole-v1")
    env_kwargs: str | None = setting(
        None, "keyword arguments of the env: a JSON object or KEY=VALUE,... (each VALUE read as "
        f"JSON where it parses, else as a string), for {KWARGS_FAMILIES}")
    env_wrappers: tuple[str, ...] | None = setting(
        None, "Gymnasium envs: MODULE:NAME,... of callables that take an env and return one, "
        "applied in order to every env, in every process")
    platform: str = setting(
        "local_mp", "where the nodes run: threads, local processes or Ray; anakin: one jitted "
        "program for JAX envs (docs/anakin.md)", choices=(*PLATFORMS, ANAKIN))
    ray_address: str | None = setting(
        None, "--platform=ray: 'auto' or HOST:PORT joins a running Ray cluster; none starts a "
        "local Ray instance for this run (docs/cluster.md)")
    logdir: str | None = setting(
        None, "run directory, not one holding a run (--resume continues those); none: "
        "runs/AGENT-ENV-TIME")
    quiet: bool = setting(False, "no progress output")
    track: str | None = setting(
        None, "also send the config, every metrics record, the learning curve and the videos "
        "to Weights & Biases or MLflow (the extra of the same name; docs/configuration.md)",
        choices=TRACKERS)
    preset: str | None = setting(
        "auto", "a published source's settings for the agent on a family of envs (atari, "
        "mujoco, minatar, dmc, classic: docs/presets.md, run.py --list_presets); auto: the env's "
        "family's where the agent has it; none: the agent's defaults; settings given in a "
        "--config file or as flags override them; config.json records the one that applied",
        choices=PRESET_NAMES)
    no_compile_cache: bool = setting(
        False, "compile every jitted program afresh instead of using JAX's persistent "
        "compilation cache, kept beside the run directory (runs/.jax_cache)")
    config: str | None = setting(
        None, "a JSON or YAML file of settings (a run's config.json too); flags override it")
    resume: str | None = setting(
        None, "continue the run in this directory from its newest checkpoint, with its "
        "settings (flags given here override them, except agent and env)")
    # The anakin platform's population (docs/anakin.md).
    num_seeds: int = setting(
        1, "anakin: members trained in one program, each with its own params, optimizer "
        "state, envs and RNG", ge=1)
    member_hparams: str | None = setting(
        None, "anakin: the members' hyper-parameters, NAME=V1,V2,... (one value per member, "
        "or one for all) or NAME=LOW:HIGH (log-uniform per member), several joined by ';', "
        "e.g. learning_rate=1e-3:1e-2;entropy_cost=0.01")
    updates_per_call: int = setting(
        32, "anakin: updates per compiled call; between calls the host logs, checkpoints and "
        "checks the stop rule", ge=1)
    pbt: bool = setting(
        False, "anakin: population-based training of the members inside the program, "
        "perturbing the --member_hparams (the --pbt_* settings; docs/anakin.md)")

    def check(self) -> None:
        if self.agent not in agent_names():
            raise self.invalid("agent", agent_requirement())
        if self.ray_address is not None and self.platform != "ray":
            raise self.invalid("ray_address", "none unless --platform=ray")
        if self.platform != ANAKIN:
            if self.num_seeds != 1:
                raise self.invalid("num_seeds", "1 unless --platform=anakin")
            if self.member_hparams is not None:
                raise self.invalid("member_hparams", "none unless --platform=anakin")
            if self.pbt:
                raise self.invalid("pbt", f"false unless --platform={ANAKIN} (PBT of host "
                                   "platforms' runs: launch/tune.py --scheduler=pbt)")
        if self.pbt and self.num_seeds < 2:
            raise self.invalid("num_seeds", "at least 2 with --pbt")
        if self.pbt and self.member_hparams is None:
            raise self.invalid("member_hparams", "the hyper-parameters that --pbt perturbs, "
                               "e.g. learning_rate=1e-5:1e-1")


@dataclasses.dataclass(frozen=True)
class AtariConfig(Config):
    """The frame handling of Atari envs (ALE/NAME-v5 or envpool:NAME-v5 ids; envs/atari.py);
    each left at None keeps the env id's own. Rewards are clipped by the agents' learners
    (their reward_clip), so the returns a run reports are the game's score."""

    episodic_life: bool | None = setting(
        None, "Atari: a lost life ends an episode (the game goes on; returns are then per "
        "life); none: the id's own (off)")
    frame_skip: int | None = setting(
        None, "Atari: frames each action repeats (the last two max-pooled); none: 4", ge=1)
    frame_stack: int | None = setting(
        None, "Atari: frames stacked in an observation; none: 4", ge=1)
    frame_size: int | None = setting(
        None, "Atari: the grey frames' side in pixels; none: 84", ge=8)
    noop_max: int | None = setting(
        None, "Atari: at most this many no-op actions start each game; none: 30", ge=0)
    repeat_action_probability: float | None = setting(
        None, "Atari: sticky actions, the probability of repeating the previous action; "
        "none: the id's own (0.25 for ALE/*-v5, 0 for envpool:*)", ge=0, le=1)
    full_action_space: bool | None = setting(
        None, "Atari: all 18 actions instead of the game's minimal set; none: off")

    def given(self) -> dict[str, Any]:
        """The settings that are not None, by name."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """Everything a run is built from: the validated configs."""

    options: RunOptions
    experiment: ExperimentConfig
    agent: Any  # The agent's Config.
    pbt: PBTConfig = PBTConfig()  # Used with --pbt (anakin); tune.py's PBT reads it too.
    atari: AtariConfig = AtariConfig()

    def build(self) -> tuple[Any, Any]:
        """(the agent's builder, the env factory) these settings name.

        Raises:
          ValueError: the settings need what this installation lacks (dm-reverb).
        """
        if self.experiment.replay_backend == "reverb" and not reverb_available():
            raise ValueError("--replay_backend=reverb needs dm-reverb, which is not installed "
                             "here (`make test-reverb` builds .venv-reverb with it); use native")
        builder = agent_module(self.options.agent).Builder(self.agent)
        o = self.options
        return builder, with_atari_settings(env_factory(o.env, o.env_kwargs, o.env_wrappers),
                                            self.atari.given())

    def platform(self) -> HostPlatform | PopulationSettings:
        """The platform's typed settings: a program graph's, or anakin's population."""
        o = self.options
        if o.platform == ANAKIN:
            return PopulationSettings(o.num_seeds, self.population_hparams(), o.updates_per_call,
                                      self.population_pbt())
        return HostPlatform(o.platform, o.ray_address if o.platform == "ray" else None)

    def population_hparams(self) -> dict[str, list[float]]:
        """The anakin members' hyper-parameters, {name: one value per member}."""
        return member_hparams(self.options.member_hparams, self.options.num_seeds,
                              self.experiment.seed)

    def population_pbt(self) -> PopulationPBT | None:
        """With --pbt, its settings and what it resamples each --member_hparams name from."""
        if not self.options.pbt:
            return None
        return PopulationPBT(self.pbt, member_search(self.options.member_hparams))

    def saved_options(self) -> dict[str, Any]:
        """The options config.json records: all but those that say how this invocation was
        started (config, resume, logdir: the run directory is where the file lies); with
        --pbt, the --pbt_* settings too; the Atari settings that are not None."""
        saved = {k: v for k, v in dataclasses.asdict(self.options).items() if k not in _NOT_SAVED}
        saved.update(self.atari.given())
        return {**saved, **dataclasses.asdict(self.pbt)} if self.options.pbt else saved
