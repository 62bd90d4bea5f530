"""The in-process executions' one skeleton: `InProcessRun` drives a compiled program that
runs in the session's own process (anakin's population, ES's generations, self-play).

The skeleton does what the three share: the session's clock (from the process's start:
imports and compilation count), the time and resume count of earlier sessions, the compiled
calls until the stop rule says stop, the reports (the members' counters combined, the last
call's metrics, the env-step rate after the first call, which compiled), checkpoints (opened
at first use: orbax takes a second or two to import, and a short run reaches its target
without waiting for it) and the summary's steady rate. A kind supplies only what differs, an
`InProcessProgram`: its state, one compiled call, its members' counters and its own fields.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from trellis.builders.contract.config import ExperimentConfig
from trellis.builders.experiments.checkpointing import Checkpointer, checkpoint_dir
from trellis.builders.experiments.counter import CounterSnapshot, combined_stats
from trellis.builders.experiments.execution import Ending, Report
from trellis.builders.experiments.stop import SIGNAL, StopRule


@dataclasses.dataclass(frozen=True)
class Called:
    """What one compiled call gives the report beside the counters.

    Attributes:
      metrics: the call's metrics, numbers (the learner's, the schedule's, the kind's own).
      fields: more fields for this metrics record (an evaluation's, PBT's exploits).
      record_now: write the record now, not at the next log interval.
    """

    metrics: Mapping[str, float]
    fields: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    record_now: bool = False


class InProcessProgram(Protocol):
    """What a kind of in-process execution supplies to `InProcessRun`."""

    @property
    def state(self) -> Any:
        """The checkpointed state (a pytree; also the target a checkpoint is restored onto)."""
        ...

    @property
    def num_members(self) -> int:
        """Members stepping in lockstep: the env-step rates count all of them."""
        ...

    def restore(self, state: Any, progress: Mapping[str, Any]) -> None:
        """Continues from a checkpoint's state and its progress record."""
        ...

    def call(self) -> Called:
        """One compiled call, waited for."""
        ...

    def snapshots(self, elapsed_s: float, resumes: int) -> Sequence[CounterSnapshot]:
        """Each member's counters now (the first member's progress is checkpointed)."""
        ...

    def fields(self, snapshots: Sequence[CounterSnapshot]) -> dict[str, Any]:
        """The kind's fields of every metrics record (e.g. each member's return)."""
        ...

    def summary(self, snapshots: Sequence[CounterSnapshot]) -> dict[str, Any]:
        """The kind's summary fields at the end."""
        ...


def seconds_since_process_start() -> float | None:
    """How long this process has run (Linux's /proc), or None where that cannot be read."""
    try:
        with open("/proc/self/stat") as f:
            # Field 22 (after the parenthesised name, which may hold spaces): start time in
            # clock ticks since boot.
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        return time.clock_gettime(time.CLOCK_BOOTTIME) - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def rate(steps: int, seconds: float) -> float:
    """Steps per second, rounded; 0 over no time."""
    return round(steps / seconds, 1) if seconds > 0 else 0.0


class InProcessRun:
    """The session's `Execution` of an `InProcessProgram` (see the module's docstring).

    Each `advance` makes one compiled call and reports; the stop rule is asked with every
    member's counters (`StopRule.decide`).

    Args:
      program: the kind's program, compiled.
      config: the experiment's settings (checkpoints kept).
      run_dir: the run directory.
      stop_rule: the session's rule.
      resume: (step, progress) of the checkpoint to continue from, or None.
    """

    def __init__(self, program: InProcessProgram, config: ExperimentConfig, run_dir: str,
                 stop_rule: StopRule, resume: tuple[int, Mapping[str, Any]] | None):
        # The session's clock starts with the process: imports and compilation count.
        self._started = time.monotonic() - (seconds_since_process_start() or 0.0)
        self._program, self._rule = program, stop_rule
        self._elapsed_before = float(resume[1].get("elapsed_s", 0.0)) if resume else 0.0
        self._resumes = int(resume[1].get("resumes", 0)) + 1 if resume else 0
        self._checkpoints = functools.cache(
            lambda: Checkpointer(checkpoint_dir(run_dir), config.keep_checkpoints))
        if resume:
            program.restore(*self._checkpoints().restore(program.state, resume[0]))
        self._called = Called({})
        self._steady: tuple[float, int] | None = None  # (time, env steps) after compiling.
        self._last: tuple[Report, Sequence[CounterSnapshot], float] | None = None

    def _snapshots(self) -> Sequence[CounterSnapshot]:
        elapsed = self._elapsed_before + time.monotonic() - self._started
        return self._program.snapshots(elapsed, self._resumes)

    def _rate_since(self, since: tuple[float, int] | None, now: float, env_steps: int) -> float:
        """All members' env steps per second from `since` (after compiling) to `now`."""
        start, steps = since or (now, env_steps)
        return rate((env_steps - steps) * self._program.num_members, now - start)

    def _report(self, snapshots: Sequence[CounterSnapshot], stopped_by: str | None,
                called: Called) -> Report:
        now = time.monotonic()
        stats = {**combined_stats(snapshots), **called.metrics,
                 "env_steps_per_s": self._rate_since(self._steady, now, snapshots[0].env_steps)}
        report = Report(stats, {**self._program.fields(snapshots), **called.fields}, stopped_by,
                        record_now=called.record_now)
        self._last = (report, snapshots, now)
        return report

    def advance(self, timeout_s: float) -> Report:
        del timeout_s  # One compiled call: its length is the program's.
        self._called = self._program.call()
        snapshots = self._snapshots()
        if self._steady is None:  # After the first call, which compiled the program.
            self._steady = (time.monotonic(), snapshots[0].env_steps)
        return self._report(snapshots, self._rule.decide(snapshots), self._called)

    def checkpoint(self) -> None:
        self._save(self._snapshots()[0])

    def stop(self) -> Report:
        return self._report(self._snapshots(), SIGNAL, Called(self._called.metrics))

    def finish(self) -> Ending:
        assert self._last is not None
        report, snapshots, stopped = self._last
        self._save(snapshots[0])
        self._checkpoints().close()
        fields = {
            # After the first call (compiled) until the stop, the final checkpoint not
            # included: the steady rate, all members.
            "steady_env_steps_per_s": self._rate_since(self._steady, stopped,
                                                       snapshots[0].env_steps),
            **self._program.summary(snapshots)}
        return Ending(130 if report.stopped_by == SIGNAL else 0, self._started, fields)

    def _save(self, snapshot: CounterSnapshot) -> None:
        self._checkpoints().save(snapshot.env_steps, self._program.state, snapshot.progress())
