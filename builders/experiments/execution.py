"""What the session (builders/experiments/session.py) and a platform say to each other.

A platform's `Execution` runs the program until told to stop and reports its counters
(`Report`); once stopped, it says how the program ended (`Ending`). Everything else — signals,
progress, metrics, the checkpoint timer, the summary — is the session's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Protocol


@dataclasses.dataclass(frozen=True)
class Report:
    """What a running platform reports: its counters, as the learner node gives them.

    Attributes:
      stats: env_steps, learner_steps, episodes, mean_return, ... (`CounterSnapshot.stats`
        plus the learner's latest metrics).
      fields: more fields for this metrics record (a population's per-member returns and
        hyper-parameters, PBT's exploits).
      stopped_by: set on the platform's last report: why it stopped (`stop.BUDGET`,
        `stop.RETURN_TARGET`, `stop.SIGNAL`, or the runtime's "error" and "completed").
      record_now: written to the run directory now, not at the next log interval.
    """

    stats: Mapping[str, Any]
    fields: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    stopped_by: str | None = None
    record_now: bool = False


# The exit code of a run whose learner did not end within `shutdown_timeout_s` once stopping
# (a signal, the budget): it was killed, and its final checkpoint is not written. Not 1 (a
# node's error) nor 130 (a signal, the final checkpoint written): a job scheduler that requeues
# a preempted run may want to know that the newest checkpoint is older than the stop.
CHECKPOINT_NOT_WRITTEN = 3


@dataclasses.dataclass(frozen=True)
class Ending:
    """How a platform's program ended, once it has stopped and saved its final checkpoint.

    Attributes:
      exit_code: 0 at the budget or the return target, 1 on a node's error, 130 on a signal,
        `CHECKPOINT_NOT_WRITTEN` (3) where the final checkpoint could not be written in time.
      started: when the session's clock starts (`time.monotonic()`): the launch, or for
        anakin the process's start (imports and compilation are part of its time).
      fields: the platform's own summary fields (node restarts and start-up times; a
        population's members and steady rate).
      error: the failed node and its error, on an error.
    """

    exit_code: int
    started: float
    fields: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    error: str | None = None


class Execution(Protocol):
    """A program running on one platform, as the session drives it."""

    def advance(self, timeout_s: float) -> Report | None:
        """Runs for up to about `timeout_s`; the newest counters, or None if none came.

        A report with `stopped_by` set is the last: the program has stopped.
        """
        ...

    def checkpoint(self) -> None:
        """Checkpoints soon (the session's timer)."""
        ...

    def stop(self) -> Report:
        """Stops the program now (a signal, the caller's `on_stats`); the last report."""
        ...

    def finish(self) -> Ending:
        """After the last report: the final checkpoint, closing what is open."""
        ...
