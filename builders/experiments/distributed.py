"""One learner across processes and hosts: a `jax.distributed` group of learner processes.

With `ExperimentConfig.learner_processes` N > 1 the program has N learner nodes (`program.py`):
the coordinator (process 0: the learner node, with inference, the counter, the stop rule,
stats and checkpoints) and N - 1 `LearnerFollower`s. They form one `jax.distributed` group,
so the `DataParallelLearner`'s mesh spans every process's devices and XLA all-reduces the
gradients across them (NCCL between GPUs; on CPU, JAX's gloo collectives, which is how the test
suite runs two learner processes on one machine). Each process takes its own share of every
batch (B / N unrolls) from the replay node's unroll table.

Every update is a collective, so every process must run the same updates in the same order:
before each, the group agrees (`LearnerGroup.agree`, a small all-gather) whether all have a
batch, whether any is stopping, and on the coordinator's env-step count (which the
learning-rate schedule follows). A process that stops, on any side, stops them all at the
same update, so none waits in a collective for a peer that left.

The address of the group's coordination service is picked by the coordinator on its own host
and handed to each follower by RPC (`LearnerFollower.join`) before it joins, which is why a
follower starts its JAX only in `run()`: JAX's backend must not start before
`jax.distributed.initialize`.
"""

from __future__ import annotations

import dataclasses
import socket
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any, cast

import jax
import numpy as np
from jax.experimental import multihost_utils

from trellis.builders.contract.agent import UNROLLS, Agent, Builder, Learner, QueueSpec
from trellis.builders.contract.config import ExperimentConfig
from trellis.builders.experiments.feeds import Prefetch
from trellis.builders.experiments.learner_update import LearnerUpdate
from trellis.launch import runtime
from trellis.launch.runtime import rpc
from trellis.launch.runtime.node_context import StopEvent

# The platforms that run each learner process as a node of its own (jax.distributed starts
# once per process: not local_mt's threads, not anakin's one program).
GROUP_PLATFORMS = ("local_mp", "ray")
# Seconds a process waits for the whole group to join (JAX's default, 300, hides a missing
# process for five minutes).
JOIN_TIMEOUT_S = 120
# The two halves of an env-step count sent as int32 (JAX's default without x64).
_HALF = 1 << 30


def group_refusal(builder: Agent[Any], config: ExperimentConfig, platform: str) -> str | None:
    """Why `builder` (an agent of any kind) cannot run on `platform` with
    `config.learner_processes` (one line), or None if it can."""
    n = config.learner_processes
    if n == 1:
        return None
    if platform not in GROUP_PLATFORMS:
        return (f"--learner_processes={n} runs each learner process as a node of its own: use "
                f"--platform=local_mp or ray, not {platform}")
    if not config.learn:
        return (f"--learner_processes={n} learns in every process; --learn=false acts alone "
                "(use --learner_processes=1)")
    name, learns_from = type(builder).__name__, builder.capabilities.learns_from
    if learns_from != UNROLLS:
        return (f"--learner_processes={n} splits inference's unrolls between the learner "
                f"processes; {name} learns from {learns_from} (use --learner_processes=1)")
    # Learning from unrolls: a gradient learner (`session.check_supported` checked it).
    batch_size = cast(Builder[Any], builder).queue_spec().batch_size
    if batch_size % n:
        return (f"--learner_processes={n} must divide the batch size ({batch_size}): each "
                f"process takes its share of every batch")
    return None


def process_share(queue_spec: QueueSpec, processes: int) -> QueueSpec:
    """The queue spec of one learner process of `processes`: its share of every batch."""
    return dataclasses.replace(queue_spec, batch_size=queue_spec.batch_size // processes)


def initialize(coordinator: str, num_processes: int, process_id: int) -> LearnerGroup:
    """Joins this process to the learner group; call before JAX's backend starts.

    On CPU, the cross-process collectives are gloo's (XLA's CPU client has none by default).
    Returns once every process has joined and the group has agreed once: gloo connects the
    processes at their first collective and gives up if one comes 30 s after another
    (measured: jax 0.10.2), while later collectives wait for as long as it takes; here they
    all come within moments of the join. Then each process says so in one line on stderr
    ("[learner] process I of N joined the learner group at HOST:PORT (D devices in all)").

    Args:
      coordinator: "HOST:PORT" of the group's coordination service, served by process 0.
      num_processes: N, the group's processes.
      process_id: this process's index in [0, N).
    """
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator, num_processes, process_id,
                               initialization_timeout=JOIN_TIMEOUT_S)
    group = LearnerGroup(num_processes)
    group.agree(ready=True, stopping=False, env_steps=0)
    # Past the first collective, so the line says the group works, in words of our own (gloo's
    # and JAX's logs depend on their versions and log levels).
    print(f"[learner] process {process_id} of {num_processes} joined the learner group at "
          f"{coordinator} ({jax.device_count()} devices in all)", file=sys.stderr, flush=True)
    return group


def coordinator_address(peer_host: str) -> str:
    """"HOST:PORT" for the coordination service on this host: the address of this host's
    interface toward `peer_host` (a follower's host), and a port free now."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((peer_host, 9))  # A datagram socket's connect sends nothing.
        host = probe.getsockname()[0]
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port = sock.getsockname()[1]
    return f"{host}:{port}"


def start_group(followers: Sequence[Any]) -> LearnerGroup:
    """The coordinator's start: picks the service's address on this host (its interface
    toward the first follower's), hands it to every follower (their nodes' RPC clients), then
    joins the group as process 0; returns once all have joined. No followers: a group of one.
    """
    if not followers:
        return LearnerGroup()
    peer = rpc.address_of(followers[0])
    address = coordinator_address(peer.host if isinstance(peer, rpc.TcpAddress) else "127.0.0.1")
    for follower in followers:
        follower.join(address)
    return initialize(address, len(followers) + 1, 0)


@dataclasses.dataclass(frozen=True)
class Agreement:
    """What the group agreed before an update.

    Attributes:
      stop: some process is stopping: every process leaves its loop now.
      go: every process has its share of the next batch: every process updates now.
      env_steps: the coordinator's env-step count (the schedule's clock on every process).
    """

    stop: bool
    go: bool
    env_steps: int


class LearnerGroup:
    """The learner's processes agreeing on each update; a group of one agrees with itself.

    Args:
      processes: N, the processes of the group (`jax.process_count()` once joined).
    """

    def __init__(self, processes: int = 1):
        self.processes = processes

    def agree(self, ready: bool, stopping: bool, env_steps: int) -> Agreement:
        """Whether the group updates now, stops, and at which env step: a collective, called
        by every process once per turn of its loop.

        Args:
          ready: this process holds its share of the next batch.
          stopping: this process stops (its stop event, or the coordinator's stop rule).
          env_steps: this process's env-step count (only the coordinator's is used).
        """
        if self.processes == 1:
            return Agreement(stop=stopping, go=ready and not stopping, env_steps=env_steps)
        mine = np.array([ready, stopping, env_steps // _HALF, env_steps % _HALF], np.int32)
        every = np.asarray(multihost_utils.process_allgather(mine))  # [N, 4]
        stop = bool(every[:, 1].any())
        return Agreement(stop=stop, go=bool(every[:, 0].all()) and not stop,
                         env_steps=int(every[0, 2]) * _HALF + int(every[0, 3]))

    def share_state(self, learner: Learner) -> None:
        """Gives every process the coordinator's training state (a restored checkpoint, or
        the same init): a collective, called by every process once before its first update."""
        if self.processes > 1:
            learner.restore(multihost_utils.broadcast_one_to_all(learner.state))


@dataclasses.dataclass(frozen=True)
class FollowerParts:
    """What a follower's loop moves.

    Attributes:
      batches: its shares of the batches, prefetched and placed.
      update: the learner's update (whose state the group shares at the start).
    """

    batches: Prefetch
    update: LearnerUpdate

    def close(self) -> None:
        """Stops the feed and joins the threads."""
        try:
            self.batches.close(timeout_s=5.0)
        finally:
            self.update.close()


class LearnerFollower:
    """Service node: learner process `process_id` > 0 of the group, without inference,
    counter or checkpoints; it updates in step with the coordinator on its share of each batch.

    RPC: `join(coordinator)`, called by the coordinator at its start.

    Args:
      process_id: this process's index in the group, in [1, N).
      processes: N.
      parts: builds the follower's parts once the group has formed (its JAX starts there),
        called with `args` and the program's stop event.
      args: `parts`' arguments (handles among them are dereferenced at the node's start).
    """

    def __init__(self, process_id: int, processes: int,
                 parts: Callable[..., FollowerParts], *args: Any):
        self._process_id, self._processes = process_id, processes
        self._parts, self._args = parts, args
        self._stop = runtime.stop_event()
        self._coordinator: str | None = None
        self._joined = threading.Event()

    def join(self, coordinator: str) -> None:
        """Where the group's coordination service is ("HOST:PORT"); `run` joins it."""
        self._coordinator = coordinator
        self._joined.set()

    def run(self) -> None:
        """Joins the group, then updates whenever the group agrees, until it stops."""
        while not self._joined.wait(0.1):
            if self._stop.is_set():
                return
        assert self._coordinator is not None  # Set before `_joined`.
        group = initialize(self._coordinator, self._processes, self._process_id)
        parts = self._parts(*self._args, self._stop)
        try:
            group.share_state(parts.update.learner)
            follow(group, parts, self._stop)
        finally:
            parts.close()


def follow(group: LearnerGroup, parts: FollowerParts, stop: StopEvent) -> None:
    """A follower's loop: each turn the group agrees; on `go`, an update on this process's
    share of the batch, at the coordinator's env-step count."""
    ready = None
    while True:
        stopping = stop.is_set()
        if ready is None and not stopping:
            ready = parts.batches.next_batch()
        turn = group.agree(ready is not None, stopping, 0)
        if turn.stop:
            return
        if turn.go and ready is not None:
            batch, versions = ready
            parts.update(batch, versions, turn.env_steps)
            ready = None
