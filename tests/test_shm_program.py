"""Env workers and inference through shared memory in a local_mp program: restarts, kills, leaks."""

import os
import signal
import time

import pytest

from tests import processes
from trellis.agents.impala import ImpalaBuilder, ImpalaConfig
from trellis.builders.contract.config import ExperimentConfig
from trellis.builders.experiments.program import make_program
from trellis.envs import GymnasiumFactory
from trellis.launch import runtime
from trellis.launch.runtime import shm

pytestmark = pytest.mark.skipif(not shm.available(), reason="needs Linux memfd")

MEMFD = "/memfd:trellis-shm (deleted)"


def _gone(pid: int) -> bool:
    """Whether process `pid` has exited (a zombie not yet reaped counts as exited)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _shared_mappings(pid: int) -> set[str]:
    """The inodes of the shared-memory channels that process `pid` maps."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            return {line.split()[4] for line in f if line.rstrip().endswith(MEMFD)}
    except OSError:  # Exited meanwhile.
        return set()


def _wait_for(condition, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _learner_pid() -> int:
    """The child process that holds the workers' slots and serves them: the learner."""
    found: list[int] = []
    _wait_for(lambda: found.extend(p for p in processes.descendants(os.getpid())
                                   if len(_shared_mappings(p)) == 1
                                   and len(os.listdir(f"/proc/{p}/task")) > 10) or found,
              "the learner (many threads: JAX) to map the workers' slots")
    return found[0]


def _program(transport: str = "shm", max_actor_restarts: int = 1) -> runtime.Program:
    config = ExperimentConfig(num_actors=2, envs_per_actor=8, total_env_steps=10**9,
                              max_actor_restarts=max_actor_restarts, log_every_s=0.5,
                              transport=transport)
    builder = ImpalaBuilder(ImpalaConfig(batch_size=16, unroll_length=20))
    return make_program(builder, GymnasiumFactory("CartPole-v1"), config, name="shm")


def test_a_killed_worker_maps_its_rows_again_and_nothing_leaks():
    """The learner holds one mapping of every worker's slots; each worker maps it and uses its
    row. A restarted worker maps the same one again and steps on; nothing is left behind."""
    dev_shm = set(os.listdir("/dev/shm"))
    program = _program()
    running = runtime.launch(program, platform="local_mp", block=False)
    try:
        learner = program.handles("learner")[0].dereference()
        victim = program.handles("actor")[0].dereference()
        worker_pids = {victim.pid(), program.handles("actor")[1].dereference().pid()}
        _wait_for(lambda: all(len(_shared_mappings(p)) == 1 for p in worker_pids),
                  "both workers to map the slots")
        learner_pid = _learner_pid()
        slots = _shared_mappings(learner_pid)
        assert all(_shared_mappings(p) == slots for p in worker_pids)  # One mapping for all.
        _wait_for(lambda: learner.env_steps() > 2_000, "2,000 env steps")
        old_pid = victim.pid()
        os.kill(old_pid, signal.SIGKILL)
        _wait_for(lambda: learner.stats()["slot_resets"] == 1, "the restarted worker's steps")
        new_pid = program.handles("actor")[0].dereference().pid()  # A fresh connection.
        assert new_pid != old_pid and _shared_mappings(new_pid) == slots
        assert _shared_mappings(learner_pid) == slots
        steps = learner.env_steps()
        _wait_for(lambda: learner.env_steps() > steps + 2_000, "steps after the restart")
    finally:
        result = running.stop()
    assert (result.stopped_by, result.error_node) == ("signal", None), result
    assert running.restarts == {"actor/0": 1}
    # Anonymous memfds: no name under /dev/shm at any point, nothing left behind.
    assert {n for n in set(os.listdir("/dev/shm")) - dev_shm if "trellis" in n} == set()
    _wait_for(lambda: all(map(_gone, [learner_pid, new_pid, *worker_pids])),
              "every node process to exit")


@pytest.mark.slow
def test_a_killed_learner_stops_the_program_and_the_workers_see_it():
    program = _program(max_actor_restarts=0)
    running = runtime.launch(program, platform="local_mp", block=False)
    try:
        learner = program.handles("learner")[0].dereference()
        _wait_for(lambda: learner.env_steps() > 1_000, "1,000 env steps")
        worker_pids = [h.dereference().pid() for h in program.handles("actor")]
        learner_pid = _learner_pid()
        os.kill(learner_pid, signal.SIGKILL)
        result = running.wait(timeout=60)
        assert result is not None, "the program did not stop after its learner was killed"
    finally:
        running.stop()
    assert (result.stopped_by, result.error_node) == ("error", "learner"), result
    _wait_for(lambda: all(map(_gone, [learner_pid, *worker_pids])), "every node process to exit")


@pytest.mark.slow
def test_the_socket_transport_maps_nothing():
    program = _program(transport="socket")
    running = runtime.launch(program, platform="local_mp", block=False)
    try:
        learner = program.handles("learner")[0].dereference()
        _wait_for(lambda: learner.env_steps() > 1_000, "1,000 env steps over the socket")
        assert all(not _shared_mappings(p) for p in processes.descendants(os.getpid()))
    finally:
        result = running.stop()
    assert (result.stopped_by, result.error_node) == ("signal", None), result
