"""Command-line settings generated from the config dataclasses (docs/configuration.md).

One flat namespace of `--field_name=value` flags: the command line's own options
(`RunOptions`), the experiment's (`builders.contract.config.ExperimentConfig`) and the chosen
agent's config (`--agent=X`). Every field is a flag, with its declared default, one-line help and
bounds; no flag is written by hand. A settings file (`--config=FILE`, JSON or YAML; a run
directory's config.json too) sets any of them and flags override it; `--resume=RUN_DIR`
starts from the run's saved settings instead. Bad input raises `UsageError`, one line naming
the setting and what is allowed.

A module per job: `table` (the flags generated from the configs), `values` (a setting's value
from its text), `files` (settings files and saved runs), `presets`, `env_options`
(`--env_kwargs`, `--env_wrappers`), `members` (`--member_hparams`), `platform_choice` (the
platform, read before JAX is imported), `run_settings` (the typed settings a run is built
from) and `parsing` (a command line into validated settings). This package re-exports what the
command lines and the tests use.

Only light imports here: run.py imports this package at its top level, which every node
process of local_mp re-runs (multiprocessing's preparation), and env workers must not load
JAX. Agent packages (which import JAX) are imported by name when a command line is parsed.
"""

from trellis.builders.experiments.platforms import ANAKIN
from trellis.launch.flags.env_options import ENV_KWARGS, env_factory, env_kwargs
from trellis.launch.flags.files import FIXED_ON_RESUME, SEARCH, read_file, read_search
from trellis.launch.flags.members import member_hparams, member_search
from trellis.launch.flags.parsing import load_run, parse, parse_groups
from trellis.launch.flags.platform_choice import platform_of
from trellis.launch.flags.presets import PRESET_NAMES, list_presets, preset_line, preset_settings
from trellis.launch.flags.run_settings import AtariConfig, RunOptions, RunSettings
from trellis.launch.flags.values import AUTO, UsageError, from_text

__all__ = [
    "ANAKIN", "AUTO", "ENV_KWARGS", "FIXED_ON_RESUME", "PRESET_NAMES", "SEARCH", "AtariConfig",
    "RunOptions", "RunSettings", "UsageError", "env_factory", "env_kwargs", "from_text",
    "list_presets", "load_run", "member_hparams", "member_search", "parse", "parse_groups",
    "platform_of", "preset_line", "preset_settings", "read_file", "read_search",
]
