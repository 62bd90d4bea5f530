"""The agent contract: the Builder, Learner and Policy protocols, ArraySpec and QueueSpec.

A builder says *what an agent is* (networks, policy, learner, what inference records and
how unrolls are batched); `builders.make_program` says how its pieces are wired into a
program graph; `launch` says where that graph runs. A builder knows nothing of platforms.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import jax
import numpy as np

from trellis.envs.specs import EnvSpec
from trellis.reverb_tables.spec import ArraySpec, TableSpec

# One ArraySpec for the whole package: the replay layer below owns it, the contract re-exports it.
__all__ = ["STATE_PREFIX", "ArraySpec", "Builder", "Learner", "Policy", "QueueSpec", "State",
           "recorded_state", "state_specs"]

# Recorded unrolls carry the policy state at their first step as fields "state/<name>".
STATE_PREFIX = "state/"

# Batches sampled from a builder's own replay table (`Builder.replay_table`) also carry each
# item's key [B] (host only: for priority updates) and how it was sampled [1, B].
REPLAY_KEY = "replay/key"
REPLAY_PROBABILITY = "replay/probability"
REPLAY_TABLE_SIZE = "replay/table_size"


@dataclasses.dataclass(frozen=True)
class QueueSpec:
    """How unrolls flow from inference to the learner.

    Attributes:
      unroll_length: T; each unroll holds T + 1 steps.
      batch_size: B, unrolls per learner step.
      max_batches: bound of the queue in learner batches; when full, inference blocks,
        which bounds policy lag instead of dropping data.
      overlap: how many steps the next unroll repeats from the end of the previous one. 1
        (the last step repeated as the next first) learns from every transition once; a
        recurrent replay agent repeats more, e.g. half its sequence, as a burn-in.

    Raises:
      ValueError: `overlap` outside [1, unroll_length].
    """

    unroll_length: int
    batch_size: int
    max_batches: int
    overlap: int = 1

    def __post_init__(self):
        if not 1 <= self.overlap <= self.unroll_length:
            raise ValueError(
                f"overlap={self.overlap} must be in [1, unroll_length={self.unroll_length}]")


# A policy's recurrent state: {name: [N, ...]}, one row per env slot; {} when feed-forward.
State = Mapping[str, jax.Array]

# policy(params, key, obs[N, ...], state, first[N]) -> (actions[N, ...], extras, new_state).
# extras: {name: [N, ...]}. The policy resets the rows of `state` where `first` is set before
# using them (the learner's unroll does the same), so actor and learner see the same state.
Policy = Callable[
    [Any, jax.Array, jax.Array, State, jax.Array],
    tuple[jax.Array, Mapping[str, jax.Array], State],
]


def recorded_state(batch: Mapping[str, Any]) -> dict[str, Any]:
    """The policy state at the first step of each unroll of a batch: {name: [B, ...]}.

    Unrolls hold it as the fields `state/<name>` [1, B, ...] (see `state_specs`); {} when
    the policy is feed-forward.
    """
    return {name.removeprefix(STATE_PREFIX): v[0] for name, v in batch.items()
            if name.startswith(STATE_PREFIX)}


def state_specs(initial_state: Mapping[str, np.ndarray]) -> dict[str, ArraySpec]:
    """The recorded fields `state/<name>` of one slot, from `Builder.initial_state` rows."""
    return {STATE_PREFIX + name: ArraySpec(tuple(v.shape[1:]), str(v.dtype))
            for name, v in initial_state.items()}


class Learner(Protocol):
    """What the learner node needs of an agent's learner.

    `state` and `restore` make checkpoints generic: the learner node saves `state` (any
    pytree, e.g. a `flax.struct.dataclass` of params, optimizer state, RNG key and step) and
    on resume hands back a pytree of the same structure to `restore`.
    """

    def step(self, batch: Mapping[str, np.ndarray]) -> Mapping[str, Any]: ...

    @property
    def params(self) -> Any: ...

    @property
    def state(self) -> Any: ...

    def restore(self, state: Any) -> None: ...


class Builder(Protocol):
    """What every agent provides (see agents/impala/builder.py)."""

    def queue_spec(self) -> QueueSpec: ...

    def make_networks(self, spec: EnvSpec) -> Any: ...

    def extras_spec(self, spec: EnvSpec) -> dict[str, ArraySpec]: ...

    def make_policy(self, networks: Any, evaluation: bool = False) -> Policy: ...

    def initial_state(self, spec: EnvSpec, num_slots: int) -> dict[str, np.ndarray]:
        """Every env slot's initial policy state {name: [num_slots, ...]}; {} if feed-forward.

        Slot = worker_id * K + env index; values may differ per slot.
        """
        ...

    def replay_table(self, signature: Mapping[str, ArraySpec]) -> TableSpec | None:
        """The agent's own replay table of unrolls, or None (the learner takes unrolls in order).

        With a table (R2D2), `make_program` puts it on a replay node; every env slot's unroll
        goes in as one item (`signature`: {field: [T + 1, ...]}, state fields [1, ...]); the
        learner gets batches sampled from it, with `REPLAY_KEY`, `REPLAY_PROBABILITY` and
        `REPLAY_TABLE_SIZE`; and `make_learner` gets `replay=`, a client of the replay node.
        """
        ...

    def make_learner(self, networks: Any, spec: EnvSpec, key: jax.Array,
                     devices: Sequence[jax.Device] | None = None) -> Learner:
        """The learner on `devices` (default: all local devices)."""
        ...
