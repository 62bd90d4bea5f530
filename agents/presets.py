"""`Preset`: an agent's settings for a family of envs, each with the published source it comes
from. Agents offer theirs as `PRESETS` ({name: Preset}); the command line picks one by the env's
family (launch/flags/presets.py) and docs/presets.md tables them. It lies outside
agents/common, whose package imports JAX: the command line's flags import this module, and env
workers import those without JAX."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any


@dataclasses.dataclass(frozen=True)
class Preset(Mapping[str, Any]):
    """Settings from a published source, read as a mapping {setting: value}.

    Attributes:
      source: where the settings come from (a paper's table, a file of a named repository).
      settings: {setting name: value}, as the command line takes them.
      sources: the settings taken from elsewhere, {setting name: its source} (e.g. Trellis's
        own where the source has no counterpart); the others are `source`'s.

    Raises:
      ValueError: `sources` names a setting that `settings` lacks.
    """

    source: str
    settings: Mapping[str, Any]
    sources: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = sorted(set(self.sources) - set(self.settings))
        if unknown:
            raise ValueError(f"Preset.sources names {', '.join(unknown)}, which its settings "
                             f"lack (they have: {', '.join(sorted(self.settings))})")

    def source_of(self, name: str) -> str:
        """The published source of setting `name`."""
        return self.sources.get(name, self.source)

    def __getitem__(self, name: str) -> Any:
        return self.settings[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.settings)

    def __len__(self) -> int:
        return len(self.settings)


# `--preset=minatar` of the agents with a pixel torso (IMPALA, PPO, APPO, A2C), chosen by itself
# for MinAtar's games: the MinAtar paper's network for its 10 x 10 grids (Young and Tian, 2019,
# "MinAtar: An Atari-Inspired Testbed for Thorough and Reproducible Reinforcement Learning
# Experiments", section 4: one 3 x 3 convolution of 16 channels, then 128 units), Trellis's
# "minatar" torso.
MINATAR = Preset(source="Young and Tian (2019), MinAtar, section 4's network",
                 settings={"pixel_torso": "minatar"})
