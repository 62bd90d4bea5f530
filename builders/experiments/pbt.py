"""What sweeps and population-based training search over, shared by Ray Tune sweeps
(builders/experiments/tuning.py, launch/tune.py) and PBT on the device (the anakin platform).

`PBTConfig` holds the `--pbt_*` settings, which mean the same on both. `parse_search` reads
one `--search NAME=KIND:ARGS` spec into a `Dimension`; `PopulationPBT` is what the anakin
platform's program needs of PBT. Nothing here imports Ray or JAX.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from trellis.builders.contract.config import Config, setting

# The kinds of `--search` specs, with what they take: number ranges or value lists.
RANGES = ("loguniform", "uniform", "randint")
LISTS = ("choice", "grid")
SPEC_FORMS = ("NAME=loguniform:LOW:HIGH, NAME=uniform:LOW:HIGH, NAME=randint:LOW:HIGH or "
              "NAME=choice:V1,V2,... or NAME=grid:V1,V2,...")


@dataclasses.dataclass(frozen=True)
class PBTConfig(Config):
    """Population-based training (Jaderberg et al., 2017): every `pbt_interval` env steps,
    members in the bottom `pbt_quantile` copy a member of the top one (exploit) and perturb
    its hyper-parameters (explore)."""

    pbt_interval: int = setting(
        20_000, "PBT: env steps between a member's exploit/explore rounds", ge=1)
    pbt_quantile: float = setting(
        0.25, "PBT: the fraction of members that copies from the same fraction at the top",
        gt=0, le=0.5)
    pbt_perturb: tuple[float, ...] = setting(
        (0.8, 1.2), "PBT: explore multiplies a number hyper-parameter by one of these factors",
        gt=0)
    pbt_resample_probability: float = setting(
        0.25, "PBT: chance that explore draws a hyper-parameter afresh from its search space "
        "instead", ge=0, le=1)

    def check(self) -> None:
        if len(self.pbt_perturb) != 2:
            raise self.invalid("pbt_perturb", "two factors, e.g. 0.8,1.2")


@dataclasses.dataclass(frozen=True)
class Dimension:
    """One searched setting: `kind` is one of RANGES (`values` = (low, high)) or LISTS."""

    kind: str
    values: tuple[Any, ...]


@dataclasses.dataclass(frozen=True)
class PopulationPBT:
    """PBT inside an anakin population's program (builders/experiments/anakin.py).

    Attributes:
      config: the `--pbt_*` settings.
      search: {name: Dimension} of the hyper-parameters PBT perturbs: explore resamples each
        from its dimension (loguniform: a range; choice: one of the values).
    """

    config: PBTConfig
    search: dict[str, Dimension]

    def interval_updates(self, env_steps_per_update: int) -> int:
        """`pbt_interval` env steps as whole updates (at least one): Tune's interval is reached
        once that many steps have passed, so it is rounded up."""
        return max(1, math.ceil(self.config.pbt_interval / env_steps_per_update))


def quantile_size(num_members: int, fraction: float) -> int:
    """Members in each of the bottom and top quantiles, counted as Tune's
    PopulationBasedTraining does: ceil(N * fraction), at most half of the N."""
    size = math.ceil(num_members * fraction)
    return size if size <= num_members / 2 else num_members // 2


class SearchSpecError(ValueError):
    """A `--search` spec that cannot be read; the message is one line for the user."""


def parse_search(text: str) -> tuple[str, Dimension]:
    """`NAME=KIND:ARGS` as (name, dimension); list values are numbers where they read as one.

    Raises:
      SearchSpecError: not one of SPEC_FORMS, or a range that is empty or, for loguniform,
        not positive.
    """
    name, eq, spec = (part.strip() for part in text.partition("="))
    kind, _, args = spec.partition(":")
    if not eq or not name.isidentifier() or kind not in RANGES + LISTS or not args:
        raise SearchSpecError(f"--search {text!r} must be {SPEC_FORMS}")
    if kind in LISTS:
        values = tuple(_value(v.strip()) for v in args.split(",") if v.strip())
        if not values:
            raise SearchSpecError(f"--search {text!r}: {kind} needs at least one value")
        return name, Dimension(kind, values)
    try:
        low, high = (float(x) for x in args.split(":"))
    except ValueError:
        raise SearchSpecError(f"--search {text!r}: {kind} takes LOW:HIGH, two numbers") from None
    if kind == "randint" and not (low.is_integer() and high.is_integer()):
        raise SearchSpecError(f"--search {text!r}: randint takes two integers")
    if not low < high or (kind == "loguniform" and low <= 0) or not math.isfinite(high):
        need = "0 < LOW < HIGH" if kind == "loguniform" else "LOW < HIGH"
        raise SearchSpecError(f"--search {text!r}: {kind} needs {need}")
    if kind == "randint":
        return name, Dimension(kind, (int(low), int(high)))
    return name, Dimension(kind, (low, high))


def _value(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"true": True, "false": False, "none": None}.get(text.lower(), text)
