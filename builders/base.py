"""The agent contract: the Builder, Learner and Policy protocols, ArraySpec and QueueSpec.

A builder says *what an agent is* (networks, policy, learner, what inference records and
how unrolls are batched); `builders.make_program` says how its pieces are wired into a
program graph; `launch` says where that graph runs. A builder knows nothing of platforms.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import jax
import numpy as np

from trellis.envs.specs import EnvSpec
from trellis.reverb_tables.spec import ArraySpec

# One ArraySpec for the whole package: the replay layer below owns it, the contract re-exports it.
__all__ = ["ArraySpec", "Builder", "Learner", "Policy", "QueueSpec"]


@dataclasses.dataclass(frozen=True)
class QueueSpec:
    """How unrolls flow from inference to the learner.

    Attributes:
      unroll_length: T; each unroll holds T + 1 steps (the last one is repeated as the first
        of the next unroll, so every transition is learned from once).
      batch_size: B, unrolls per learner step.
      max_batches: bound of the queue in learner batches; when full, inference blocks,
        which bounds policy lag instead of dropping data.
    """

    unroll_length: int
    batch_size: int
    max_batches: int


# policy(params, key, obs[N, ...]) -> (actions[N, ...], extras: {name: [N, ...]})
Policy = Callable[[Any, jax.Array, jax.Array], tuple[jax.Array, Mapping[str, jax.Array]]]


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

    def make_learner(self, networks: Any, spec: EnvSpec, key: jax.Array) -> Learner: ...
