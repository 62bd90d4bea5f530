"""Trellis launch: the runtime (a Launchpad-style program graph) and the command lines.

The runtime, the bottom layer of Trellis (docs/architecture.md), is what this package exports:
`Program`, nodes, handles, RPC and the platforms `local_mt` (one thread per node), `local_mp`
(one process per node) and `ray` (one Ray actor per node, locally or on a cluster; Ray is
imported only then). It knows nothing of JAX or RL (`make lint` checks it). A group may let its
nodes be restarted after they fail: `program.group("actor", max_restarts=3)`.

    program = launch.Program("impala")
    with program.group("learner"):
        learner = program.add_node(launch.CourierNode(Learner, config))
    with program.group("actor"):
        for i in range(4):
            program.add_node(launch.CourierNode(Actor, learner, i))
    result = launch.launch(program, platform="local_mp")

The command lines sit at the top of the layers, beside it: `run.py`, `evaluate.py` and
`plot.py` (`python launch/run.py` from a clone, `python -m trellis.launch.run` after an
install). Importing this package loads only the runtime and has no side effects.
"""

from trellis.launch.runtime.launcher import PLATFORMS, LaunchResult, RunningProgram, launch
from trellis.launch.runtime.node_context import (
    node_label,
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
    "request_stop",
    "restart_count",
    "stop_event",
    "stop_requested",
]
