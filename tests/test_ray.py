"""The `ray` platform: nodes as Ray actors on a local Ray instance that the launch starts
and stops; same results, restarts and errors as local_mp, and no Ray process left behind."""

import contextlib
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests import launch_nodes as nodes
from trellis.launch import runtime
from trellis.launch.runtime import ray_platform

pytest.importorskip("ray")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RANDOM_CARTPOLE_RETURN = 22.0  # Mean return of a uniform random policy on CartPole-v1.
# Command-line fragments of the processes a local Ray instance runs.
_RAY_MARKS = ("raylet", "gcs_server", "ray::", "ray/_private", "ray/dashboard")
_MARK_VARIABLE = "TRELLIS_TEST_RAY"


@pytest.fixture
def mark(monkeypatch) -> bytes:
    """An environment entry that every Ray process a test starts inherits (from the driver,
    through the raylet to its workers), so that the leftover checks count this test's Ray
    processes only: other Ray instances on the machine start and end workers meanwhile."""
    token = os.urandom(8).hex()
    monkeypatch.setenv(_MARK_VARIABLE, token)
    return f"{_MARK_VARIABLE}={token}".encode()


def _ray_pids(mark: bytes) -> set[int]:
    """The live Ray processes whose environment holds `mark`."""
    pids = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().decode(errors="replace")
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read().split(b"\0")
            with open(f"/proc/{entry}/stat") as f:
                zombie = f.read().rsplit(")", 1)[1].split()[0] == "Z"
        except OSError:
            continue
        if not zombie and mark in environ and any(m in cmdline for m in _RAY_MARKS):
            pids.add(int(entry))
    return pids


def _assert_no_ray_processes(mark: bytes, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while _ray_pids(mark) and time.monotonic() < deadline:  # Killed, not yet gone.
        time.sleep(0.2)
    assert not _ray_pids(mark), "Ray processes left behind"


def test_restart_and_error_on_ray(tmp_path, capfd, mark):
    log = tmp_path / "runs.log"
    program = runtime.Program("flaky")
    with program.group("flaky", max_restarts=1, resources={"CPU": 1}):
        # Its first run kills its own actor process (kill -9), the second asks to stop.
        program.add_node(runtime.CourierNode(nodes.Flaky, str(log), failures=1, kill=True))
    echo = program.add_node(runtime.CourierNode(nodes.Echo, 100), label="echo")
    running = runtime.launch(program, platform="ray", block=False)
    try:
        client = echo.dereference()
        assert client.add(1, 2) == 103 and client.futures.echo("x").result(timeout=30) == "x"
        result = running.wait(timeout=60)
    finally:
        running.stop()
    assert result == runtime.LaunchResult("requested", "recovered", {"restarts": 1})
    assert running.restarts == {"flaky": 1}
    assert [line.split()[1] for line in log.read_text().splitlines()] == ["0", "1"]
    assert "node 'flaky' failed; restarting it (restart 1 of 1)" in capfd.readouterr().err
    _assert_no_ray_processes(mark)

    program = runtime.Program("crash")
    good = program.add_node(runtime.CourierNode(nodes.Runner), label="good")
    program.add_node(runtime.CourierNode(nodes.FailingRun, good), label="bad")
    result = runtime.launch(program, platform="ray", stop_timeout_s=5.0)
    assert (result.stopped_by, result.exit_code) == ("error", 1)
    assert result.reason == "bad: ValueError: boom in run"
    assert "boom in run" in result.error_traceback
    _assert_no_ray_processes(mark)


def test_node_actors_do_not_preallocate_accelerator_memory(monkeypatch, mark):
    """Issue 20: several actors on one GPU each took XLA's default 75% of its memory up front.
    No GPU needed: the actor's process must see the setting (the driver's environment lacks it,
    and the local Ray instance's workers inherit the driver's)."""
    monkeypatch.delenv("XLA_PYTHON_CLIENT_PREALLOCATE", raising=False)
    program = runtime.Program("environ")
    echo = program.add_node(runtime.CourierNode(nodes.Echo), label="echo")
    with runtime.launch(program, platform="ray", block=False):
        assert echo.dereference().environ("XLA_PYTHON_CLIENT_PREALLOCATE") == "false"
    _assert_no_ray_processes(mark)


def test_a_nice_group_runs_its_nodes_at_a_lower_priority(mark):
    program = runtime.Program("nice")
    with program.group("low", nice=5):
        low = program.add_node(runtime.CourierNode(nodes.Echo))
    usual = program.add_node(runtime.CourierNode(nodes.Echo), label="usual")
    with runtime.launch(program, platform="ray", block=False):
        # Ray starts its workers at a niceness of its own (15 here); the node's thread, and the
        # threads it starts (the RPC server's, which answer), run nicer by the group's.
        usual_nice = usual.dereference().niceness()
        assert low.dereference().niceness() == min(19, usual_nice + 5)
    _assert_no_ray_processes(mark)


@pytest.mark.parametrize("xla_flags", [None, "--xla_gpu_autotune_level=1"])
def test_node_actors_get_the_launchers_xla_flags(xla_flags, monkeypatch):
    """A cluster's other hosts do not inherit the launcher's environment: XLA_FLAGS (run.py's
    GPU autotune level) goes in the actors' runtime_env where the launcher has it."""
    monkeypatch.delenv("XLA_PYTHON_CLIENT_PREALLOCATE", raising=False)
    if xla_flags is None:
        monkeypatch.delenv("XLA_FLAGS", raising=False)
        expected = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    else:
        monkeypatch.setenv("XLA_FLAGS", xla_flags)
        expected = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false", "XLA_FLAGS": xla_flags}
    assert ray_platform._actor_env_vars() == expected


def test_a_node_ray_cannot_place_fails_the_launch_in_one_line(monkeypatch, mark):
    monkeypatch.setattr(ray_platform, "_PLACE_TIMEOUT_S", 3.0)
    program = runtime.Program("unplaceable")
    with program.group("nowhere", resources={"nowhere": 1}):  # No Ray node has it.
        program.add_node(runtime.CourierNode(nodes.Echo))
    with pytest.raises(RuntimeError) as raised:
        runtime.launch(program, platform="ray")
    assert str(raised.value).startswith(
        "Ray found no room for node(s) within 3 s: nowhere {'nowhere': 1}"), raised.value
    assert "\n" not in str(raised.value)
    _assert_no_ray_processes(mark)


def _program_of(groups: dict[str, dict[str, float]]) -> runtime.Program:
    program = runtime.Program("waves")
    for label, resources in groups.items():
        with program.group(label, resources=resources):
            program.add_node(runtime.CourierNode(nodes.Echo))
    return program


def test_an_actor_holds_a_port_only_for_a_node_that_serves_rpcs(monkeypatch):
    """A node's port is bound from its placement to its serving, so that no other process
    takes it meanwhile; env workers and other client-only nodes need none."""
    import types

    fake_ray = types.SimpleNamespace(
        util=types.SimpleNamespace(get_node_ip_address=lambda: "127.0.0.1"),
        get_runtime_context=lambda: types.SimpleNamespace(get_node_id=lambda: "node-1"))
    monkeypatch.setitem(sys.modules, "ray", fake_ray)
    client = ray_platform._NodeActor()
    assert client.place(reserve_port=False) == ("127.0.0.1", None, "node-1")
    server = ray_platform._NodeActor()
    host, port, _ = server.place(reserve_port=True)
    try:
        with socket.socket() as other, pytest.raises(OSError):
            other.bind((host, port))  # Held until the node's server takes it.
    finally:
        server._sock.close()


def test_nodes_asking_for_a_gpu_or_a_custom_resource_are_placed_first():
    # In program order the CPU-only workers come first; Ray would place them in any order.
    program = _program_of({"actor": {"CPU": 1}, "learner": {"CPU": 1, "accelerator": 1},
                           "pinned": {"learner": 1}, "replay": {}})

    def waves(cluster, several):
        return [[node.label for node in wave]
                for wave in ray_platform._placement_waves(program.nodes, cluster, several)]

    assert waves({"CPU": 4, "GPU": 1}, True) == [["learner", "pinned"], ["actor", "replay"]]
    # Without GPUs "accelerator" asks for nothing: the learner is as easy to place as a worker.
    assert waves({"CPU": 4}, True) == [["pinned"], ["actor", "learner", "replay"]]
    # One Ray node: nothing can take another group's machine, so one wave (no added start-up).
    assert waves({"CPU": 4, "GPU": 1}, False) == [["actor", "learner", "pinned", "replay"]]


def _stop_ray_nodes(procs: list[subprocess.Popen]) -> None:
    """SIGKILL to each `ray start`'s process group (its whole tree). A SIGTERMed head took
    about 35 s to exit even on an idle machine (its processes wait for peers already gone), and
    the test needs nothing of a graceful stop."""
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):  # No process of the group is left.
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _ray_start(args: list[str], env: dict[str, str], log: pathlib.Path) -> subprocess.Popen:
    """`ray start ... --block` in a session of its own (so killpg ends its whole tree), its
    output to `log` (a head that refuses its port otherwise leaves the driver waiting mute)."""
    ray_bin = os.path.join(os.path.dirname(sys.executable), "ray")
    with open(log, "wb") as out:
        return subprocess.Popen(
            [ray_bin, "start", *args, "--node-ip-address=127.0.0.1", "--block",
             "--disable-usage-stats", "--object-store-memory=100000000"],
            env=env, start_new_session=True, stdout=out, stderr=subprocess.STDOUT)


# Run in a fresh Python: a process that already started and shut down a local Ray instance
# (the tests above) cannot reliably join another cluster.
PLACEMENT_SCRIPT = """
import faulthandler, json, sys, time
# A hang shows its stacks in the test's failure message (the test's own timeout shows nothing).
faulthandler.dump_traceback_later(200, exit=True)
import ray
from trellis.launch import runtime
from tests import launch_nodes as nodes

address = sys.argv[1]
deadline = time.monotonic() + 180  # Ray's processes start slowly on a busy machine.
while True:  # Until the head answers.
    try:
        ray.init(address=address)
        break
    except ConnectionError:
        assert time.monotonic() < deadline, "the Ray head did not come up"
        time.sleep(0.5)
# Connected once, then wait for the second node: a driver that disconnects while a node is
# joining can block in ray.shutdown() for minutes on a busy machine (the test's old hang).
while len([n for n in ray.nodes() if n["Alive"]]) < 2:
    assert time.monotonic() < deadline, "the second Ray node did not join the head"
    time.sleep(0.2)
head = next(n["NodeID"] for n in ray.nodes() if "learner" in n["Resources"])
program = runtime.Program("placement")
with program.group("learner", resources={"learner": 1}):
    learner = program.add_node(runtime.CourierNode(nodes.RayPlacement))
with program.group("actor", resources={"CPU": 1}):
    actors = [program.add_node(runtime.CourierNode(nodes.RayPlacement)) for _ in range(2)]
with runtime.launch(program, platform="ray", block=False, ray_address=address):
    placed = {"head": head, "learner": learner.dereference().node_id(),
              "actors": [a.dereference().node_id() for a in actors]}
ray.shutdown()
print(json.dumps(placed))
"""


def test_groups_land_on_the_nodes_with_their_resources(tmp_path, mark):
    """A head with a custom "learner" resource and a CPU-only second node (both on loopback):
    the learner group goes to the head, the env-worker group to the other node. Until the
    learner group was placed first, an env worker could take the head's only CPU and leave the
    learner pending forever (issue 14)."""
    from trellis.launch.runtime import rpc

    # Both nodes bind 127.0.0.1 only, so the test cluster runs without Ray's auth token.
    env = dict(os.environ, RAY_AUTH_MODE="disabled")
    port = rpc.free_port()
    address = f"127.0.0.1:{port}"
    logs = [tmp_path / "head.log", tmp_path / "node.log"]
    procs = [_ray_start(["--head", f"--port={port}", "--num-cpus=1", '--resources={"learner": 1}',
                         "--include-dashboard=false"], env, logs[0])]
    try:
        procs.append(_ray_start([f"--address={address}", "--num-cpus=3"], env, logs[1]))
        out = subprocess.run([sys.executable, "-c", PLACEMENT_SCRIPT, address], env=env,
                             capture_output=True, text=True, timeout=240, cwd=REPO)
        assert out.returncode == 0, (out.stderr[-3000:] + "\nhead: "
                                     + logs[0].read_text(errors="replace")[-1500:])
        placed = json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        _stop_ray_nodes(procs)
    assert placed["learner"] == placed["head"]
    assert len(placed["actors"]) == 2 and placed["head"] not in placed["actors"]
    _assert_no_ray_processes(mark)


def test_impala_learns_on_ray_and_exits_0(tmp_path, mark):
    """Learning is reaching a return target within an env-step budget, not a return at a fixed
    step: where IMPALA's CartPole curve stands at one step varies from run to run (at 80,000
    steps: 110 to 250 in eleven runs). Most runs stop near 40,000 steps (issue 20: the test
    once ran past its timeout under load)."""
    target = 4 * RANDOM_CARTPOLE_RETURN
    out = subprocess.run(
        [sys.executable, os.path.join(REPO, "launch", "run.py"), "--platform=ray",
         "--total_env_steps=200000", f"--stop_at_return={target}", "--eval_every=0",
         f"--logdir={tmp_path}"],
        capture_output=True, text=True, timeout=240, cwd=REPO)
    assert out.returncode == 0, out.stderr[-4000:]
    with open(tmp_path / "summary.json") as f:
        s = json.load(f)
    assert s["platform"] == "ray" and s["stopped_by"] == "return_target", s
    assert s["mean_return"] >= target and s["env_steps"] < 200_000, s
    _assert_no_ray_processes(mark)
