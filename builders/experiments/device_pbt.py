"""Population-based training on the device, for the anakin platform (Jaderberg et al., 2017):
the members' ranking, exploit (a gather over the member axis) and explore (Tune's perturb or
resample), run inside the jitted program between updates (`pbt_round`), and the host's record
of what each round did (`exploits`). `builders.experiments.pbt` holds the settings it shares
with Ray Tune's PBT.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from trellis.builders.contract.hparams import HyperParams
from trellis.builders.experiments.device_episodes import Episodes
from trellis.builders.experiments.pbt import LISTS, Dimension, PopulationPBT, quantile_size

_PBT_STREAM = 0x504254  # "PBT".


def window_means(episodes: Episodes) -> jax.Array:
    """Each member's mean return over its window ([M]); -inf before its first episode ends,
    so a member without a score ranks last."""
    window = episodes.returns.shape[-1]
    held = jnp.minimum(episodes.count - episodes.window_start, window)
    # Slot i holds the episode finished `age` episodes before the newest one.
    age = (episodes.count[..., None] - 1 - jnp.arange(window)) % window
    total = jnp.sum(jnp.where(age < held[..., None], episodes.returns, 0.0), axis=-1)
    return jnp.where(held > 0, total / jnp.maximum(held, 1), -jnp.inf)


def sample(dimension: Dimension, key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """Draws from a search dimension (float32): loguniform and uniform ranges, or one of a
    choice's or grid's values.

    Raises:
      ValueError: a kind PBT on the device does not resample (randint).
    """
    kind, values = dimension.kind, dimension.values
    if kind in LISTS:
        return jnp.asarray(values, jnp.float32)[jax.random.randint(key, shape, 0, len(values))]
    if kind == "loguniform":
        return jnp.exp(jax.random.uniform(key, shape, minval=math.log(values[0]),
                                          maxval=math.log(values[1])))
    if kind == "uniform":
        return jax.random.uniform(key, shape, minval=values[0], maxval=values[1])
    raise ValueError(f"PBT on the device resamples loguniform, uniform and list dimensions, "
                     f"not {kind}")


def explore(hparams: Mapping[str, jax.Array], key: jax.Array,
            pbt: PopulationPBT) -> dict[str, jax.Array]:
    """Tune's explore, per member ({name: [M]}): each searched hyper-parameter is drawn afresh
    from its dimension with probability `pbt_resample_probability`, else multiplied by one of
    the two `pbt_perturb` factors, each with probability 1/2. Others are kept."""
    out = dict(hparams)
    for name, name_key in zip(sorted(pbt.search), jax.random.split(key, len(pbt.search)),
                              strict=True):
        resample_key, factor_key, draw_key = jax.random.split(name_key, 3)
        value = hparams[name]
        factor = jnp.asarray(pbt.config.pbt_perturb, value.dtype)[
            jax.random.randint(factor_key, value.shape, 0, 2)]
        resample = jax.random.uniform(resample_key, value.shape) < (
            pbt.config.pbt_resample_probability)
        out[name] = jnp.where(resample, sample(pbt.search[name], draw_key, value.shape),
                              value * factor).astype(value.dtype)
    return out


@flax.struct.dataclass
class PBTEvent:
    """One update's PBT round, [M] per member: `donor` is the member each one copied (itself
    if it did not), `score` the mean returns it was ranked by, `before` and `after` the
    hyper-parameters {name: [M]} before and after the round; `round` whether one ran."""

    round: jax.Array
    donor: jax.Array
    score: jax.Array
    before: dict[str, jax.Array]
    after: dict[str, jax.Array]


def exploit_and_explore(train: Any, episodes: Episodes, key: jax.Array, pbt: PopulationPBT,
                        hparams: HyperParams) -> tuple[Any, Episodes, PBTEvent]:
    """A PBT round over the members' training states and return windows (leaves [M, ...]),
    as Tune's PopulationBasedTraining does it between trials: the members are ranked by their
    window's mean return; each one in the bottom `pbt_quantile` copies a member of the top
    quantile drawn at random (its training state: params, optimizer state, RNG key, step
    counter), empties its own return window, and takes that member's hyper-parameters
    through `explore`. A gather over the member axis: nothing leaves the device.

    Returns:
      (train, episodes, the round's event).
    """
    score = window_means(episodes)
    num_members = score.shape[0]
    size = quantile_size(num_members, pbt.config.pbt_quantile)
    order = jnp.argsort(score)  # Worst first; ties in member order.
    donor_key, explore_key = jax.random.split(key)
    chosen = order[num_members - size + jax.random.randint(donor_key, (size,), 0, size)]
    donor = jnp.arange(num_members).at[order[:size]].set(chosen)
    copied = jax.tree.map(lambda x: x[donor], train)
    before = hparams.get(train)
    explored = explore(hparams.get(copied), explore_key, pbt)
    exploits = donor != jnp.arange(num_members)
    after = {name: jnp.where(exploits, v, before[name]) for name, v in explored.items()}
    # The copy starts an empty window (and keeps its envs' episodes under way and its episode
    # count): its mean return, its rank at the next round and whether it solved then count
    # only episodes it played itself, never the donor's. Copying the window let a whole
    # population "solve" the moment its bottom members copied solved donors.
    episodes = dataclasses.replace(
        episodes, window_start=jnp.where(exploits, episodes.count, episodes.window_start))
    return (hparams.set(copied, after), episodes,
            PBTEvent(jnp.asarray(True), donor, score, before, after))


def exploits(events: PBTEvent, last_step: int, steps_per_update: int) -> list[dict[str, Any]]:
    """One dict per member that exploited another in a call's events (host arrays, leaves
    [U, ...] over its U updates, the last at learner step `last_step`): `env_steps` (per
    member) of the round, `member`, `donor`, their `member_return` and `donor_return` (the
    window means they were ranked by; None before a member's first episode ended), and the
    hyper-parameters: the member's `before`, the donor's `donor_hparams` and the member's
    `after`."""
    out = []
    num_updates = events.round.shape[0]
    for u in np.flatnonzero(events.round):
        env_steps = (last_step - num_updates + 1 + int(u)) * steps_per_update
        donor = events.donor[u]
        for member in np.flatnonzero(donor != np.arange(donor.shape[0])):
            d = int(donor[member])
            out.append({
                "env_steps": env_steps, "member": int(member), "donor": d,
                "member_return": _finite(events.score[u, member]),
                "donor_return": _finite(events.score[u, d]),
                "before": {k: float(v[u, member]) for k, v in events.before.items()},
                "donor_hparams": {k: float(v[u, d]) for k, v in events.before.items()},
                "after": {k: float(v[u, member]) for k, v in events.after.items()}})
    return out


def _finite(x: Any) -> float | None:
    return float(x) if np.isfinite(x) else None


def no_pbt_round(train: Any, episodes: Episodes, hparams: HyperParams
                 ) -> tuple[Any, Episodes, PBTEvent]:
    """`exploit_and_explore`'s result when no round is due: everything unchanged."""
    values = hparams.get(train)
    members = jnp.arange(episodes.count.shape[0])
    return train, episodes, PBTEvent(jnp.asarray(False), members, window_means(episodes),
                                     values, values)


def pbt_round(train: Any, episodes: Episodes, member_key: jax.Array, due: jax.Array,
              pbt: PopulationPBT, hparams: HyperParams) -> tuple[Any, Episodes, PBTEvent]:
    """`exploit_and_explore` where `due`, else `no_pbt_round`, inside the jitted program.

    Args:
      member_key: member 0's acting key; folded with a constant, a stream of its own that is
        part of the state, so a resumed run draws what an uninterrupted one would.
    """
    key = jax.random.fold_in(member_key, _PBT_STREAM)
    # Only what a round changes goes through the cond: its operands may be copied.
    out: tuple[Any, Episodes, PBTEvent] = jax.lax.cond(
        due, functools.partial(exploit_and_explore, key=key, pbt=pbt, hparams=hparams),
        functools.partial(no_pbt_round, hparams=hparams), train, episodes)
    return out
