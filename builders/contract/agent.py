"""The agent contract: one small protocol per kind of agent, the Learner and Policy protocols,
the agent's Capabilities, its pure Training pieces, ArraySpec and QueueSpec.

A builder says *what an agent is* and *what it can do* (`Capabilities`); the experiment layer
(`trellis.builders.experiments`) wires its pieces into a program graph or into one jitted
program, and refuses what the agent cannot do in one line. A builder knows nothing of
platforms. The kinds, each run loop typed by the one it needs (Acme's nested builders):

- `Agent`: what every kind gives (capabilities, settings, networks, the pure `Training`);
  `Acting` adds a policy that acts in envs (what an evaluator plays). Both are generic in the
  spec of the envs the agent is built for (`SpecT`): `Agent[EnvSpec]` on single-agent envs,
  `Agent[MultiAgentSpec]` on multi-agent ones (`Capabilities.multi_agent`);
- `Builder`: a gradient learner fed by inference's unrolls or by replay (IMPALA, PPO, DQN);
- `builders.contract.population.PopulationSearch`: search over parameter vectors, fitness
  from whole episodes (evolution strategies);
- `builders.contract.self_play.SelfPlayAgent`: self-play with search in two-player games
  (AlphaZero).

`Capabilities.learns_from` says which kind an agent is; `lacking` names what an agent that
claims a kind does not provide.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

import numpy as np

from trellis.envs.multi_agent import MultiAgentSpec
from trellis.envs.specs import EnvSpec
from trellis.reverb_tables.spec import ArraySpec, TableSpec

# JAX only for annotations: env workers import this module, and importing JAX costs each of
# them 1-2 s of start-up (32 workers on 2 cores: most of a minute).
if TYPE_CHECKING:
    import jax

    from trellis.builders.contract.config import AgentConfig
    from trellis.builders.contract.hparams import HyperParams

# One ArraySpec for the whole package: the replay layer below owns it, the contract re-exports it.
__all__ = ["EPISODES", "LEARNS_FROM", "REPLAY", "SELF_PLAY", "STATE_PREFIX", "UNROLLS",
           "Acting", "Agent", "AgentSettings", "ArraySpec", "Builder", "Capabilities",
           "ExtrasSpec", "Learner", "Policy", "QueueSpec", "SpecT", "State", "Training", "Tree",
           "Update", "init_device", "lacking", "recorded_state", "state_specs"]

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

    def __post_init__(self) -> None:
        if not 1 <= self.overlap <= self.unroll_length:
            raise ValueError(
                f"overlap={self.overlap} must be in [1, unroll_length={self.unroll_length}]")


# What an agent is built for (the type parameter of `Agent`, `Acting` and `Builder`): the spec
# of a single-agent env (`EnvSpec`) or of a multi-agent one (`MultiAgentSpec`). Which one a
# builder takes is its `Capabilities.multi_agent`; the experiment layer pairs a builder with
# an env of that kind at run time (session.check_supported refuses the others).
SpecT = TypeVar("SpecT", bound=EnvSpec | MultiAgentSpec, contravariant=True)

# A policy's recurrent state: {name: [N, ...]}, one row per env slot; {} when feed-forward.
State = Mapping[str, "jax.Array"]

# What a policy observes and gives, per step of N envs: arrays [N, ...] in a single-agent env;
# in a multi-agent env a `MultiAgentStep` in, and {agent: [N, ...]} out, for the action and for
# each extra (envs/multi_agent.py). A pytree whose structure the env's kind sets; no static type
# covers both kinds and still lets a single-agent policy take a plain array, so it is `Any`,
# under this name.
Tree = Any

# policy(params, key, obs[N, ...], state, first[N]) -> (actions[N, ...], extras, new_state).
# extras: {name: [N, ...]} (`Tree`s, as obs and actions). The policy resets the rows of `state`
# where `first` is set before using them (the learner's unroll does the same), so actor and
# learner see the same state.
Policy = Callable[
    [Any, "jax.Array", Tree, State, "jax.Array"],
    tuple[Tree, Mapping[str, Tree], State],
]

# What a policy records per step beside the action (`Builder.extras_spec`): {name: ArraySpec}.
# In a multi-agent env every agent records each extra: its spec is the same for every agent
# (an ArraySpec) or given per agent ({agent: ArraySpec}, e.g. logits of different sizes).
ExtrasSpec = Mapping[str, ArraySpec | Mapping[str, ArraySpec]]


def init_device(devices: Iterable[jax.Device]) -> jax.Device:
    """Where a learner's one-off programs run (its keys, its state's init): the host's CPU,
    or the first of `devices` where JAX runs without its CPU backend (JAX_PLATFORMS naming
    only an accelerator). On a GPU each would otherwise compile for the GPU, autotuning
    kernels it runs once, on the start-up's critical path (docs/benchmarks.md)."""
    import jax  # Here, not at the top: see the import above.

    try:
        # This process's: under `jax.distributed`, jax.devices("cpu")[0] is process 0's.
        return jax.local_devices(backend="cpu")[0]
    except RuntimeError:
        return next(iter(devices))


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


# Where a learner's data comes from (`Capabilities.learns_from`).
UNROLLS = "unrolls"  # Inference's unrolls, in order (IMPALA, PPO).
REPLAY = "replay"  # Items sampled from a table (DQN, Ape-X, SAC: transitions; R2D2: sequences).
# Scalar fitnesses of whole episodes, no gradient (evolution strategies): the "batch" of
# `Training.make_update`'s update is {"fitness": [N]}, one per member of a population.
EPISODES = "episodes"
# Two-player self-play positions with search targets, played and learned from inside one
# program on the device (AlphaZero: builders/experiments/self_play_run.py).
SELF_PLAY = "self_play"
# What `Capabilities.learns_from` may be.
LEARNS_FROM = (UNROLLS, REPLAY, EPISODES, SELF_PLAY)


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """What an agent can do. The experiment layer checks a run against it before starting
    anything, and a run it cannot do is one line naming what would work.

    Attributes:
      learns_from: `UNROLLS` (the learner takes inference's unrolls in order), `REPLAY`
        (it samples stored items, and its `make_learner` gets the replay table's client or
        keeps its own table), `EPISODES` (a population's fitnesses of whole episodes) or
        `SELF_PLAY` (two-player self-play positions with search targets, on the device).
      recurrent: the policy carries a state per env slot (`Builder.initial_state`).
      anakin: the pure pieces (`Builder.make_training`, the policy) run inside one jitted
        act-and-learn program with envs written in JAX (--platform=anakin).
      multi_agent: the agent learns in multi-agent envs (envs/multi_agent.py), one policy
        per group of agents (builders/contract/policy_mapping.py); it runs on those envs
        only, and single-agent agents on single-agent envs only.
    """

    learns_from: str
    recurrent: bool = False
    anakin: bool = False
    multi_agent: bool = False

    def __post_init__(self) -> None:
        if self.learns_from not in LEARNS_FROM:
            raise ValueError(f"Capabilities.learns_from must be one of {LEARNS_FROM}, "
                             f"got {self.learns_from!r}")


# update(state, batch) -> (state, metrics): pure and jittable; the batch's leaves are
# time-major unrolls [T + 1, B, ...] (or what the agent's replay samples).
Update = Callable[[Any, Mapping[str, "jax.Array"]], tuple[Any, dict[str, "jax.Array"]]]


@dataclasses.dataclass(frozen=True)
class Training:
    """An agent's learning as pure functions: what the learner node's host shell and the
    anakin program both build from, without constructing each other's objects.

    Attributes:
      init: `init(key) -> state`, the training state (a pytree: params, optimizer state,
        key, step, hyper-parameters held as arrays).
      make_update: `make_update(mesh) -> update`; the mesh (or None inside a program that
        places the update itself) lets an update constrain the sharding of what it builds.
      acting_params: `acting_params(state)`, the params the policy reads
        (`Policy`'s first argument): the state's `params` unless the agent says otherwise
        (actor-critics act with their actor's params only).
      hparams: reads and writes the hyper-parameters the state holds as arrays (what
        `--member_hparams`, PBT and the learning-rate schedule set); None: the agent has
        none, and a run that asks for them is refused (builders/contract/hparams.py).
    """

    init: Callable[[jax.Array], Any]
    make_update: Callable[[Any], Update]
    acting_params: Callable[[Any], Any] = operator.attrgetter("params")
    hparams: HyperParams | None = None


class Learner(Protocol):
    """What the learner node needs of an agent's learner.

    `state` and `restore` make checkpoints generic: the learner node saves `state` (any
    pytree, e.g. a `flax.struct.dataclass` of params, optimizer state, RNG key and step) and
    on resume hands back a pytree of the same structure to `restore`.
    """

    def step(self, batch: Mapping[str, np.ndarray]) -> Mapping[str, Any]: ...

    def place(self, batch: Mapping[str, Any]) -> Mapping[str, Any]:
        """The batch where `step` reads it (the learner node prepares the next batch while
        the current update runs); the batch itself for a learner that takes host batches."""
        ...

    def compile(self, batch: Mapping[str, Any]) -> None:
        """Compiles the update for batches shaped as `batch` (a tree of
        `jax.ShapeDtypeStruct`: the feed's unrolls, or the items sampled from the builder's
        replay table) before one comes; a learner whose update takes batches of its own
        making (minibatches it samples from its own table) compiles for those."""
        ...

    @property
    def params(self) -> Any: ...

    @property
    def state(self) -> Any: ...

    def restore(self, state: Any) -> None: ...


@runtime_checkable
class KeepsReplay(Protocol):
    """A learner that keeps a replay table of its own (an off-policy learner's transitions),
    which its `state` leaves out: the learner node saves it beside the final checkpoint of a
    session, and a resumed run restores it, so the run goes on learning from the data it had
    instead of refilling the table first."""

    def save_replay(self, directory: str) -> int:
        """Writes the table (and whatever sampling from it needs) into the empty `directory`;
        returns the items saved."""
        ...

    def restore_replay(self, directory: str) -> int:
        """Replaces the table with the one `save_replay` wrote to `directory`; returns the
        items restored."""
        ...


class AgentSettings(Protocol):
    """What the experiment layer reads of every agent's config."""

    @property
    def learning_rate_schedule(self) -> str:
        """`hparams.CONSTANT`, or `hparams.LINEAR` (set through `Training.hparams`)."""
        ...


class Agent(Protocol[SpecT]):
    """What every kind of agent provides, on envs of spec type `SpecT` (`EnvSpec` or
    `MultiAgentSpec`)."""

    @property
    def capabilities(self) -> Capabilities: ...

    @property
    def config(self) -> AgentSettings: ...

    def make_networks(self, spec: SpecT) -> Any: ...

    def make_training(self, networks: Any, spec: SpecT) -> Training:
        """The pure init and update, and the state's hyper-parameters (`Training.hparams`)."""
        ...


class Acting(Agent[SpecT], Protocol[SpecT]):
    """An agent whose policy acts in envs (what evaluators play): every kind but self-play,
    whose players are searches (builders/contract/self_play.py)."""

    def make_policy(self, networks: Any, evaluation: bool = False) -> Policy: ...

    def initial_state(self, spec: SpecT, num_slots: int) -> dict[str, np.ndarray]:
        """Every env slot's initial policy state {name: [num_slots, ...]}; {} if feed-forward.

        Slot = worker_id * K + env index; values may differ per slot.
        """
        ...


def lacking(agent: object, kind: type) -> list[str]:
    """The public members of protocol `kind` that `agent` does not have, sorted: what an
    agent claiming that kind (`Capabilities.learns_from`) still has to write."""
    return sorted(name for name in dir(kind)
                  if not name.startswith("_") and not hasattr(agent, name))


class Builder(Acting[SpecT], Protocol[SpecT]):
    """A gradient learner fed by inference's unrolls or by replay (`UNROLLS`, `REPLAY`; see
    agents/impala/builder.py): the program graph and the anakin program use all of it."""

    @property
    def config(self) -> AgentConfig: ...

    def queue_spec(self) -> QueueSpec: ...

    def extras_spec(self, spec: SpecT) -> ExtrasSpec: ...

    def replay_table(self, signature: Mapping[str, ArraySpec]) -> TableSpec | None:
        """The agent's own replay table of unrolls, or None (the learner takes unrolls in order).

        With a table (R2D2), `make_program` puts it on a replay node; every env slot's unroll
        goes in as one item (`signature`: {field: [T + 1, ...]}, state fields [1, ...]); the
        learner gets batches sampled from it, with `REPLAY_KEY`, `REPLAY_PROBABILITY` and
        `REPLAY_TABLE_SIZE`; and `make_learner` gets `replay=`, a client of the replay node.
        """
        ...

    def make_learner(self, networks: Any, spec: SpecT, key: jax.Array, *,
                     devices: Sequence[jax.Device] | None = None,
                     replay: Any = None) -> Learner:
        """The learner's host shell around `make_training`'s pieces, seeded from `key`.

        Args:
          devices: where the learner runs (default: all local devices).
          replay: a client of the replay node holding `replay_table`'s table, when the agent
            has one (`make_program` adds the node); None otherwise.
        """
        ...
