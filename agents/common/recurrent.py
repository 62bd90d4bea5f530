"""The recurrent core: an LSTM that resets where an episode starts; its zero state per slot."""


from __future__ import annotations

from collections.abc import Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

LSTMState = dict[str, jax.Array]  # {"c": [B, H], "h": [B, H]}: cell and hidden state.


def reset_where(first: jax.Array, state: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
    """`state` with the rows where `first` [B] is set replaced by zeros."""
    def reset(s: jax.Array) -> jax.Array:
        rows = first.reshape(first.shape + (1,) * (s.ndim - first.ndim))
        return jnp.where(rows, jnp.zeros_like(s), s)

    return {name: reset(s) for name, s in state.items()}


class _ResettingLSTMCell(nn.Module):
    """One LSTM step that first zeroes the rows of the carry where a new episode starts."""

    hidden_size: int

    @nn.compact
    def __call__(self, carry: tuple[jax.Array, jax.Array], inputs: tuple[jax.Array, jax.Array]
                 ) -> tuple[tuple[jax.Array, jax.Array], jax.Array]:
        x, first = inputs  # [B, D], [B]
        c, h = (reset_where(first, {"c": carry[0], "h": carry[1]})[k] for k in ("c", "h"))
        return nn.OptimizedLSTMCell(self.hidden_size)((c, h), x)


class LSTMCore(nn.Module):
    """An LSTM unrolled over time that restarts from zeros wherever `first` is set.

    Call: `core(state, x[T, B, D], first[T, B]) -> (new_state, y[T, B, hidden_size])`, with
    `state` = {"c": [B, H], "h": [B, H]} (`lstm_initial_state`; other keys are ignored and not
    returned) the state before step 0. Step t uses zeros instead of the carried state where
    `first[t]` is set, so an acting policy (T = 1 per call, carrying the state) and a learner
    unrolling [T, B] from the state recorded at step 0 compute the same outputs.
    """

    hidden_size: int

    @nn.compact
    def __call__(self, state: Mapping[str, jax.Array], x: jax.Array,
                 first: jax.Array) -> tuple[LSTMState, jax.Array]:
        scan = nn.scan(_ResettingLSTMCell, variable_broadcast="params",
                       split_rngs={"params": False}, in_axes=0, out_axes=0)
        (c, h), y = scan(self.hidden_size, name="lstm")((state["c"], state["h"]), (x, first))
        return {"c": c, "h": h}, y


def lstm_initial_state(num_slots: int, hidden_size: int) -> dict[str, np.ndarray]:
    """Zero LSTM state {"c", "h"} [num_slots, hidden_size], as `LSTMCore` resets to."""
    return {name: np.zeros((num_slots, hidden_size), np.float32) for name in ("c", "h")}
