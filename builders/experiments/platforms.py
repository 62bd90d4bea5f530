"""A run's platform, as typed settings: where the session's `Execution` runs the program.

`HostPlatform` for a program graph on the runtime's platforms (`local_mt`, `local_mp`, `ray`),
`PopulationSettings` for `anakin` (act and learn in one jitted program, envs written in JAX).
No JAX here: the command line's flags build these before any node starts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from trellis.builders.experiments.pbt import PopulationPBT
from trellis.launch import runtime

# The platform that runs act and learn as one jitted program (builders/experiments/anakin.py),
# beside the runtime's platforms, for envs written in JAX.
ANAKIN = "anakin"


@dataclasses.dataclass(frozen=True)
class HostPlatform:
    """Where a program graph runs.

    Attributes:
      platform: "local_mt" (threads), "local_mp" (a process per node) or "ray".
      ray_address: the Ray cluster to join ("auto": the local cluster's head); None: a
        local Ray started for the run. Only for "ray".
    """

    platform: str = "local_mt"
    ray_address: str | None = None

    def __post_init__(self) -> None:
        if self.platform not in runtime.PLATFORMS:
            raise ValueError(f"unknown platform {self.platform!r}; choose one of: "
                             f"{', '.join(sorted(runtime.PLATFORMS))}")
        if self.ray_address is not None and self.platform != "ray":
            raise ValueError(f"ray_address is a setting of the ray platform, not of "
                             f"{self.platform}")

    def launch_options(self) -> dict[str, Any]:
        return {} if self.ray_address is None else {"ray_address": self.ray_address}


@dataclasses.dataclass(frozen=True)
class PopulationSettings:
    """What the anakin platform adds to a run's settings.

    Attributes:
      num_seeds: M, members trained in one program.
      hparams: {name: M values}, the members' starting hyper-parameters (others: the config's).
      updates_per_call: updates of every member per compiled call.
      pbt: population-based training inside the program (`--pbt`), or None.
    """

    num_seeds: int = 1
    hparams: Mapping[str, Sequence[float]] = dataclasses.field(default_factory=dict)
    updates_per_call: int = 32
    pbt: PopulationPBT | None = None


Platform = HostPlatform | PopulationSettings


def platform_settings(platform: str | Platform) -> Platform:
    """`platform`'s typed settings; a name gets the defaults."""
    if isinstance(platform, str):
        return PopulationSettings() if platform == ANAKIN else HostPlatform(platform)
    return platform


def platform_name(platform: Platform) -> str:
    return ANAKIN if isinstance(platform, PopulationSettings) else platform.platform
