"""The `local_mp` platform: every node is an OS process, forked from multiprocessing's fork
server (`spawn` where there is none; never forked from the launcher, which may run JAX).

The fork server is a fresh interpreter that imports this module and the program's `preload`
modules once (the env worker's: numpy, Gymnasium), and forks a node process per request, so
that 32 env workers do not each start an interpreter and import them: on 2 cores a spawned
worker took 0.24 s of CPU to reach its node's code, a forked one 0.05 s. It is started by the
first local_mp launch of a process and serves every later one; so that a node sees the
launcher's environment as it is now, not as it was then, each node process takes the
launcher's `os.environ` first thing.

Launcher side: each service node gets a socket bound to a free port of 127.0.0.1, on which it
listens once it serves (so that no other server takes the port while it starts), and every node
the program's random secret, its pickled arguments, the write end of a status pipe, the shared stop
event and the read end of a lifeline (a pipe the launcher never writes to). The launcher waits
on all status pipes and process sentinels at once, so a message or a death is noticed at once.
A process that dies without reporting is an error of its node.

Child side (`child_main`): take the launcher's environment and the group's priority, ignore
SIGINT, SIGQUIT and SIGTERM (Ctrl-C and Ctrl-\\ reach the whole process group, and so does a
scheduler's SIGTERM: SLURM's scancel, a pod's stop, `kill -TERM -PGID`; the launcher
coordinates the stop, so the learner writes its final checkpoint), exit when the lifeline ends
(the launcher is gone), serve, run, report. The fork server, started with them blocked, keeps
them blocked: it outlives such a signal too (its death would read as every node's).

A node the launcher restarts gets a new process from its kept payload, at the same address (the
old process is gone first, so its port can be bound again).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing import reduction, resource_tracker
from typing import Any

from trellis.launch.runtime import program as program_lib
from trellis.launch.runtime import rpc
from trellis.launch.runtime.node_context import NodeContext, Status

_HOST = "127.0.0.1"
_SECRET_BYTES = 32
# How long a restarted node's old process gets to exit by itself before it is killed.
_EXIT_WAIT_S = 1.0
# Signals sent to a whole process group (a terminal's Ctrl-C and Ctrl-\, a scheduler's or a
# container's SIGTERM to every process of a job): nodes leave them to the launcher, which stops
# the program as it does when it alone gets one.
_GROUP_SIGNALS = (signal.SIGINT, signal.SIGQUIT, signal.SIGTERM)


@dataclasses.dataclass
class _Child:
    label: str
    process: multiprocessing.process.BaseProcess
    reader: multiprocessing.connection.Connection | None
    exit_ok_after_finish: bool  # a PyNode's process ends with its function
    ended: bool = False  # may exit now: reported an error, or a PyNode reported "finished"
    exited: bool = False  # exit noticed


class Backend:
    """Runs each node of `program` in a process of its own."""

    def __init__(self, program: program_lib.Program):
        self._program = program
        self._context = _start_context(program.preload)
        self._children: list[_Child] = []
        self._stop_reader: multiprocessing.connection.Connection | None = None
        self._stop_writer: multiprocessing.connection.Connection | None = None
        self._lifeline: multiprocessing.connection.Connection | None = None
        self._lifeline_writer: multiprocessing.connection.Connection | None = None
        self._payloads: dict[str, bytes] = {}
        self._stopping = False

    def start(self) -> None:
        nodes = self._program.nodes
        secret = os.urandom(_SECRET_BYTES)
        sockets = {node.label: rpc.reserve_port(_HOST) for node in nodes if node.serves_rpcs}
        try:
            for node in nodes:
                node.address = (
                    rpc.TcpAddress(_HOST, sockets[node.label].getsockname()[1], secret)
                    if node.serves_rpcs else None)
            # Pickle every node before starting any: a bad argument fails the launch, not a node.
            self._payloads = {node.label: program_lib.pickle_node(node) for node in nodes}
            # The launcher keeps a read end too, for the processes of restarted nodes.
            self._stop_reader, self._stop_writer = self._context.Pipe(duplex=False)
            self._lifeline, self._lifeline_writer = self._context.Pipe(duplex=False)
            for node in nodes:
                self._children.append(self._spawn(node, sockets.pop(node.label, None),
                                                  restarts=0))
        finally:
            for sock in sockets.values():  # of nodes not started: the launch failed
                sock.close()

    def restart(self, label: str, restarts: int) -> None:
        index = next(i for i, c in enumerate(self._children) if c.label == label)
        old = self._children[index]
        # The old process reported its error and is exiting, or is dead already; it must be
        # gone before the new one binds the node's port.
        old.process.join(_EXIT_WAIT_S)
        if old.process.is_alive():
            old.process.kill()
            old.process.join()
        if old.reader is not None:
            old.reader.close()
        old.process.close()
        node = next(n for n in self._program.nodes if n.label == label)
        address = node.address
        sock = (rpc.reserve_port(address.host, address.port)
                if isinstance(address, rpc.TcpAddress) else None)
        self._children[index] = self._spawn(node, sock, restarts)

    def _spawn(self, node: program_lib.Node, sock: socket.socket | None,
               restarts: int) -> _Child:
        """Starts `node`'s process, handing it `sock` (bound to its address; closed here)."""
        reader, writer = self._context.Pipe(duplex=False)
        assert self._stop_reader is not None and self._lifeline is not None
        priority = (min(19, os.getpriority(os.PRIO_PROCESS, 0) + node.nice) if node.nice
                    else None)
        process = self._context.Process(
            target=child_main,
            args=(node.label, node.address, sock, self._payloads[node.label], writer,
                  PipeStopEvent(self._stop_reader), self._lifeline, _Stdio(), dict(os.environ),
                  priority, restarts),
            name=f"trellis:{node.label}",
        )
        # The fork server, started by the first start, and through it every node process
        # start with the signals blocked too. multiprocessing's resource tracker, which the
        # first start would start, unblocks SIGINT and SIGTERM in the calling thread when it
        # starts (it blocks them around its spawn, then unblocks instead of restoring): it is
        # started before, so that the fork server does not die of a SIGTERM sent to the group.
        resource_tracker.ensure_running()
        try:
            with _blocking(_GROUP_SIGNALS):
                process.start()
        finally:
            # Drop our copies: the child's exit reads as EOF here, and its port is its own.
            writer.close()
            if sock is not None:
                sock.close()
        return _Child(node.label, process, reader, exit_ok_after_finish=not node.serves_rpcs)

    def poll(self, timeout_s: float) -> list[Status]:
        waitables: list[multiprocessing.connection.Connection | int] = [
            c.reader for c in self._children if c.reader is not None]
        waitables += [c.process.sentinel for c in self._children if not c.exited]
        if not waitables:
            time.sleep(timeout_s)
            return []
        ready = set(multiprocessing.connection.wait(waitables, timeout_s))
        statuses: list[Status] = []
        for child in self._children:
            if child.reader is not None and child.reader in ready:
                statuses += self._drain(child)
        for child in self._children:
            if not child.exited and child.process.sentinel in ready:
                child.exited = True
                # Whatever it sent before dying is already in the pipe: read it first.
                statuses += self._drain(child)
                child.process.join()
                if not self._stopping and not child.ended:
                    statuses.append(self._death_status(child))
        return statuses

    def _drain(self, child: _Child) -> list[Status]:
        statuses = []
        while child.reader is not None and child.reader.poll():
            try:
                status = child.reader.recv()
            except (EOFError, OSError):
                child.reader.close()
                child.reader = None
                break
            if status.kind == "error" or (status.kind == "finished" and child.exit_ok_after_finish):
                child.ended = True
            statuses.append(status)
        return statuses

    @staticmethod
    def _death_status(child: _Child) -> Status:
        code = child.process.exitcode
        how = f"exit code {code}"
        if code is not None and code < 0:
            how += f" ({signal.Signals(-code).name})"
        return Status(
            "error",
            child.label,
            reason=f"process {child.process.pid} exited unexpectedly with {how}",
        )

    def shutdown(self, timeout_s: float, on_status: Callable[[Status], None]) -> list[str]:
        self._stopping = True
        for node in self._program.nodes:
            if node.address is not None:
                rpc.mark_stopped(node.address)
        if self._stop_writer is not None:
            self._stop_writer.close()  # sets every child's PipeStopEvent
            self._stop_writer = None
        if self._stop_reader is not None:
            self._stop_reader.close()
            self._stop_reader = None
        deadline = time.monotonic() + timeout_s
        while any(not c.exited for c in self._children):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            for status in self.poll(min(remaining, 0.1)):
                on_status(status)
        stuck = [c for c in self._children if c.process.is_alive()]
        if stuck:
            print(
                f"[launch] killing node(s) that did not stop within {timeout_s:g} s: "
                f"{', '.join(c.label for c in stuck)}",
                file=sys.stderr,
                flush=True,
            )
        # SIGKILL at once: nodes ignore SIGTERM (`_GROUP_SIGNALS`), and without a handler of
        # its own a process ends on SIGTERM no more cleanly than on SIGKILL.
        for child in self._children:
            if child.process.is_alive():
                child.process.kill()
            child.process.join()
            if child.reader is not None:
                child.reader.close()
                child.reader = None
            child.process.close()
        for end in (self._lifeline, self._lifeline_writer):
            if end is not None:
                end.close()
        self._lifeline = self._lifeline_writer = None
        return [child.label for child in stuck]


def _start_context(preload: tuple[str, ...]) -> (multiprocessing.context.ForkServerContext
                                                  | multiprocessing.context.SpawnContext):
    """multiprocessing's fork server, importing this module and `preload` before it forks
    (where a fork server has started already, it keeps what it imported), or `spawn`."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__, *preload])
    return context


class _Stdio:
    """Pickled into a node process's arguments: the launcher's stdout and stderr, as they are
    at the node's start."""

    def __reduce__(self) -> tuple[Any, ...]:
        return _InheritedStdio, (reduction.DupFd(1), reduction.DupFd(2))


class _InheritedStdio:
    """In a node process: the launcher's stdout and stderr, until `take` makes them this
    process's file descriptors 1 and 2."""

    def __init__(self, out: Any, err: Any):
        self._fds = (out, err)

    def take(self) -> None:
        for target, fd in enumerate(self._fds, start=1):
            source = fd.detach()
            if source != target:  # (A spawned process gets them as they are.)
                os.dup2(source, target)
                os.close(source)


class PipeStopEvent:
    """The program's stop event in a node process: set when the launcher closes the pipe.

    Not `multiprocessing.Event`: its condition variable counts sleepers, so a node killed while
    waiting (kill -9, OOM) makes the launcher's `set()` block forever. A pipe has no shared
    state; closing its write end wakes every reader, and so does the launcher's death.
    """

    def __init__(self, reader: multiprocessing.connection.Connection):
        self._reader = reader

    def is_set(self) -> bool:
        return self._reader.poll(0)

    def wait(self, timeout: float | None = None) -> bool:
        return self._reader.poll(timeout)


def child_main(
    label: str,
    address: rpc.TcpAddress | None,
    sock: socket.socket | None,
    payload: bytes,
    writer: multiprocessing.connection.Connection,
    stop_event: PipeStopEvent,
    lifeline: multiprocessing.connection.Connection,
    stdio: _InheritedStdio,
    environ: dict[str, str],
    priority: int | None,
    restarts: int = 0,
) -> None:
    """Entry point of a node process (forked by the fork server, or spawned).

    Args:
      label: the node's label.
      address: where to serve RPCs (service nodes), else None.
      sock: a socket bound to `address` (service nodes), else None.
      payload: the pickled node (see `program.pickle_node`).
      writer: write end of the status pipe to the launcher.
      stop_event: the program's shared stop event.
      lifeline: read end of a pipe only the launcher writes to (it never does): its end
        means the launcher is gone, and the node exits.
      stdio: the launcher's stdout and stderr, the node's own (a forked process would write
        where the fork server's went: the launcher's when the server started).
      environ: the launcher's environment variables, the node's own (the fork server's are
        those of its start).
      priority: the process's nice value (its group's `nice`), or None to keep the launcher's.
      restarts: how many times the launcher restarted this node before (see
        `launch.restart_count`).
    """
    if priority is not None:
        # First: a nice group's start (its imports, the envs it makes) must not take the cores
        # at the launcher's priority (14 env workers doing so put off the learner's first
        # program from 0.87 s to 2.31 s on 2 cores; docs/benchmarks.md).
        os.setpriority(os.PRIO_PROCESS, 0, priority)
    stdio.take()
    os.environ.clear()
    os.environ.update(environ)
    # Set before unpickling: the node's imports may look at it (e.g. to pick log files).
    os.environ["TRELLIS_NODE_LABEL"] = label
    # Several nodes of one host may each put JAX on its accelerator: none may take most of the
    # device memory up front (XLA's default, 75%), or the next one cannot start cleanly.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    _name_process(label)
    # The launcher coordinates Ctrl-C and Ctrl-\. Ignoring them drops any that came while this
    # process started, blocked since its spawn (`_blocking`); then they may be unblocked.
    for signum in _GROUP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _GROUP_SIGNALS)
    threading.Thread(
        target=_exit_when_orphaned, args=(label, lifeline), name="orphan-watchdog", daemon=True
    ).start()

    lock = threading.Lock()

    def report(status: Status) -> None:
        with lock:  # any thread of the node may report
            try:
                writer.send(status)
            except OSError:
                pass  # the launcher is gone; the watchdog ends this process

    context = NodeContext(label, stop_event, report, restarts)
    ok = program_lib.execute_in_process(payload, context, address, sock)
    writer.close()
    code = 0 if ok else 1
    # The orderly part of Python's exit still runs (multiprocessing runs its finalizers, joins
    # the non-daemon threads, such as the inference server's, and flushes stdio); registered
    # last, `_end_process` is the first exit handler and ends the process before the
    # interpreter finalizes, so the handlers registered before it (JAX's backend teardown
    # among them) do not run. Finalizing is what aborted node processes with "terminate
    # called after throwing an instance of '' / FATAL: exception not rethrown" (issue 20): a
    # daemon thread still inside native code (an RPC call in a jitted function past
    # `TcpServer.close`'s bound, a library's thread) is unwound by pthread_exit as it takes
    # the GIL back, through C++ frames that catch it (tests/test_native_abort.py forces both).
    # os._exit ends every thread at once, without unwinding, and runs no C++ static destructor
    # under XLA's threads either.
    atexit.register(_end_process, code)
    sys.exit(code)


def _end_process(code: int) -> None:
    logging.shutdown()  # Flushes log handlers: logging's own exit handler is skipped.
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # A closed or broken stream has nothing to flush.
            stream.flush()
    os._exit(code)


def _name_process(label: str) -> None:
    # Every node process has the same command line (spawn's, or the fork server's); its name
    # tells them apart in `ps -o comm`, `top` and benchmarks/soak.py. Linux only (elsewhere
    # there is no file).
    with contextlib.suppress(OSError), open("/proc/self/comm", "w") as f:
        f.write(label[:15])  # The kernel keeps at most 15 bytes.


def _exit_when_orphaned(label: str, lifeline: multiprocessing.connection.Connection) -> None:
    # The lifeline reads as ready only at its end: the launcher closed it after this process
    # ended, or died. (Not the parent's pid: a forked node's parent is the fork server, which
    # outlives a SIGKILLed launcher while nodes hold its own lifeline. Not PR_SET_PDEATHSIG: it
    # fires when the *thread* that started the child exits.)
    lifeline.poll(None)
    print(f"[launch] node '{label}': the launcher is gone; exiting", file=sys.stderr, flush=True)
    os._exit(1)


@contextlib.contextmanager
def _blocking(signals: tuple[signal.Signals, ...]) -> Iterator[None]:
    """Blocks `signals` in the calling thread while inside; processes spawned meanwhile start
    with them blocked (a thread's signal mask survives fork and exec).

    So a Ctrl-C that reaches the process group while a child still imports (before
    `child_main` ignores it) stays pending there instead of killing it. Only the mask, never the
    process-wide disposition, changes: the launcher keeps its handlers, and a signal sent to it
    now is either taken by another of its threads or delivered here on leaving. (Issue 20: with
    SIGINT set to SIG_IGN during spawns, a Ctrl-C taken by another thread, such as TensorBoard's
    writer, was lost and the launcher ran on.)
    """
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
