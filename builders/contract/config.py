"""Configuration: the base of every config dataclass, and the experiment's settings.

A config is a frozen dataclass deriving from `Config` whose fields are declared with
`setting(default, help, ge=..., choices=...)`. The declaration is the single source of the
default, the one-line help, the type and the bounds: `Config.__post_init__` validates every
field from it, and the command line (launch/flags.py) generates its flags from it. A subclass
may change a field's default with a plain annotation (`epsilon: float = 0.4`); the help and
bounds are then those the nearest base class declared.

Supported field types: int, float (an int is accepted), bool, str, `tuple[X, ...]` of one of
those (a list is accepted and stored as a tuple), each optionally `| None`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from collections.abc import Sequence
from typing import Any, TypeVar

from trellis.reverb_tables import BACKENDS as REPLAY_BACKENDS

_DECLARATION = "trellis.setting"
_KINDS = {int: "an int", float: "a number", bool: "true or false", str: "a string"}
_PLURALS = {int: "ints", float: "numbers", bool: "booleans", str: "strings"}
_T = TypeVar("_T")


@dataclasses.dataclass(frozen=True)
class _Declaration:
    help: str
    ge: float | None
    gt: float | None
    le: float | None
    lt: float | None
    choices: tuple[Any, ...] | None


def setting(
    default: _T,
    help: str,
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    choices: Sequence[Any] | None = None,
) -> _T:
    """Declares a config field: its default, a one-line help and what values are allowed.

    Args:
      default: the field's default (immutable: use a tuple, not a list).
      help: one line for `--help` and the docs.
      ge: a bound (>=) on the value, or on each item of a tuple.
      gt: a bound (>) on the same.
      le: a bound (<=) on the same.
      lt: a bound (<) on the same.
      choices: the only values allowed (for strings, usually).

    Returns:
      A `dataclasses.field` carrying the declaration in its metadata (typed, as
      `dataclasses.field` is, as the default's type: `n: int = setting(1, ...)` type-checks).
    """
    declaration = _Declaration(help, ge, gt, le, lt, None if choices is None else tuple(choices))
    return dataclasses.field(default=default, metadata={_DECLARATION: declaration})


@dataclasses.dataclass(frozen=True)
class Setting:
    """One field of a config class, resolved from its annotation and declaration.

    Attributes:
      name: the field's name.
      kind: int, float, bool or str: the value's type (each item's, for a tuple).
      sequence: the field is `tuple[kind, ...]`.
      optional: None is allowed.
      default: the class's default.
      declaration: what `setting(...)` declared (help, bounds, choices).
    """

    name: str
    kind: type
    sequence: bool
    optional: bool
    default: Any
    declaration: _Declaration

    @property
    def help(self) -> str:
        """The one-line description."""
        return self.declaration.help

    def requirement(self) -> str:
        """What is allowed, in words: e.g. "an int >= 1", "one of 'local', 'replay'"."""
        if self.declaration.choices is not None:
            text = self._range()
        else:
            kind = (f"a non-empty list of {_PLURALS[self.kind]}" if self.sequence
                    else _KINDS[self.kind])
            text = " ".join(filter(None, (kind, self._range())))
        return text + (" or None" if self.optional else "")

    def violation(self, value: Any) -> str | None:
        """None if `value` is allowed, else what is allowed: only the bounds or choices for a
        scalar of the right type out of them, the whole requirement otherwise (a tuple
        field's value must be a tuple by now)."""
        if value is None:
            return None if self.optional else self.requirement()
        if self.sequence:
            fine = (isinstance(value, tuple) and len(value) > 0
                    and all(_has_kind(v, self.kind) and self._in_range(v) for v in value))
            return None if fine else self.requirement()
        if not _has_kind(value, self.kind):
            return self.requirement()
        if self._in_range(value):
            return None
        return self._range() + (" or None" if self.optional else "")

    def _range(self) -> str:
        d = self.declaration
        if d.choices is not None:
            return "one of " + ", ".join(repr(c) for c in d.choices)
        low = ("[", d.ge) if d.ge is not None else ("(", d.gt) if d.gt is not None else None
        high = ("]", d.le) if d.le is not None else (")", d.lt) if d.lt is not None else None
        if low and high:
            return f"in {low[0]}{low[1]:g}, {high[1]:g}{high[0]}"
        if low:
            return f"{'>=' if low[0] == '[' else '>'} {low[1]:g}"
        if high:
            return f"{'<=' if high[0] == ']' else '<'} {high[1]:g}"
        return ""

    def _in_range(self, value: Any) -> bool:
        d = self.declaration
        if d.choices is not None and value not in d.choices:
            return False
        return ((d.ge is None or value >= d.ge) and (d.gt is None or value > d.gt)
                and (d.le is None or value <= d.le) and (d.lt is None or value < d.lt))


def _has_kind(value: Any, kind: type) -> bool:
    if kind is float:  # An int is a fine float; a bool is not a number here.
        return (isinstance(value, (int, float)) and not isinstance(value, bool)
                and math.isfinite(value))
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


class ConfigError(ValueError):
    """A config field holds a value that is not allowed.

    Attributes:
      owner: the config class's name.
      field: the field's name.
      value: the value given.
      requirement: what is allowed, in words.
    """

    def __init__(self, owner: str, field: str, value: Any, requirement: str):
        super().__init__(f"{owner}.{field} must be {requirement}, got {value!r}")
        self.owner, self.field, self.value, self.requirement = owner, field, value, requirement


def _annotation_kind(cls: type, name: str, annotation: Any) -> tuple[type, bool, bool]:
    """(kind, sequence, optional) of a field's annotation; TypeError if unsupported."""
    args = typing.get_args(annotation)
    optional = False
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        rest = [a for a in args if a is not type(None)]
        optional = len(rest) < len(args)
        annotation = rest[0] if len(rest) == 1 else annotation
        args = typing.get_args(annotation)
    sequence = typing.get_origin(annotation) is tuple
    if sequence and len(args) == 2 and args[1] is Ellipsis:
        annotation = args[0]
    if annotation not in _KINDS:
        raise TypeError(f"{cls.__name__}.{name}: unsupported setting type {annotation!r}; "
                        f"allowed: int, float, bool, str, tuple[X, ...] of those, each | None")
    return annotation, sequence, optional


def _declaration(cls: type, name: str) -> _Declaration:
    """The declaration of `name` by `cls` or, for a redefined default, its nearest base."""
    for klass in cls.__mro__:
        field = getattr(klass, "__dataclass_fields__", {}).get(name)
        if field is not None and _DECLARATION in field.metadata:
            declaration: _Declaration = field.metadata[_DECLARATION]
            return declaration
    raise TypeError(f"{cls.__name__}.{name} is not declared: give it a default with "
                    f"setting(default, help=...) in {cls.__name__} or a base class")


@functools.cache
def settings(cls: type) -> tuple[Setting, ...]:
    """The settings of a config class, in field order.

    Raises:
      TypeError: a field without a declaration or of an unsupported type.
    """
    hints = typing.get_type_hints(cls)
    out = []
    for field in dataclasses.fields(cls):
        kind, sequence, optional = _annotation_kind(cls, field.name, hints[field.name])
        declaration = _declaration(cls, field.name)
        out.append(Setting(field.name, kind, sequence, optional, field.default, declaration))
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class Config:
    """Base of the config dataclasses: every field is validated from its declaration.

    Subclasses are frozen dataclasses whose fields are `setting(...)`s. Checks that involve
    several fields go in `check`, raising `self.invalid(field, requirement)`.
    """

    def __post_init__(self) -> None:
        cls: type = type(self)  # (as `type`: mypy takes a dataclass's __hash__ for its class's)
        for s in settings(cls):
            value = getattr(self, s.name)
            if s.sequence and isinstance(value, list):  # From JSON: stored as a tuple.
                value = tuple(value)
                object.__setattr__(self, s.name, value)
            violation = s.violation(value)
            if violation is not None:
                raise self.invalid(s.name, violation)
        self.check()

    def check(self) -> None:
        """Cross-field checks; override where a config needs one (fields are valid here)."""

    def invalid(self, field: str, requirement: str) -> ConfigError:
        """The error for `field`'s current value, which must be `requirement` (words)."""
        return ConfigError(type(self).__name__, field, getattr(self, field), requirement)


UNROLL_QUEUES = ("local", "replay")
TRANSPORTS = ("shm", "socket")


@dataclasses.dataclass(frozen=True)
class ExperimentConfig(Config):
    """Agent-independent settings of one run."""

    # Acting.
    num_actors: int = setting(2, "env worker nodes", ge=1)
    envs_per_actor: int = setting(32, "envs stepped by each env worker", ge=1)
    # Double-buffered sampling (Sample Factory: Petrenko et al., 2020): while one group's step
    # is at inference, the worker steps another group, so its cores do not wait for the round
    # trip.
    env_buffers: int = setting(
        1, "groups each env worker splits its envs into, each stepped in its own thread while "
        "the others' steps are at inference (2: double-buffered sampling); must divide "
        "envs_per_actor", ge=1)
    max_actor_restarts: int = setting(
        3, "times each env worker is restarted (fresh process, fresh seed) after it dies or its "
        "env raises, before its failure stops the run", ge=0)
    # Where env workers and the learner's process want the same cores, the learner's process
    # (central inference and learner, on every env step's path) gets them first: Pong on the
    # H100 machine rose from 58,689 to 71,779 frames/s with 14 workers at nice 10, and started
    # sooner (docs/benchmarks.md).
    actor_nice: int = setting(
        10, "how much nicer (lower CPU priority, os.nice) than the launcher the env workers' "
        "processes run (local_mp, ray); 0: the same priority", ge=0, le=19)
    # Stopping: whichever comes first.
    total_env_steps: int = setting(2_000_000, "env-step budget of the run", ge=1)
    stop_at_return: float | None = setting(
        None, "stop once the mean return over the last return_window episodes reaches this; "
        "none: no target; auto (run.py's default): the env's Gymnasium reward_threshold")
    return_window: int = setting(
        100, "episodes in the mean return used for stopping and reports", ge=1)
    # 0.25 ms, not 2: the wait is on every worker's path, and with 32 sleep:20 workers on 2
    # cores 2 ms held the steady rate at 0.74-0.76 of ideal where 0-0.25 ms gave 0.85
    # (docs/benchmarks.md, "Many workers on 2 cores"); CartPole learned no slower.
    inference_timeout_ms: float = setting(
        0.25, "inference batching: wait at most this long for more workers to join a batch",
        ge=0)
    transport: str = setting(
        "shm", "how env workers on the learner's host reach inference: shared memory (shm; the "
        "socket where it cannot be had) or the RPC socket (socket)", choices=TRANSPORTS)
    seed: int = setting(0, "root seed of the run (env workers, learner, evaluator)", ge=0)
    log_every_s: float = setting(1.0, "seconds between progress lines and metrics records", gt=0)
    learn: bool = setting(
        True, "false: act and drain unrolls without learning (measures acting alone)")
    learner_batch: str = setting(
        "auto", "unrolls per learner update: auto, every unroll waiting, the agent's "
        "batch_size times 1, 2, 4, ... up to one from every env (the batch follows the rate "
        "at which unrolls arrive, so the policy lag stays at a few updates); fixed: batch_size",
        choices=("auto", "fixed"))
    unroll_queue: str = setting(
        "local", "where unrolls wait for the learner: an in-process queue (local) or a Queue "
        "table on a replay node (replay)", choices=UNROLL_QUEUES)
    replay_backend: str = setting(
        "native", "replay tables' backend (reverb needs dm-reverb installed)",
        choices=REPLAY_BACKENDS)
    # Checkpoints of the learner state and counters (where: `checkpointing.Checkpoints` of
    # builders/experiments/).
    checkpoint_every_s: float = setting(
        60.0, "seconds between learner checkpoints (one is also written at stop)", gt=0)
    keep_checkpoints: int = setting(3, "newest checkpoints kept", ge=1)
    # Preemption (SIGTERM) gives a job a grace period before SIGKILL (Kubernetes' default: 30 s);
    # the final checkpoint must be on disk within it.
    shutdown_timeout_s: float = setting(
        30.0, "seconds a stopping run (a signal, the budget, the return target) gives its nodes "
        "to end and the learner to write its final checkpoint; past them the nodes are killed "
        "and the run exits with code 3 (docs/configuration.md)", gt=0)
    max_learner_restarts: int = setting(
        0, "times the learner node is restarted from its newest checkpoint after it dies (host "
        "platforms; env workers wait for it and reconnect); 0: its death stops the run", ge=0)
    # One learner across processes and hosts (builders/experiments/distributed.py): each takes
    # its share of every batch from the replay node's unroll table, in step with the others.
    learner_processes: int = setting(
        1, "learner processes in one jax.distributed group, gradients all-reduced over all "
        "their devices (local_mp, ray: placed on nodes with an accelerator where the cluster "
        "has any); more than 1 needs --unroll_queue=replay and --learner_batch=fixed", ge=1)
    # Off by default: the evaluator is one more process with its own JAX, which on a small
    # machine competes with the learner for cores (IMPALA on CartPole to 475, local_mp, 2 cores:
    # 14.1 s without, 19.3 s with, one run each).
    eval_every: int = setting(
        0, "env steps between evaluations of the greedy policy (one also at the start); "
        "0: no evaluator node", ge=0)
    eval_episodes: int = setting(10, "episodes per evaluation", ge=1)
    video: bool = setting(
        False, "record episodes of the greedy policy as MP4 into RUN_DIR/videos/: one at each "
        "evaluation (--eval_every; host platforms) and one of the final checkpoint (run.py); "
        "the env's factory must render (envs/contract.py) and the video extra be installed")

    def check(self) -> None:
        if self.envs_per_actor % self.env_buffers:
            raise self.invalid("env_buffers",
                               f"a divisor of envs_per_actor ({self.envs_per_actor})")
        if self.learner_processes > 1 and (self.unroll_queue, self.learner_batch) != (
                "replay", "fixed"):
            # Every process takes its share from the replay node's table, and the update, a
            # collective, must have the same shape in every process.
            raise self.invalid("learner_processes", "1 unless --unroll_queue=replay and "
                               "--learner_batch=fixed (the processes share one unroll table "
                               "and update in step on batches of one size)")
        if self.learner_processes > 1 and self.max_learner_restarts:
            # A restarted process cannot rejoin its jax.distributed group.
            raise self.invalid("learner_processes", "1 with --max_learner_restarts > 0 (a "
                               "group of learner processes is not restarted)")

    @property
    def num_envs(self) -> int:
        """Envs over all env workers."""
        return self.num_actors * self.envs_per_actor

    @property
    def env_groups(self) -> int:
        """The groups of envs that step in lockstep, over all env workers: what central
        inference serves as its workers (`env_buffers` per env worker)."""
        return self.num_actors * self.env_buffers

    @property
    def envs_per_group(self) -> int:
        """The envs of one group (`env_groups`)."""
        return self.envs_per_actor // self.env_buffers


@dataclasses.dataclass(frozen=True)
class AgentConfig(Config):
    """The settings every agent has; an agent's config derives from it, sets its own defaults
    (plain annotations keep the help and bounds declared here) and adds its own fields."""

    # Data from inference: `batch_size` unrolls of `unroll_length` steps per learner step.
    unroll_length: int = setting(20, "env steps per unroll (T)", ge=1)
    batch_size: int = setting(32, "unrolls per learner step (B)", ge=1)
    max_queue_size: int = setting(
        2, "unroll batches in flight before inference waits (bounds the policy lag)", ge=1)
    # Network.
    hidden_sizes: tuple[int, ...] = setting(
        (64, 64), "widths of the MLP torso's hidden layers, comma-separated", ge=1)
    # Returns.
    discount: float = setting(0.99, "discount factor of future rewards", ge=0, le=1)
    # Optimiser (Adam with global-norm gradient clipping).
    learning_rate: float = setting(1e-3, "Adam's learning rate", gt=0)
    learning_rate_schedule: str = setting(
        "constant", "the learning rate's schedule: constant, or linear (falling to 0 at the end "
        "of the env-step budget, --total_env_steps; the IMPALA paper's)",
        choices=("constant", "linear"))
    max_grad_norm: float = setting(40.0, "gradients are clipped to this global norm", gt=0)
    adam_eps: float = setting(1e-8, "Adam's epsilon (denominator stability)", gt=0)


@dataclasses.dataclass(frozen=True)
class MinibatchConfig(AgentConfig):
    """The settings of the agents that make several passes of shuffled minibatches over each
    batch of unrolls (PPO and its kin, PQN, QMIX/VDN)."""

    num_epochs: int = setting(4, "passes over each batch", ge=1)
    num_minibatches: int = setting(
        4, "minibatches per pass; must divide unroll_length * batch_size", ge=1)

    def check(self) -> None:
        super().check()
        if self.num_transitions % self.num_minibatches:
            raise self.invalid(
                "num_minibatches", f"a divisor of unroll_length * batch_size = "
                f"{self.num_transitions} (the transitions of a batch)")

    @property
    def num_transitions(self) -> int:
        """Transitions per learner batch, T * B (a team's transition counts once)."""
        return self.unroll_length * self.batch_size

    @property
    def minibatch_size(self) -> int:
        """Transitions per minibatch."""
        return self.num_transitions // self.num_minibatches


@dataclasses.dataclass(frozen=True)
class ReplayConfig(AgentConfig):
    """The settings of the agents that learn from a replay table (DQN, Ape-X, SAC): each
    learner step inserts its unrolls as n-step transitions, then takes SGD steps on samples."""

    n_step: int = setting(3, "steps of the n-step returns", ge=1)
    replay_size: int = setting(100_000, "transitions the replay table holds", ge=1)
    min_replay_size: int = setting(
        2_000, "no updates before the table holds this many transitions", ge=1)
    updates_per_step: int = setting(
        32, "SGD steps per learner step; with --replay_ratio, per compiled call (the ratio's "
        "granularity)", ge=1)
    sample_batch_size: int = setting(128, "transitions sampled per SGD step", ge=1)
    # The published off-policy runs fix updates per env step (SAC's and TD3's one); a learner
    # step's unrolls vary in number (the learner batch follows the arrival rate), so only a
    # ratio holds whether the env workers outrun the learner or lag behind it.
    replay_ratio: float | None = setting(
        None, "SGD steps per env step once the table holds min_replay_size, e.g. 1.0 (SAC's "
        "and TD3's one update per env step): each learner step runs as many calls of "
        "updates_per_step as its unrolls' env steps owe; anakin: round(replay_ratio x "
        "batch_size x unroll_length) per iteration; none: one call per learner step", gt=0)

    def check(self) -> None:
        if self.min_replay_size > self.replay_size:
            raise self.invalid("min_replay_size", f"<= replay_size = {self.replay_size}")
