"""Helpers shared by the benchmark scripts (run as `python benchmarks/NAME.py`)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator, Sequence
from typing import Any

# How long a child (run.py) gets to stop cleanly after SIGTERM before its group is killed: its
# final checkpoint and summary.json.
STOP_GRACE_S = 30.0


def rounded(value):
    """Floats in nested dicts and lists rounded to 0.1, for the one-line JSON benchmarks print."""
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [rounded(v) for v in value]
    return round(value, 1) if isinstance(value, float) else value


def cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    del frame
    raise SystemExit(128 + signum)


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # The group is empty.
        os.killpg(pgid, sig)


def stop_group(process: subprocess.Popen, grace_s: float = STOP_GRACE_S) -> None:
    """Stops `process` and the rest of its process group: SIGTERM to `process` while it runs
    (run.py then stops its nodes and writes its summary; SIGTERM, unlike SIGINT, is not
    ignored by a child of a background job); then, after `grace_s` or at a second
    interruption, SIGKILL to whatever is left of the group."""
    try:
        if process.poll() is None:
            process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=grace_s)
    finally:
        _signal_group(process.pid, signal.SIGKILL)
        process.wait()


@contextlib.contextmanager
def child_process(command: Sequence[str], grace_s: float = STOP_GRACE_S,
                  **popen_kwargs: Any) -> Iterator[subprocess.Popen]:
    """`subprocess.Popen(command, **popen_kwargs)` in a process group of its own, which is
    stopped (`stop_group`) however the block is left, so that a benchmark that is stopped
    leaves no run behind: neither its child nor the child's own processes (a local_mp run's
    nodes join the group).

    Inside, SIGTERM to the benchmark raises SystemExit(143): Python's default would end the
    benchmark at once, without this cleanup. A Ctrl-C at the terminal reaches the benchmark
    only (the child's group is not the terminal's): its KeyboardInterrupt stops the child.
    Either signal, arriving while `Popen` has started the child but not yet returned it, is
    held until the child is in hand: raised inside `Popen`, it would lose the child.
    """
    pending: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, frame: pending.append(signum))
                for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        process = subprocess.Popen(command, start_new_session=True, **popen_kwargs)
        try:
            signal.signal(signal.SIGTERM, _exit_on_sigterm)
            signal.signal(signal.SIGINT, previous[signal.SIGINT])
            for sig in pending:
                signal.raise_signal(sig)
            yield process
        finally:
            stop_group(process, grace_s)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_child(command: Sequence[str], check: bool = False, capture_output: bool = False,
              **popen_kwargs: Any) -> subprocess.CompletedProcess:
    """`subprocess.run`'s subset the benchmarks use, through `child_process`: the child and
    its group are stopped if the benchmark is interrupted or terminated while it runs.

    Raises:
      subprocess.CalledProcessError: `check` and the child exited with a non-zero code.
    """
    if capture_output:
        popen_kwargs.update(stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    with child_process(command, **popen_kwargs) as process:
        stdout, stderr = process.communicate()
    if check and process.returncode:
        raise subprocess.CalledProcessError(process.returncode, command, stdout, stderr)
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)
