"""Episode statistics on the device, for the anakin platform: each member's episodes under way
and the window of its last W finished ones, kept in the jitted program (`track_episodes`, once
per env step) and read by the host between calls (`window_in_order`), with the same statistics
as the host path's `builders.experiments.counter.Counter`.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np


@flax.struct.dataclass
class Episodes:
    """Running episodes of B envs and the window of the last W finished ones.

    Attributes:
      episode_return, episode_length: [B] of the episodes under way.
      returns, lengths: [W] ring buffers of finished episodes; slot `i % W` holds the i-th.
      count: episodes finished so far.
      window_start: the first episode the window counts (0; a PBT exploit restarts it, so a
        member's window holds only episodes it played after its latest copy).
    """

    episode_return: jax.Array
    episode_length: jax.Array
    returns: jax.Array
    lengths: jax.Array
    count: jax.Array
    window_start: jax.Array

    @classmethod
    def zeros(cls, num_envs: int, window: int) -> Episodes:
        return cls(jnp.zeros(num_envs, jnp.float32), jnp.zeros(num_envs, jnp.int32),
                   jnp.zeros(window, jnp.float32), jnp.zeros(window, jnp.int32),
                   jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32))


def track_episodes(episodes: Episodes, reward: jax.Array, done: jax.Array,
                   first: jax.Array) -> Episodes:
    """Adds one step of B envs, as `builders.env_worker.EpisodeTracker` does on the host.

    A `first` step starts an episode (return and length 0); a `done` step ends one, which
    enters the window. When more than W end at once, the window keeps the last W of them.
    """
    window = episodes.returns.shape[0]
    episode_return = jnp.where(first, 0.0, episodes.episode_return + reward)
    episode_length = jnp.where(first, 0, episodes.episode_length + 1)
    rank = jnp.cumsum(done) - 1  # Order of the episodes ending on this step.
    ended = jnp.sum(done)
    keep = done & (rank >= ended - window)
    slot = jnp.where(keep, (episodes.count + rank) % window, window)  # window: dropped.
    return Episodes(
        episode_return, episode_length,
        episodes.returns.at[slot].set(episode_return, mode="drop"),
        episodes.lengths.at[slot].set(episode_length, mode="drop"),
        episodes.count + ended.astype(jnp.int32), episodes.window_start)


def window_in_order(values: np.ndarray, count: int, start: int = 0) -> np.ndarray:
    """A ring buffer's window oldest first: the last min(count - start, W) episodes."""
    window = values.shape[0]
    held = min(count - start, window)
    ordered: np.ndarray = values[np.arange(count - held, count) % window]
    return ordered
