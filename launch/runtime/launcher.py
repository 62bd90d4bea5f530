"""`launch()`: runs a program on a platform and decides how it ended.

The platform-independent part lives here: a monitor thread reads the nodes' `Status` messages,
decides the `LaunchResult` from the first decisive event (an error, a stop request, every run loop
finished, a signal or `stop()`), then has the platform stop every node. A failed node whose group
allows restarts (`Program.group(..., max_restarts=N)`) is restarted instead, up to N times.
Platforms (`local_mt`, `local_mp`) only start, restart and stop nodes and deliver their messages.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any, Protocol

from trellis.launch.runtime.node_context import Status
from trellis.launch.runtime.program import Program

# Platform name -> module defining `Backend(program)`; imported only when used.
PLATFORMS = {"local_mt": "trellis.launch.runtime.local_mt",
             "local_mp": "trellis.launch.runtime.local_mp",
             "ray": "trellis.launch.runtime.ray_platform"}

_EXIT_CODES = {"requested": 0, "completed": 0, "error": 1, "signal": 130}
# Signals that stop a program cleanly. SIGQUIT too (Ctrl-\): its default, a core dump of the
# launcher alone, would leave the nodes to notice the launcher's death (issue 20).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT)
_POLL_S = 0.1


@dataclasses.dataclass(frozen=True)
class LaunchResult:
    """How a launched program ended.

    Attributes:
      stopped_by: "requested" (a node called `request_stop`), "completed" (every run loop and
        PyNode returned), "error" (a node raised or its process died), or "signal" (SIGINT,
        SIGTERM, SIGQUIT or `RunningProgram.stop()`).
      reason: the stop request's reason, "<node label>: <exception one-liner>", or the signal
        name ("SIGINT", "SIGTERM", "SIGQUIT", "stop() called").
      info: the stop request's info dict; where the program stopped otherwise, the info a node
        sent while it stopped (`report_final`, or a late `request_stop`); else {}.
      error_node: label of the node that failed, for "error".
      error_traceback: that node's traceback, for "error" (None when its process died silently).
      forced: labels of the nodes that did not end within the launch's `stop_timeout_s` once
        stopping began, and were killed (processes) or left running (threads): whatever they
        still had to do at their end (a final checkpoint) is not done.
    """

    stopped_by: str
    reason: str
    info: dict[str, Any] = dataclasses.field(default_factory=dict)
    error_node: str | None = None
    error_traceback: str | None = None
    forced: tuple[str, ...] = ()

    @property
    def exit_code(self) -> int:
        """Process exit code for a command line: 0 requested/completed, 1 error, 130 signal."""
        return _EXIT_CODES[self.stopped_by]


class Backend(Protocol):
    """What a platform provides. Only the monitor thread calls `poll` and `shutdown`."""

    def start(self) -> None:
        """Gives nodes their addresses and starts them; raises if a node cannot be started."""

    def poll(self, timeout_s: float) -> list[Status]:
        """Waits up to `timeout_s` for node messages (a process that died silently is one)."""

    def restart(self, label: str, restarts: int) -> None:
        """Runs node `label`, which failed, again; its code sees `restart_count() == restarts`."""

    def shutdown(self, timeout_s: float, on_status: Callable[[Status], None]) -> list[str]:
        """Sets the stop event, waits up to `timeout_s` for nodes to end, then forces them;
        returns the labels of those it forced."""


class RunningProgram:
    """A launched program. Use `wait()`, `stop()`, or `with launch.launch(..., block=False):`."""

    def __init__(self, program: Program, backend: Backend, stop_timeout_s: float):
        self.program = program
        self._backend = backend
        self._stop_timeout_s = stop_timeout_s
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._result: LaunchResult | None = None
        # Set by signal handlers: a plain attribute store, safe whatever the main thread holds.
        self._signal_name: str | None = None
        self._not_ready = {node.label for node in program.nodes}
        self._running: set[str] = set()
        self._has_run_loops = False
        self._nodes = {node.label: node for node in program.nodes}
        self._restarts: dict[str, int] = {}
        self._monitor = threading.Thread(
            target=self._monitor_loop, name=f"launch-monitor:{program.name}", daemon=True
        )

    def wait(self, timeout: float | None = None) -> LaunchResult | None:
        """Waits until the program has stopped and every node is gone.

        Called in the main thread, SIGINT, SIGTERM and SIGQUIT stop the program meanwhile.

        Args:
          timeout: seconds to wait; None waits until the program stops.

        Returns:
          The result, or None if the program is still running after `timeout`.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with _stop_on_signals(self):
            # Short waits keep the main thread responsive to signals on every Python.
            while True:
                step = _POLL_S if deadline is None else deadline - time.monotonic()
                if self._done.wait(max(0.0, min(_POLL_S, step))):
                    return self._result
                if deadline is not None and time.monotonic() >= deadline:
                    return None

    def stop(self) -> LaunchResult:
        """Stops every node (if still running) and returns the result."""
        self._decide(LaunchResult("signal", "stop() called"))
        result = self.wait()
        assert result is not None
        return result

    def stop_on_signals(self) -> contextlib.AbstractContextManager[None]:
        """Inside (in the main thread; elsewhere a no-op), SIGINT, SIGTERM and SIGQUIT stop the
        program, as they do while `wait()` waits.

        A host loop that does more than wait (logging, RPCs) should run inside: there Ctrl-C
        sets a flag instead of raising KeyboardInterrupt at an arbitrary point of library
        code, which can leave that code broken. (Issue 14: raised inside tensorboardX's
        add_scalar, it left the lock of the writer's queue held; the writer's close() then
        waited forever and run.py never returned.)
        """
        return _stop_on_signals(self)

    def is_running(self) -> bool:
        """True until every node has been stopped."""
        return not self._done.is_set()

    @property
    def restarts(self) -> dict[str, int]:
        """Node label -> how many times the node was restarted after failing (so far)."""
        return dict(self._restarts)

    @property
    def result(self) -> LaunchResult | None:
        """The result once the program has stopped, else None."""
        return self._result if self._done.is_set() else None

    def __enter__(self) -> RunningProgram:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _start(self) -> None:
        try:
            self._backend.start()
        except BaseException:
            self._backend.shutdown(self._stop_timeout_s, lambda status: None)
            self._done.set()
            raise
        self._monitor.start()

    def _monitor_loop(self) -> None:
        try:
            while self._result is None:
                statuses = self._backend.poll(_POLL_S)
                if self._signal_name is not None:
                    self._decide(LaunchResult("signal", self._signal_name))
                for status in statuses:
                    self._on_status(status)
        except BaseException:
            # A launcher bug must still stop the nodes; report it like a node error.
            self._decide(
                LaunchResult("error", "launcher monitor failed", {}, "<launcher>",
                             traceback.format_exc())
            )
            print(f"[launch] the launcher monitor failed:\n{traceback.format_exc()}",
                  file=sys.stderr, flush=True)
        finally:
            try:
                forced = self._backend.shutdown(self._stop_timeout_s, self._on_status)
                if forced and self._result is not None:
                    self._result = dataclasses.replace(self._result, forced=tuple(forced))
            finally:
                self._done.set()

    def _decide(self, result: LaunchResult) -> bool:
        """Records `result` if none was decided yet; returns whether it was recorded."""
        with self._lock:
            if self._result is not None:
                return False
            self._result = result
            return True

    def _add_info(self, info: dict[str, Any]) -> None:
        """Gives a result decided otherwise (a signal, an error) `info` where it has none: a
        late stop request's, or a node's final counts (`report_final`)."""
        with self._lock:
            if self._result is not None and not self._result.info and info:
                self._result = dataclasses.replace(self._result, info=info)

    def _on_status(self, status: Status) -> None:
        label = status.label
        if status.kind == "ready":
            self._not_ready.discard(label)
            if status.runs:
                self._running.add(label)
                self._has_run_loops = True
        elif status.kind == "finished":
            self._running.discard(label)
        elif status.kind == "stop_request":
            if not self._decide(LaunchResult("requested", status.reason, dict(status.info or {}))):
                self._add_info(dict(status.info or {}))
        elif status.kind == "final":
            self._add_info(dict(status.info or {}))
        elif status.kind == "error":
            self._on_error(status)
        # Completed once every node has started and every run loop has returned (checked on
        # "ready" too: a PyNode may finish before a slow service node reports).
        if self._has_run_loops and not self._running and not self._not_ready:
            self._decide(LaunchResult("completed", "every run loop finished"))

    def _on_error(self, status: Status) -> None:
        if self._maybe_restart(status):
            return
        result = LaunchResult(
            "error",
            f"{status.label}: {status.reason}",
            {},
            status.label,
            status.traceback or None,
        )
        if self._decide(result):
            details = status.traceback.rstrip() or status.reason
            print(
                f"[launch] node '{status.label}' failed; stopping program "
                f"'{self.program.name}':\n{details}",
                file=sys.stderr,
                flush=True,
            )
        elif not status.peer_gone:
            # Losing a peer is expected while stopping; anything else may be a second bug.
            print(
                f"[launch] node '{status.label}' also failed while stopping: {status.reason}",
                file=sys.stderr,
                flush=True,
            )


    def _maybe_restart(self, status: Status) -> bool:
        """Restarts the failed node if its group allows another restart; returns whether it did."""
        label = status.label
        restarts = self._restarts.get(label, 0)
        node = self._nodes.get(label)
        if self._result is not None or node is None or restarts >= node.max_restarts:
            return False
        self._restarts[label] = restarts + 1
        details = status.traceback.rstrip() or status.reason
        print(
            f"[launch] node '{label}' failed; restarting it (restart {restarts + 1} of "
            f"{node.max_restarts}):\n{details}",
            file=sys.stderr,
            flush=True,
        )
        # Until the new run reports "ready", the program can neither complete nor miss it.
        self._running.discard(label)
        self._not_ready.add(label)
        self._backend.restart(label, restarts + 1)
        return True


@contextlib.contextmanager
def _stop_on_signals(running: RunningProgram) -> Iterator[None]:
    """While inside, `STOP_SIGNALS` stop `running` (main thread only; else a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if running._signal_name is None:
            print(f"[launch] {name}: stopping program '{running.program.name}'",
                  file=sys.stderr, flush=True)
        running._signal_name = name

    previous = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def launch(
    program: Program,
    platform: str = "local_mp",
    *,
    block: bool = True,
    stop_timeout_s: float = 10.0,
    **platform_options: Any,
) -> LaunchResult | RunningProgram:
    """Launches `program` on `platform`.

    Args:
      program: the program graph.
      platform: "local_mp" (one process per node), "local_mt" (one thread per node) or
        "ray" (one Ray actor per node; needs the `ray` extra).
      block: wait until the program stops and return its `LaunchResult`; if False, return a
        `RunningProgram` at once.
      stop_timeout_s: when stopping, how long nodes get to return after the stop event is set.
        Processes still alive then are killed (local_mp's with SIGKILL: they ignore SIGTERM);
        threads cannot be killed and are left behind with a warning. Either way the result
        names them (`LaunchResult.forced`).
      **platform_options: passed to the platform's backend, e.g. `ray_address="auto"` on ray.

    Returns:
      The `LaunchResult` if `block`, else the `RunningProgram`.

    Raises:
      ValueError: for an unknown platform or an empty program.
      TypeError: if a node's arguments cannot be pickled.
    """
    if platform not in PLATFORMS:
        raise ValueError(
            f"unknown platform {platform!r}; valid platforms: {', '.join(sorted(PLATFORMS))}"
        )
    if not program.nodes:
        raise ValueError(f"program '{program.name}' has no nodes: add_node() before launching")
    backend = importlib.import_module(PLATFORMS[platform]).Backend(program, **platform_options)
    running = RunningProgram(program, backend, stop_timeout_s)
    # Handlers go in before the nodes start, so an early Ctrl-C still stops them all (also
    # without `block`: the monitor acts on it as soon as it runs).
    with _stop_on_signals(running):
        running._start()
        if not block:
            return running
        result = running.wait()
    assert result is not None
    return result
