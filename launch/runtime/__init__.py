"""Trellis's runtime: a Launchpad-style program graph, the bottom layer (docs/architecture.md).

This package exports `Program`, nodes, handles, RPC and the platforms `local_mt` (one thread
per node), `local_mp` (one process per node) and `ray` (one Ray actor per node, locally or on a
cluster; Ray is imported only then). It knows nothing of JAX or RL (`make lint` checks it). A
group may let its nodes be restarted after they fail: `program.group("actor", max_restarts=3)`.

    from trellis.launch import runtime
    result = runtime.launch(program, platform="local_mp")  # `Program`: how to build one.

Importing this package loads only the runtime and has no side effects.
"""

from trellis.launch.runtime.launcher import PLATFORMS, LaunchResult, RunningProgram, launch
from trellis.launch.runtime.node_context import (
    node_label,
    report_final,
    request_stop,
    restart_count,
    stop_event,
    stop_requested,
)
from trellis.launch.runtime.program import CourierNode, Handle, Node, Program, PyNode
from trellis.launch.runtime.rpc import Client, RemoteError

__all__ = [
    "PLATFORMS",
    "Client",
    "CourierNode",
    "Handle",
    "LaunchResult",
    "Node",
    "Program",
    "PyNode",
    "RemoteError",
    "RunningProgram",
    "launch",
    "node_label",
    "report_final",
    "request_stop",
    "restart_count",
    "stop_event",
    "stop_requested",
]
