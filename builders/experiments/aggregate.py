"""Aggregates over seeds: the interquartile mean and its percentile-bootstrap confidence interval.

The reporting of Agarwal et al., "Deep Reinforcement Learning at the Edge of the Statistical
Precipice" (NeurIPS 2021; their library is rliable): the interquartile mean (IQM) of the runs'
scores, robust to one outlying seed where the mean is not and less coarse than the median, with
a 95% confidence interval from resampling the runs with replacement. `benchmarks/results.py`
(docs/results.md) and the learning curves of several seeds (`curves.plot_runs`, `launch/plot.py`)
both report it.

Numpy only; no JAX. Written here from the paper's definitions, not copied from rliable.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

# The resamples of a bootstrap: rliable's default is 2,000 for an interval (the paper's
# figures use 50,000); at 2,000 an interval's ends move by well under 1% of their spread
# between seeds of the resampling.
RESAMPLES = 2_000


def quartile_weights(n: int) -> np.ndarray:
    """The weight of each of `n` sorted scores in their interquartile mean.

    Each score holds 1/n of the probability mass; the IQM is the mean of the mass between the
    25th and 75th percentiles, so a score counts by the share of its mass inside that range.
    For n divisible by 4 this drops the lowest and highest quarter whole, as scipy's
    `trim_mean(x, 0.25)` (rliable's IQM) does; for the 3 or 5 seeds of a typical RL table it
    weighs the two outer scores in part ((a + 4b + c) / 6 for sorted a, b, c) where trim_mean
    would cut none and give the plain mean.

    Args:
      n: the number of scores, >= 1.

    Returns:
      [n] weights summing to 1.
    """
    if n < 1:
        raise ValueError(f"an interquartile mean needs at least 1 score, got {n}")
    edges = np.arange(n + 1) / n  # Score i holds the mass in [i/n, (i+1)/n].
    inside: np.ndarray = np.clip(np.minimum(edges[1:], 0.75) - np.maximum(edges[:-1], 0.25),
                                 0.0, None)
    return inside / 0.5


def interquartile_mean(scores: np.ndarray | list[float], axis: int = 0) -> np.ndarray:
    """The interquartile mean of `scores` along `axis` (quartile_weights explains the weights).

    Args:
      scores: an array of scores, one per run along `axis`.
      axis: the axis of the runs.

    Returns:
      The IQM, with `axis` reduced (a 0-d array for a 1-d input).
    """
    ordered = np.sort(np.asarray(scores, dtype=np.float64), axis=axis)
    weights = quartile_weights(ordered.shape[axis])
    return np.tensordot(np.moveaxis(ordered, axis, -1), weights, axes=1)


def bootstrap_ci(scores: np.ndarray | list[float],
                 statistic: Callable[..., np.ndarray] = interquartile_mean, level: float = 0.95,
                 resamples: int = RESAMPLES, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A percentile-bootstrap confidence interval of `statistic` over runs (axis 0 of `scores`).

    The runs are drawn with replacement `resamples` times; the interval's ends are the
    (1 - level)/2 and (1 + level)/2 quantiles of the statistic over the resamples. With one
    task this is rliable's stratified bootstrap (its strata are the tasks). Seeded, so that a
    regenerated table gives the same interval.

    Args:
      scores: [runs, ...] scores; the trailing axes (points of a curve, say) are kept.
      statistic: `statistic(values, axis=k)` reduces the runs' axis k; `interquartile_mean` by
        default.
      level: the interval's coverage, in (0, 1).
      resamples: how many resamples.
      seed: the resampling's seed.

    Returns:
      (low, high), each with the trailing shape of `scores`.
    """
    if not 0 < level < 1:
        raise ValueError(f"a confidence level is in (0, 1), got {level}")
    runs = np.asarray(scores, dtype=np.float64)
    picks = np.random.default_rng(seed).integers(0, runs.shape[0], size=(resamples, runs.shape[0]))
    values = statistic(runs[picks], axis=1)  # [resamples, ...]
    low, high = np.quantile(values, [(1 - level) / 2, (1 + level) / 2], axis=0)
    return low, high
