"""Node classes and functions for tests/test_launch.py.

A module of its own so that spawned node processes can import them by name. Stdlib only: every
spawned test node imports it, and the tests must stay fast.
"""

from __future__ import annotations

import gc
import os
import sys
import time

from trellis.launch import runtime


class ProcessView:
    """Its process as the node sees it: the nice value when it was constructed, and the
    environment."""

    def __init__(self):
        self._priority_at_start = os.getpriority(os.PRIO_PROCESS, 0)

    def priority_at_start(self) -> int:
        return self._priority_at_start

    def environ(self, name: str) -> str | None:
        return os.environ.get(name)


class Echo:
    """A service node without a run loop."""

    def __init__(self, offset: int = 0):
        self._offset = offset
        self._sleeping = 0

    def add(self, a, b):
        return a + b + self._offset

    def echo(self, value):
        return value

    def pid(self) -> int:
        return os.getpid()

    def niceness(self) -> int:
        """The calling thread's (Linux keeps one per thread; threads start with their
        creator's)."""
        return os.nice(0)

    def labels(self) -> tuple[str | None, str | None]:
        return runtime.node_label(), os.environ.get("TRELLIS_NODE_LABEL")

    def environ(self, name: str) -> str | None:
        """The node process's environment entry `name` (None if unset)."""
        return os.environ.get(name)

    def fail(self, message: str):
        raise ValueError(message)

    def sleep(self, seconds: float) -> float:
        self._sleeping += 1
        time.sleep(seconds)
        return seconds

    def sleeping(self) -> int:
        return self._sleeping

    def _secret(self):  # private: must not be callable by RPC
        return "secret"


class SlowEcho(Echo):
    """An `Echo` that takes `seconds` to construct (as a learner tracing its programs)."""

    def __init__(self, seconds: float):
        time.sleep(seconds)
        super().__init__()


class Caller:
    """Gets handles nested in a list, a dict and a tuple; calls through the clients."""

    def __init__(self, peers, named, scale, transform=None):
        self._peers = peers
        self._named = named
        self._scale = scale
        self._transform = transform

    def sums(self, a, b) -> list:
        """Sync calls to every peer, then futures calls, then the nested ones."""
        sync = [peer.add(a, b) for peer in self._peers]
        futures = [peer.futures.add(a, b) for peer in self._peers]
        nested = [self._named["first"].add(a, b), self._named["nested"][0][0].add(a, b)]
        return sync + [f.result(timeout=30) for f in futures] + nested

    def scaled(self, value):
        value = value * self._scale
        return self._transform(value) if self._transform is not None else value


class Runner:
    """Writes its pid to `pid_dir` (if given), then loops until the program stops."""

    def __init__(self, pid_dir: str | None = None, label: str = "runner"):
        if pid_dir is not None:
            with open(os.path.join(pid_dir, f"{label}.pid"), "w") as f:
                f.write(str(os.getpid()))

    def pid(self) -> int:
        return os.getpid()

    def ping(self) -> str:
        return "pong"

    def run(self) -> None:
        while not runtime.stop_event().wait(0.02):
            pass


class FailingRun:
    """run() waits until its peer serves, then raises."""

    def __init__(self, peer=None):
        self._peer = peer

    def ping(self) -> str:
        return "pong"

    def run(self) -> None:
        if self._peer is not None:
            self._peer.ping()
        raise ValueError("boom in run")


class Flaky:
    """Fails its first `failures` runs (raising, or killing its own process), then asks to stop.

    Each run appends its pid and restart count to `log` (one line per run), so a test sees
    every incarnation.
    """

    def __init__(self, log: str, failures: int, kill: bool = False):
        restarts = runtime.restart_count()
        with open(log, "a") as f:
            f.write(f"{os.getpid()} {restarts}\n")
        self._fail = restarts < failures
        self._kill = kill

    def run(self) -> None:
        if not self._fail:
            runtime.request_stop("recovered", {"restarts": runtime.restart_count()})
            runtime.stop_event().wait(30)
        elif self._kill:
            os.kill(os.getpid(), 9)
        else:
            raise ValueError(f"flaky run {runtime.restart_count()}")


class RayPlacement:
    """Says which Ray node it runs on (imports Ray only when asked: platform "ray" only)."""

    def node_id(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()


class FailingInit:
    def __init__(self):
        raise RuntimeError("boom in constructor")


class Stopper:
    """Asks the program to stop, as a learner does at the end of its budget."""

    def run(self) -> None:
        runtime.request_stop("budget reached", {"steps": 3})
        runtime.stop_event().wait(30)


class FinalCounts:
    """Counts until the program stops, then sends its count, as the learner sends its final
    counts however the program stopped."""

    def run(self) -> None:
        count = 0
        while not runtime.stop_requested():
            count += 1
            time.sleep(0.01)
        runtime.report_final({"count": count})


class PidPrinter:
    """Prints "PID <pid>" (for launcher scripts run as subprocesses), then loops until stopped."""

    def run(self) -> None:
        _print_pid()
        while not runtime.stop_requested():
            time.sleep(0.02)


def _print_pid() -> None:
    # One write of the whole line: two nodes' lines must not interleave in the shared pipe
    # ("PID 16217PID 16218" was read once on a loaded machine).
    sys.stdout.flush()
    os.write(sys.stdout.fileno(), f"PID {os.getpid()}\n".encode())


def print_pid_and_wait() -> None:
    _print_pid()
    runtime.stop_event().wait()


def print_pid_and_ignore_the_stop() -> None:
    """A node stuck where it never looks at the stop event (a long native call, say)."""
    _print_pid()
    time.sleep(600)


def return_at_once() -> None:
    return None


# A launcher script for the signal tests: run with `python -c`, prints node pids and the result.
SIGNAL_SCRIPT = """
import sys
from trellis.launch import runtime
from tests import launch_nodes

program = runtime.Program("signals")
program.add_node(runtime.CourierNode(launch_nodes.PidPrinter), label="printer")
program.add_node(runtime.PyNode(launch_nodes.print_pid_and_wait), label="waiter")
result = runtime.launch(program, platform="local_mp", stop_timeout_s=5.0)
print("RESULT", result.stopped_by, result.reason, flush=True)
sys.exit(result.exit_code)
"""


# A launcher of one node that never looks at the stop event: only the watchdog can end it.
STUCK_SCRIPT = """
from trellis.launch import runtime
from tests import launch_nodes

program = runtime.Program("stuck")
program.add_node(runtime.PyNode(launch_nodes.print_pid_and_ignore_the_stop), label="stuck")
runtime.launch(program, platform="local_mp")
"""


def say(line: str) -> None:
    print(line, flush=True)


def wait_for_stop(blob: bytes) -> None:
    """Waits until the program stops; `blob` only makes the node's payload large."""
    del blob
    runtime.stop_event().wait()


# Launcher script for a signal during start-up: many nodes whose large payloads make every spawn
# wait until its child reads them, so start-up takes a while; plus an idle thread, as in run.py
# (TensorBoard's writer): a signal can be delivered to any thread that does not block it.
STARTUP_NODES = 6
STARTUP_SIGNAL_SCRIPT = f"""
import sys, threading
from trellis.launch import runtime
from tests import launch_nodes

threading.Thread(target=threading.Event().wait, name="idle", daemon=True).start()
program = runtime.Program("startup")
for i in range({STARTUP_NODES}):
    program.add_node(runtime.PyNode(launch_nodes.wait_for_stop, bytes(4 << 20)), label=f"n{{i}}")
result = runtime.launch(program, platform="local_mp", stop_timeout_s=5.0)
print("RESULT", result.stopped_by, result.reason, flush=True)
sys.exit(result.exit_code)
"""


class GarbageCollector:
    """Reports Python's garbage collector as the node saw it while constructed and now."""

    def __init__(self):
        self._while_constructed = gc.isenabled()

    def collector(self):
        return {"while_constructed": self._while_constructed, "now": gc.isenabled(),
                "frozen": gc.get_freeze_count()}
