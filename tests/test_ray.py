"""The `ray` platform: nodes as Ray actors on a local Ray instance that the launch starts
and stops; same results, restarts and errors as local_mp, and no Ray process left behind."""

import json
import os
import subprocess
import sys
import time

import pytest

import launch
from tests import launch_nodes as nodes

pytest.importorskip("ray")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RANDOM_CARTPOLE_RETURN = 22.0  # Mean return of a uniform random policy on CartPole-v1.
# Command-line fragments of the processes a local Ray instance runs.
_RAY_MARKS = ("raylet", "gcs_server", "ray::", "ray/_private", "ray/dashboard")


def _ray_pids() -> set[int]:
    pids = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().decode(errors="replace")
            with open(f"/proc/{entry}/stat") as f:
                zombie = f.read().rsplit(")", 1)[1].split()[0] == "Z"
        except OSError:
            continue
        if not zombie and any(mark in cmdline for mark in _RAY_MARKS):
            pids.add(int(entry))
    return pids


def _assert_no_new_ray_processes(before: set[int], timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while (_ray_pids() - before) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not (_ray_pids() - before), "Ray processes left behind"


def test_restart_and_error_on_ray(tmp_path, capfd):
    before = _ray_pids()
    log = tmp_path / "runs.log"
    program = launch.Program("flaky")
    with program.group("flaky", max_restarts=1, resources={"CPU": 1}):
        # Its first run kills its own actor process (kill -9), the second asks to stop.
        program.add_node(launch.CourierNode(nodes.Flaky, str(log), failures=1, kill=True))
    echo = program.add_node(launch.CourierNode(nodes.Echo, 100), label="echo")
    running = launch.launch(program, platform="ray", block=False)
    try:
        client = echo.dereference()
        assert client.add(1, 2) == 103 and client.futures.echo("x").result(timeout=30) == "x"
        result = running.wait(timeout=60)
    finally:
        running.stop()
    assert result == launch.LaunchResult("requested", "recovered", {"restarts": 1})
    assert running.restarts == {"flaky": 1}
    assert [line.split()[1] for line in log.read_text().splitlines()] == ["0", "1"]
    assert "node 'flaky' failed; restarting it (restart 1 of 1)" in capfd.readouterr().err
    _assert_no_new_ray_processes(before)

    program = launch.Program("crash")
    good = program.add_node(launch.CourierNode(nodes.Runner), label="good")
    program.add_node(launch.CourierNode(nodes.FailingRun, good), label="bad")
    result = launch.launch(program, platform="ray", stop_timeout_s=5.0)
    assert (result.stopped_by, result.exit_code) == ("error", 1)
    assert result.reason == "bad: ValueError: boom in run"
    assert "boom in run" in result.error_traceback
    _assert_no_new_ray_processes(before)


def test_impala_learns_on_ray_and_exits_0(tmp_path):
    before = _ray_pids()
    out = subprocess.run(
        [sys.executable, os.path.join(REPO, "launch", "run.py"), "--platform=ray",
         "--total_env_steps=80000", "--stop_at_return=none", "--eval_every=0",
         f"--logdir={tmp_path}"],
        capture_output=True, text=True, timeout=240, cwd=REPO)
    assert out.returncode == 0, out.stderr[-4000:]
    with open(tmp_path / "summary.json") as f:
        s = json.load(f)
    assert s["platform"] == "ray" and s["stopped_by"] == "budget"
    assert s["mean_return_last_100"] > 4 * RANDOM_CARTPOLE_RETURN, s
    _assert_no_new_ray_processes(before)
