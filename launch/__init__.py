"""Trellis launch: a Launchpad-style program graph on threads or processes.

Platforms: `local_mt` (one thread per node), `local_mp` (one process per node) and `ray` (one
Ray actor per node, locally or on a cluster; Ray is imported only then). A group may let its
nodes be restarted after they fail: `program.group("actor", max_restarts=3)`.

    program = launch.Program("impala")
    with program.group("learner"):
        learner = program.add_node(launch.CourierNode(Learner, config))
    with program.group("actor"):
        for i in range(4):
            program.add_node(launch.CourierNode(Actor, learner, i))
    result = launch.launch(program, platform="local_mp")

This package never imports JAX, and importing it has no side effects.
"""

from trellis.launch.launcher import PLATFORMS, LaunchResult, RunningProgram, launch
from trellis.launch.node_context import (
    node_label,
    request_stop,
    restart_count,
    stop_event,
    stop_requested,
)
from trellis.launch.program import CourierNode, Handle, Node, Program, PyNode
from trellis.launch.rpc import Client, RemoteError

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
    "request_stop",
    "restart_count",
    "stop_event",
    "stop_requested",
]
