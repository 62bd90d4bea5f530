"""The `local_mt` platform: every node is a thread of the launching process.

Node arguments still make a cloudpickle round trip, so a program that works here works across
processes. Clients call the target instance directly (no socket) with the same semantics as the
TCP clients. Threads cannot be killed: a node that ignores the stop event is left running (as a
daemon thread) after `stop_timeout_s`, with a warning.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from trellis.launch.runtime import node_context, rpc
from trellis.launch.runtime import program as program_lib
from trellis.launch.runtime.node_context import NodeContext, Status, drain


class Backend:
    """Runs each node of `program` in a daemon thread."""

    def __init__(self, program: program_lib.Program):
        self._program = program
        self._stop_event = threading.Event()
        self._statuses: queue.SimpleQueue[Status] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._addresses: list[rpc.Address] = []
        self._payloads: dict[str, bytes] = {}
        self._process_context: NodeContext | None = None

    def start(self) -> None:
        nodes = self._program.nodes
        token = uuid.uuid4().hex[:8]
        for node in nodes:
            node.address = (
                rpc.InprocAddress(f"{self._program.name}/{token}/{node.label}")
                if node.serves_rpcs
                else None
            )
        # Pickle every node before starting any: a bad argument fails the launch, not a node.
        self._payloads = {node.label: program_lib.pickle_node(node) for node in nodes}
        # Threads a node starts itself have no thread context; let them find this program's,
        # unless another program already claimed the process.
        if node_context.process_context() is None:
            self._process_context = NodeContext(
                f"{self._program.name}(local_mt)", self._stop_event, self._statuses.put
            )
            node_context.bind_process(self._process_context)
        for node in nodes:
            self._start_thread(node, restarts=0)
            if node.address is not None:
                self._addresses.append(node.address)

    def restart(self, label: str, restarts: int) -> None:
        # The failed node's thread has reported its error and is returning; the new one
        # serves at the same address, replacing the old instance for callers.
        node = next(n for n in self._program.nodes if n.label == label)
        self._start_thread(node, restarts)

    def _start_thread(self, node: program_lib.Node, restarts: int) -> None:
        thread = threading.Thread(
            target=self._run_node,
            args=(node.label, node.address, self._payloads[node.label], restarts),
            name=f"node:{node.label}",
            daemon=True,
        )
        thread.start()
        self._threads.append(thread)

    def _run_node(
        self, label: str, address: rpc.InprocAddress | None, payload: bytes, restarts: int
    ) -> None:
        context = NodeContext(label, self._stop_event, self._statuses.put, restarts)
        node_context.bind_thread(context)

        def serve(instance: Any) -> None:
            assert address is not None, f"node '{label}' serves RPCs but has no address"
            rpc.serve_inproc(address, instance, context)

        program_lib.execute(payload, context, serve)

    def poll(self, timeout_s: float) -> list[Status]:
        return drain(self._statuses, timeout_s)

    def shutdown(self, timeout_s: float, on_status: Callable[[Status], None]) -> list[str]:
        self._stop_event.set()
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        for status in self.poll(0.0):
            on_status(status)
        # Closed after the joins: stopping nodes may still call their peers.
        for address in self._addresses:
            rpc.mark_stopped(address)
        if self._process_context is not None and node_context.process_context() is (
            self._process_context
        ):
            node_context.bind_process(None)
        stuck = [thread.name.removeprefix("node:") for thread in self._threads
                 if thread.is_alive()]
        if stuck:
            print(
                f"[launch] {len(stuck)} node thread(s) of program '{self._program.name}' did not "
                f"return within {timeout_s:g} s of the stop event and are left running: "
                f"{', '.join(stuck)}",
                file=sys.stderr,
                flush=True,
            )
        return stuck
