"""Tests of launch/: program graph, RPCs, stop paths, and that no process is left behind."""

from __future__ import annotations

import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
import types

import numpy as np
import pytest

from tests import launch_nodes as nodes
from tests import processes
from trellis.launch import runtime
from trellis.launch.runtime import node_context, rpc

PLATFORMS = ["local_mt", "local_mp"]


def _alive(pid: int) -> bool:
    """Whether `pid` runs; a zombie (dead, not yet reaped by init) counts as gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _wait_gone(pids, timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


def _node_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("node:")]


@pytest.mark.parametrize("platform", PLATFORMS)
def test_handles_rpcs_futures_and_arrays(platform):
    program = runtime.Program("rpc")
    with program.group("echo"):
        first = program.add_node(runtime.CourierNode(nodes.Echo, 0))
        second = program.add_node(runtime.CourierNode(nodes.Echo, offset=100))
    caller = program.add_node(
        runtime.CourierNode(
            nodes.Caller,
            [first, second],
            {"first": first, "nested": [(second,)]},
            scale=np.float32(2.0),
            transform=lambda x: x + 1,
        ),
        label="caller",
    )
    assert [first.label, second.label, caller.label] == ["echo/0", "echo/1", "caller"]

    with runtime.launch(program, platform=platform, block=False) as running:
        client = caller.dereference()
        assert client.sums(1, 2) == [3, 103, 3, 103, 3, 103]
        assert client.futures.sums(2, 2).result(timeout=30) == [4, 104, 4, 104, 4, 104]
        array = np.arange(12, dtype=np.float32).reshape(3, 4)
        np.testing.assert_array_equal(client.scaled(array), array * 2 + 1)

        echo = pickle.loads(pickle.dumps(first)).dereference()  # handles travel by pickle
        echo = pickle.loads(pickle.dumps(echo))  # and so do clients
        expected_env = "echo/0" if platform == "local_mp" else os.environ.get("TRELLIS_NODE_LABEL")
        assert echo.labels() == ("echo/0", expected_env)

        # One client, many threads, sync and futures calls interleaved.
        def hammer(i: int, out: list) -> None:
            out.append(all(echo.add(i, k) == i + k for k in range(20)))
            out.append(echo.futures.echo(i).result(timeout=30) == i)

        results: list = []
        threads = [threading.Thread(target=hammer, args=(i, results)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert results == [True] * 16
        assert running.is_running()  # nodes without run() serve until stopped
    result = running.result
    assert result.stopped_by == "signal" and result.reason == "stop() called"
    assert result.exit_code == 130
    assert not _node_threads()


@pytest.mark.parametrize("platform", PLATFORMS)
def test_remote_errors_and_bad_methods(platform):
    program = runtime.Program("errors")
    echo = program.add_node(runtime.CourierNode(nodes.Echo), label="echo")
    with runtime.launch(program, platform=platform, block=False):
        client = echo.dereference()
        with pytest.raises(runtime.RemoteError) as info:
            client.fail("bad value 42")
        message = str(info.value)
        assert "ValueError: bad value 42" in message
        assert "echo" in message and "launch_nodes.py" in message  # the remote traceback
        assert info.value.remote_type == "ValueError"
        assert "raise ValueError(message)" in info.value.remote_traceback
        with pytest.raises(runtime.RemoteError, match="bad value"):
            client.futures.fail("bad value").result(timeout=30)
        with pytest.raises(AttributeError, match="no RPC method 'nope'.*echo, environ, fail"):
            client.nope()
        with pytest.raises(AttributeError, match="private"):
            client._secret()
        with pytest.raises(AttributeError, match="private"):
            client.futures._secret()
        assert client.add(1, 1) == 2  # the connection survives remote errors


def test_client_gives_up_with_a_clear_error():
    address = rpc.TcpAddress("127.0.0.1", rpc.free_port(), b"secret")
    client = rpc.connect("ghost", address, timeout_s=0.3)
    start = time.monotonic()
    with pytest.raises(ConnectionError, match=rf"'ghost' at 127.0.0.1:{address.port}"):
        client.ping()
    assert time.monotonic() - start < 5
    with pytest.raises(RuntimeError, match="launch the program first"):
        runtime.Program("p").add_node(runtime.CourierNode(nodes.Echo)).dereference()


def test_a_client_waiting_for_a_node_tries_again_every_50_ms_at_most(monkeypatch):
    """Env workers wait for a learner still being built: each connects at its next try after
    the learner serves, so the wait between tries is start-up for every launch."""
    waits = []

    def sleep(seconds):
        waits.append(seconds)
        time.sleep(seconds)

    monkeypatch.setattr(rpc, "time", types.SimpleNamespace(monotonic=time.monotonic, sleep=sleep))
    sock = rpc.reserve_port()  # Bound, not listening: connections are refused until it serves.
    address = rpc.TcpAddress("127.0.0.1", sock.getsockname()[1], b"secret")
    servers = []
    later = threading.Timer(1.0, lambda: servers.append(
        rpc.TcpServer(nodes.Echo(), "echo", address, sock)))
    later.start()
    try:
        assert rpc.connect("echo", address).add(2, 3) == 5
    finally:
        later.join()
        servers[0].close()
    assert sum(waits) >= 0.9 and max(waits) == pytest.approx(0.05)


@pytest.mark.parametrize("platform", PLATFORMS)
def test_run_error_stops_every_node(platform, tmp_path, capfd):
    program = runtime.Program("crash")
    good = program.add_node(runtime.CourierNode(nodes.Runner, str(tmp_path)), label="good")
    program.add_node(runtime.CourierNode(nodes.FailingRun, good), label="bad")

    result = runtime.launch(program, platform=platform, stop_timeout_s=5.0)

    assert result.stopped_by == "error" and result.exit_code == 1
    assert result.error_node == "bad"
    assert result.reason == "bad: ValueError: boom in run"
    assert "boom in run" in result.error_traceback and "in run" in result.error_traceback
    stderr = capfd.readouterr().err
    assert stderr.count("node 'bad' failed") == 1 and "ValueError: boom in run" in stderr
    pid = int((tmp_path / "runner.pid").read_text())
    if platform == "local_mp":
        assert pid != os.getpid()
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert not _node_threads()


@pytest.mark.parametrize("platform", PLATFORMS)
def test_constructor_error(platform):
    program = runtime.Program("init")
    program.add_node(runtime.CourierNode(nodes.FailingInit), label="broken")
    program.add_node(runtime.CourierNode(nodes.Runner), label="fine")
    result = runtime.launch(program, platform=platform)
    assert (result.stopped_by, result.error_node) == ("error", "broken")
    assert "boom in constructor" in result.reason


@pytest.mark.parametrize("platform", PLATFORMS)
def test_request_stop_and_completion(platform):
    program = runtime.Program("stop")
    program.add_node(runtime.CourierNode(nodes.Stopper), label="learner")
    program.add_node(runtime.CourierNode(nodes.Runner), label="actor")
    result = runtime.launch(program, platform=platform)
    assert result == runtime.LaunchResult("requested", "budget reached", {"steps": 3})
    assert result.exit_code == 0

    program = runtime.Program("complete")
    program.add_node(runtime.PyNode(nodes.return_at_once), label="job")
    program.add_node(runtime.CourierNode(nodes.Echo), label="server")  # no run(): not awaited
    result = runtime.launch(program, platform=platform)
    assert (result.stopped_by, result.exit_code) == ("completed", 0)


@pytest.mark.parametrize("platform", PLATFORMS)
def test_a_nodes_final_report_gives_its_info_and_leaves_the_cause(platform):
    program = runtime.Program("late")
    program.add_node(runtime.CourierNode(nodes.FinalCounts), label="learner")
    running = runtime.launch(program, platform=platform, block=False)
    assert running.wait(timeout=1.0) is None
    result = running.stop()
    assert (result.stopped_by, result.reason) == ("signal", "stop() called")
    assert list(result.info) == ["count"] and result.info["count"] > 0

    program = runtime.Program("first")  # The first request's info stays.
    program.add_node(runtime.CourierNode(nodes.Stopper), label="learner")
    program.add_node(runtime.CourierNode(nodes.FinalCounts), label="other")
    result = runtime.launch(program, platform=platform)
    assert result == runtime.LaunchResult("requested", "budget reached", {"steps": 3})


@pytest.mark.parametrize("platform", PLATFORMS)
def test_disable_run_lets_a_test_drive_the_node(platform):
    program = runtime.Program("driven")
    node = runtime.CourierNode(nodes.FailingRun)
    node.disable_run()
    handle = program.add_node(node, label="driven")
    running = runtime.launch(program, platform=platform, block=False)
    try:
        assert handle.dereference().ping() == "pong"
        assert running.wait(timeout=0.3) is None and running.is_running()
    finally:
        result = running.stop()
    assert result.stopped_by == "signal"
    assert not running.is_running()


def test_kill_minus_nine_is_an_error_and_breaks_calls_at_once():
    program = runtime.Program("kill")
    victim = program.add_node(runtime.CourierNode(nodes.Echo), label="victim")
    program.add_node(runtime.CourierNode(nodes.Runner), label="bystander")
    running = runtime.launch(program, platform="local_mp", block=False)
    try:
        client = victim.dereference()
        pid = client.pid()
        with open(f"/proc/{pid}/comm") as f:  # Named after its node, for ps and the soak.
            assert f.read() == "victim\n"
        pending = client.futures.sleep(30)
        deadline = time.monotonic() + 30
        while not client.sleeping():  # the call is in flight on the server
            assert time.monotonic() < deadline, "the call never reached the server"
            time.sleep(0.01)
        os.kill(pid, signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(ConnectionError, match="victim"):
            pending.result(timeout=10)
        assert time.monotonic() - start < 2  # at once, not after the 30 s call
        result = running.wait(timeout=15)
    finally:
        running.stop()
    assert (result.stopped_by, result.error_node) == ("error", "victim")
    assert "SIGKILL" in result.reason


@pytest.mark.parametrize("platform", PLATFORMS)
def test_group_restarts_failed_nodes_up_to_its_limit(platform, tmp_path, capfd):
    log = tmp_path / "runs.log"
    # A raise on both platforms; on local_mp also a silent death (kill -9 of its own process).
    kills = [False, True] if platform == "local_mp" else [False]
    for kill in kills:
        log.write_text("")
        program = runtime.Program("flaky")
        with program.group("flaky", max_restarts=2):
            program.add_node(runtime.CourierNode(nodes.Flaky, str(log), failures=2, kill=kill))
        program.add_node(runtime.CourierNode(nodes.Runner), label="steady")
        running = runtime.launch(program, platform=platform, block=False)
        result = running.wait(timeout=60)
        assert result == runtime.LaunchResult("requested", "recovered", {"restarts": 2})
        assert running.restarts == {"flaky": 2}
        runs = [line.split() for line in log.read_text().splitlines()]
        assert [int(r) for _, r in runs] == [0, 1, 2]
        if platform == "local_mp":
            assert len({pid for pid, _ in runs}) == 3  # a fresh process each time
        assert capfd.readouterr().err.count("node 'flaky' failed; restarting it") == 2

    # One failure more than the group allows stops the program with that failure.
    log.write_text("")
    program = runtime.Program("flaky")
    with program.group("flaky", max_restarts=1):
        program.add_node(runtime.CourierNode(nodes.Flaky, str(log), failures=2))
    result = runtime.launch(program, platform=platform)
    assert (result.stopped_by, result.reason) == ("error", "flaky: ValueError: flaky run 1")
    assert len(log.read_text().splitlines()) == 2


def test_max_restarts_must_be_a_count():
    with pytest.raises(ValueError, match="max_restarts must be an int >= 0, got -1"):
        with runtime.Program("p").group("g", max_restarts=-1):
            pass


@pytest.mark.parametrize("platform", PLATFORMS)
def test_a_nice_group_runs_its_processes_at_a_lower_priority(platform):
    program = runtime.Program("nice")
    with program.group("low", nice=5):
        low = program.add_node(runtime.CourierNode(nodes.Echo))
    usual = program.add_node(runtime.CourierNode(nodes.Echo), label="usual")
    ours = os.getpriority(os.PRIO_PROCESS, 0)
    running = runtime.launch(program, platform=platform, block=False)
    try:
        low_pid, usual_pid = low.dereference().pid(), usual.dereference().pid()
        if platform == "local_mp":
            assert os.getpriority(os.PRIO_PROCESS, low_pid) == min(19, ours + 5)
            assert os.getpriority(os.PRIO_PROCESS, usual_pid) == ours
        else:  # Threads of this process: the platform leaves the process's priority alone.
            assert low_pid == usual_pid == os.getpid()
            assert os.getpriority(os.PRIO_PROCESS, 0) == ours
    finally:
        running.stop()


def test_a_nice_groups_node_code_starts_at_the_lower_priority():
    # Its imports, its constructor and the envs it makes come after the priority is set: 14
    # env workers doing those at the launcher's priority held the learner's start back on 2
    # cores.
    program = runtime.Program("nice")
    with program.group("low", nice=5):
        low = program.add_node(runtime.CourierNode(nodes.ProcessView))
    running = runtime.launch(program, platform="local_mp", block=False)
    try:
        assert low.dereference().priority_at_start() == min(
            19, os.getpriority(os.PRIO_PROCESS, 0) + 5)
    finally:
        running.stop()


def _node_sees(name: str) -> str | None:
    program = runtime.Program("environ")
    view = program.add_node(runtime.CourierNode(nodes.ProcessView))
    running = runtime.launch(program, platform="local_mp", block=False)
    try:
        return view.dereference().environ(name)
    finally:
        running.stop()


def test_a_node_process_sees_the_launchers_environment_as_it_is_at_its_start(monkeypatch):
    # The fork server that forks node processes is started by the first launch and keeps the
    # environment of that moment; what the launcher sets later must reach later nodes (run.py
    # sets JAX's compilation cache and XLA's flags so).
    monkeypatch.delenv("TRELLIS_TEST_SETTING", raising=False)
    assert _node_sees("TRELLIS_TEST_SETTING") is None
    monkeypatch.setenv("TRELLIS_TEST_SETTING", "set later")
    assert _node_sees("TRELLIS_TEST_SETTING") == "set later"


def test_a_node_process_writes_to_the_launchers_stdout_as_it_is_at_its_start(capfd):
    with capfd.disabled():  # The fork server starts (if it has not yet) with the usual ones.
        _node_sees("HOME")
    program = runtime.Program("print")
    program.add_node(runtime.PyNode(nodes.say, "a node's line"))
    runtime.launch(program, platform="local_mp")
    assert "a node's line" in capfd.readouterr().out


@pytest.mark.parametrize("platform", PLATFORMS)
def test_a_node_process_collects_garbage_once_it_is_up_and_freezes_what_its_start_made(
        platform):
    program = runtime.Program("gc")
    node = program.add_node(runtime.CourierNode(nodes.GarbageCollector))
    running = runtime.launch(program, platform=platform, block=False)
    try:
        seen = node.dereference().collector()
    finally:
        running.stop()
    if platform == "local_mp":  # Off while the node started, on since, its start frozen.
        assert seen["while_constructed"] is False and seen["now"] is True
        assert seen["frozen"] > 1000
    else:  # A node among others in this process: the platform leaves the collector alone.
        assert seen["while_constructed"] is True and seen["now"] is True


def test_nice_must_be_an_int_from_0_to_19():
    for bad in (-1, 20, 2.5):
        with pytest.raises(ValueError, match=f"nice must be an int in \\[0, 19\\], got {bad}"):
            with runtime.Program("p").group("g", nice=bad):
                pass


def _launch_script() -> tuple[subprocess.Popen, list[int]]:
    process = subprocess.Popen(
        [sys.executable, "-c", nodes.SIGNAL_SCRIPT],
        stdout=subprocess.PIPE,
        text=True,
        env=os.environ.copy(),
    )
    pids = []
    while len(pids) < 2:
        line = process.stdout.readline()
        assert line, "the launcher script ended before its nodes started"
        if line.startswith("PID "):
            pids.append(int(line.split()[1]))
    return process, pids


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGQUIT])
def test_signal_stops_program_and_children(signum):
    process, pids = _launch_script()
    start = time.monotonic()
    process.send_signal(signum)
    try:
        out, _ = process.communicate(timeout=10)
    finally:
        process.kill()
    assert time.monotonic() - start < 10
    assert process.returncode == 130
    assert f"RESULT signal {signal.Signals(signum).name}" in out
    assert not _wait_gone(pids, 0.0)


def _nodes(launcher: int) -> set[int]:
    """The launcher's node processes: below multiprocessing's helpers, its own children."""
    return set(processes.descendants(launcher)) - set(processes.children(launcher))


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGQUIT])
def test_a_signal_while_local_mp_starts_its_nodes_stops_them_all(signum):
    """Issue 20: SIGINT sent while node processes were being spawned could be lost (the
    launcher then ran on), when a thread other than the main one took it."""
    process = subprocess.Popen([sys.executable, "-c", nodes.STARTUP_SIGNAL_SCRIPT],
                               stdout=subprocess.PIPE, text=True)
    seen: set[int] = set()
    try:
        deadline = time.monotonic() + 120
        while not seen and process.poll() is None and time.monotonic() < deadline:
            seen |= _nodes(process.pid)
            time.sleep(0.005)
        # Some nodes are spawned, not all: the launcher is in the middle of its start-up.
        assert 0 < len(seen) < nodes.STARTUP_NODES, seen
        process.send_signal(signum)
        start = time.monotonic()
        deadline = start + 60
        while process.poll() is None and time.monotonic() < deadline:
            seen |= _nodes(process.pid)
            time.sleep(0.02)
        elapsed = time.monotonic() - start
        out = process.communicate(timeout=1)[0] if process.poll() is not None else ""
    finally:
        process.kill()  # After a failure; its nodes notice and exit on their own.
        process.wait()
    assert process.returncode == 130, f"the launcher ran on {elapsed:.1f} s after the signal"
    assert f"RESULT signal {signal.Signals(signum).name}" in out
    assert not _wait_gone(seen, 5.0)


def test_a_signal_inside_stop_on_signals_stops_the_program_and_raises_nothing():
    program = runtime.Program("busy")
    program.add_node(runtime.CourierNode(nodes.Runner), label="runner")
    running = runtime.launch(program, platform="local_mt", block=False)
    # A host loop busy outside wait(): without the handlers, SIGINT would raise
    # KeyboardInterrupt here (in run.py it once did so inside tensorboardX and hung it).
    with running.stop_on_signals():
        os.kill(os.getpid(), signal.SIGINT)
        deadline = time.monotonic() + 10
        while running.is_running() and time.monotonic() < deadline:
            time.sleep(0.01)
    assert running.wait(timeout=10) == runtime.LaunchResult("signal", "SIGINT")


def test_children_exit_when_launcher_is_killed():
    process, pids = _launch_script()
    process.kill()
    process.wait()
    assert not _wait_gone(pids, 5.0)


def test_a_node_that_never_looks_at_the_stop_exits_when_the_launcher_is_killed():
    # Its parent is the fork server, which lives on while the node does: the node's watchdog
    # notices the launcher's end through the lifeline instead.
    process = subprocess.Popen([sys.executable, "-c", nodes.STUCK_SCRIPT],
                               stdout=subprocess.PIPE, text=True, env=os.environ.copy())
    try:
        line = process.stdout.readline()
        assert line.startswith("PID "), line
    finally:
        process.kill()
        process.wait()
    assert not _wait_gone([int(line.split()[1])], 5.0)


def test_unknown_platform():
    program = runtime.Program("p")
    program.add_node(runtime.PyNode(nodes.return_at_once))
    with pytest.raises(ValueError, match="'slurm'.*local_mp, local_mt, ray"):
        runtime.launch(program, platform="slurm")


def test_program_graph_checks():
    program = runtime.Program("p")
    node = runtime.PyNode(nodes.return_at_once)
    assert program.add_node(node).label == "return_at_once"
    with pytest.raises(ValueError, match="already added"):
        program.add_node(node)
    with program.group("g"):
        with pytest.raises(ValueError, match="one label"):
            program.add_node(runtime.PyNode(nodes.return_at_once), label="other")
    with pytest.raises(KeyError, match="return_at_once"):
        program.handles("missing")
    with pytest.raises(TypeError, match="cannot be pickled"):
        bad = runtime.Program("bad")
        bad.add_node(runtime.PyNode(nodes.return_at_once, threading.Lock()))
        runtime.launch(bad, platform="local_mt")


def test_node_context_outside_nodes():
    assert node_context.current() is None and runtime.node_label() is None
    event = runtime.stop_event()
    assert not runtime.stop_requested() and not event.wait(0.0)
    try:
        runtime.request_stop("outside", {"a": 1})
        assert runtime.stop_requested()
    finally:
        event.clear()  # the process-global default event; other tests must see it clear
    with pytest.raises(TypeError, match="dict"):
        runtime.request_stop("bad", info=[1])
    runtime.report_final({"a": 1})  # Asks for no stop: a learner run in a test sends it.
    assert not runtime.stop_requested()
    with pytest.raises(TypeError, match="dict"):
        runtime.report_final([1])


def test_a_service_nodes_port_is_its_own_from_the_launch():
    """Nobody else can bind a node's port while the node is being built (a launch beside it once
    took a learner's port meanwhile: "Address already in use" at its bind), and a restarted
    node's process binds it again while its last one's connections linger in TIME_WAIT."""
    program = runtime.Program("ports")
    slow = program.add_node(runtime.CourierNode(nodes.SlowEcho, 3.0), label="slow")
    running = runtime.launch(program, platform="local_mp", block=False)
    try:
        address = slow.address
        for reuse in (False, True):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                if reuse:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                with pytest.raises(OSError, match="in use"):
                    sock.bind((address.host, address.port))
        assert slow.dereference(timeout_s=30).add(1, 2) == 3
    finally:
        running.stop()

    sock = rpc.reserve_port()
    address = rpc.TcpAddress("127.0.0.1", sock.getsockname()[1], b"secret")
    server = rpc.TcpServer(nodes.Echo(), "echo", address, sock)
    client = rpc.connect("echo", address)
    assert client.add(2, 3) == 5
    server.close()  # closes its connection first: it stays in TIME_WAIT
    del client  # (and with it its socket)
    rpc.reserve_port(address.host, address.port).close()


def test_free_ports_are_distinct_bindable_and_clear_of_ephemeral_ports():
    # A node binds its port later; outgoing connections take ephemeral ports meanwhile (64
    # env workers connecting once took an actor's). Ray's worker ports (10002-19999) are
    # avoided too: Ray refused a test head's GCS port there (CI, stop 27).
    ports = [rpc.free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except OSError:
        low = None
    if low is not None and low > 21000:
        assert all(20000 <= p < low for p in ports)
    for port in ports[:20]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))
