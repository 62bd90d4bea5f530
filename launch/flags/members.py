"""`--member_hparams`: the anakin population's hyper-parameters, one value per member, and what
`--pbt` resamples them from."""

from __future__ import annotations

import numpy as np

from trellis.builders.experiments.pbt import Dimension
from trellis.launch.flags.values import UsageError


def member_search(text: str | None) -> dict[str, Dimension]:
    """`--member_hparams` as {name: Dimension}: LOW:HIGH a loguniform range, V1,V2,... a
    choice of the values (what the members are given, and what --pbt resamples from).

    Raises:
      UsageError: the text is not of that form.
    """
    out: dict[str, Dimension] = {}
    for item in filter(None, (part.strip() for part in (text or "").split(";"))):
        name, _, values = (x.strip() for x in item.partition("="))
        try:
            if ":" in values:
                low, high = (float(x) for x in values.split(":"))
                if not 0 < low <= high:
                    raise ValueError
                out[name] = Dimension("loguniform", (low, high))
            else:
                out[name] = Dimension("choice", tuple(float(x) for x in values.split(",")))
        except ValueError:
            raise UsageError(f"--member_hparams: {item!r} must be NAME=V1,V2,... or "
                             "NAME=LOW:HIGH with 0 < LOW <= HIGH") from None
        if not name.isidentifier():
            raise UsageError(f"--member_hparams: {item!r} must start with a setting's name")
    return out


def member_hparams(text: str | None, num_seeds: int, seed: int) -> dict[str, list[float]]:
    """`--member_hparams` as {name: num_seeds values}: a list of one value per member (or one
    for all), or LOW:HIGH drawn log-uniformly per member from a generator seeded by `seed`.

    Raises:
      UsageError: the text is not of that form, or a list has neither 1 nor num_seeds values.
    """
    rng = np.random.default_rng([seed, 0x4A4B])  # Its own stream: not the run's other draws.
    out: dict[str, list[float]] = {}
    for name, dimension in member_search(text).items():
        if dimension.kind == "loguniform":
            low, high = dimension.values
            out[name] = np.exp(rng.uniform(np.log(low), np.log(high), num_seeds)).tolist()
            continue
        given = list(dimension.values)
        if len(given) not in (1, num_seeds):
            raise UsageError(f"--member_hparams: {name} has {len(given)} values; give "
                             f"1 or --num_seeds={num_seeds}")
        out[name] = given * (num_seeds // len(given))
    return out
