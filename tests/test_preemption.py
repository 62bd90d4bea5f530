"""Runs that survive preemption and loss (issue 48, item 6), through launch/run.py on local_mp:
SIGTERM, to the launcher or to every process of the run, keeps a final checkpoint within
`--shutdown_timeout_s` (else exit code 3 and one line saying so), a resume falls back past an
unreadable newest checkpoint with one warning line, and a learner whose process is killed is
restarted from its newest checkpoint (`--max_learner_restarts`) while the env workers
reconnect."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import pytest

from tests import launch_nodes as nodes
from tests import processes
from tests.checkpoints import truncate_state
from trellis.builders.experiments.checkpointing import (
    CORRUPT_SUBDIR,
    Checkpointer,
    CheckpointError,
    checkpoint_dir,
    latest_checkpoint,
)
from trellis.launch import runtime

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN = [sys.executable, os.path.join(REPO, "launch", "run.py")]
# IMPALA on CartPole with 2 env workers: a run that checkpoints every second.
BASE = ["--agent=impala", "--platform=local_mp", "--checkpoint_every_s=1", "--quiet"]


def _summary(run_dir):
    with open(os.path.join(run_dir, "summary.json")) as f:
        return json.load(f)


def _steps(run_dir):
    """The steps of the run's checkpoints on disk (orbax names each by its step)."""
    directory = os.path.join(run_dir, "checkpoints")
    if not os.path.isdir(directory):
        return []
    return sorted(int(name) for name in os.listdir(directory) if name.isdigit())


def _env_steps(run_dir):
    """The env steps of the newest metrics record (0 before the first)."""
    try:
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            lines = [line for line in f.read().splitlines() if line.endswith("}")]
    except FileNotFoundError:
        return 0
    return json.loads(lines[-1])["env_steps"] if lines else 0


def _wait_for(condition, proc, timeout_s, what):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None and not condition():
        time.sleep(0.2)
    assert proc.poll() is None and condition(), f"not {what} in {timeout_s} s"


def _start(args, session=False):
    """run.py with `args`; with `session`, in a session (and process group) of its own, which
    its node processes join, as a job's processes under a scheduler."""
    return subprocess.Popen(RUN + BASE + args, cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=session)


def _finish(proc, timeout_s):
    try:
        return proc.communicate(timeout=timeout_s)
    finally:
        if proc.poll() is None:  # Never leave a training run behind.
            proc.kill()
            proc.communicate()


def _interrupted_run(run_dir, shutdown_timeout_s, whole_group=False):
    """A run stopped by SIGTERM once it has checkpointed mid-run, sent to the launcher, or
    with `whole_group` to every process of its group (as SLURM's scancel or a pod's stop do):
    (its end's seconds after the signal, the signal's time, the env steps recorded before it,
    exit code, stderr, the launcher's descendants at the signal)."""
    proc = _start(["--stop_at_return=none", "--total_env_steps=100000000",
                   f"--shutdown_timeout_s={shutdown_timeout_s}", f"--logdir={run_dir}"],
                  session=whole_group)
    try:
        # Training (past the compiles), so that env steps follow the last timed checkpoint.
        _wait_for(lambda: _env_steps(run_dir) > 5000 and _steps(run_dir), proc, 180,
                  "training")
        below = processes.descendants(proc.pid)
        before, signalled = _env_steps(run_dir), time.time()
        start = time.monotonic()
        if whole_group:
            os.killpg(proc.pid, signal.SIGTERM)
        else:
            proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=shutdown_timeout_s + 30)
    finally:
        _finish(proc, 10)
    return time.monotonic() - start, signalled, before, proc.returncode, stderr, below


def _alive(pid):
    """Whether process `pid` runs (a zombie has ended; its parent has not reaped it yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_sigterm_keeps_a_final_checkpoint_within_the_bound_and_resume_goes_on(tmp_path):
    run_dir = str(tmp_path / "run")
    bound = 30.0
    took, signalled, before, code, stderr, _ = _interrupted_run(run_dir, bound)
    # The bound is the nodes'; the summary and learning curve follow (a few seconds on 2 cores).
    assert code == 130 and took < bound, (took, stderr)
    s = _summary(run_dir)
    newest = _steps(run_dir)[-1]
    assert s["stopped_by"] == "signal" and newest == s["env_steps"] >= before
    assert os.path.getmtime(os.path.join(run_dir, "checkpoints", str(newest))) >= signalled
    # The resume goes on from the final checkpoint: no env steps lost.
    out = subprocess.run(RUN + [f"--resume={run_dir}", f"--total_env_steps={newest + 2000}",
                                "--quiet"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    resumed = _summary(run_dir)
    assert resumed["resumed_from_env_steps"] == newest and resumed["env_steps"] >= newest + 2000


def test_sigterm_to_every_process_of_the_run_ends_as_sigterm_to_the_launcher(tmp_path):
    """SLURM's scancel, a pod's stop and `kill -TERM -PGID` signal the node processes as well
    as the launcher: the nodes leave it to the launcher, so the learner still writes the final
    checkpoint, the run exits 130 within the bound, and none of its processes is left."""
    run_dir = str(tmp_path / "run")
    bound = 30.0
    took, signalled, before, code, stderr, below = _interrupted_run(run_dir, bound,
                                                                     whole_group=True)
    assert code == 130 and took < bound, (took, stderr)
    s = _summary(run_dir)
    newest = _steps(run_dir)[-1]
    assert s["stopped_by"] == "signal" and newest == s["env_steps"] >= before, (s, stderr)
    assert os.path.getmtime(os.path.join(run_dir, "checkpoints", str(newest))) >= signalled
    assert "exited unexpectedly" not in stderr, stderr  # No node died of the signal.
    # The nodes, the fork server and the resource tracker: gone with the launcher, or moments
    # after it (the fork server notices its end).
    assert len(below) >= 4, below  # At least the learner's and the two env workers' nodes.
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in below) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in below if _alive(pid)], stderr


def test_nodes_past_the_stop_bound_are_named_in_the_result():
    program = runtime.Program("bound")
    program.add_node(runtime.PyNode(nodes.print_pid_and_ignore_the_stop), label="stuck")
    program.add_node(runtime.PyNode(nodes.print_pid_and_wait), label="waiter")
    running = runtime.launch(program, platform="local_mp", block=False, stop_timeout_s=0.5)
    time.sleep(1.0)  # Both started.
    start = time.monotonic()
    result = running.stop()
    assert result.stopped_by == "signal" and result.forced == ("stuck",)
    assert time.monotonic() - start < 5.0  # The bound, then SIGKILL.


@pytest.mark.slow
def test_shutdown_past_the_bound_exits_3_saying_the_checkpoint_is_lost(tmp_path):
    # A bound no learner meets: it is killed, and the run says so in its own line and code.
    run_dir = str(tmp_path / "run")
    _, _, _, code, stderr, _ = _interrupted_run(run_dir, 0.001)
    assert code == 3, stderr
    lines = [line for line in stderr.splitlines() if "final checkpoint was not written" in line]
    assert len(lines) == 1 and "--shutdown_timeout_s=0.001" in lines[0], stderr
    assert _summary(run_dir)["exit_code"] == 3


def _checkpoints(run_dir, steps):
    """A run directory with a small state checkpointed at `steps`."""
    checkpointer = Checkpointer(checkpoint_dir(run_dir), max_to_keep=len(steps))
    for step in steps:
        checkpointer.save(step, {"w": jnp.full(3, float(step))},
                          {"env_steps": step, "learner_steps": step // 10})
    checkpointer.close()


def test_resume_falls_back_past_an_unreadable_newest_checkpoint(tmp_path, capfd):
    run_dir = str(tmp_path)
    _checkpoints(run_dir, [100, 200, 300])
    truncate_state(os.path.join(run_dir, "checkpoints", "300"))

    assert latest_checkpoint(run_dir) == (200, {"env_steps": 200, "learner_steps": 20})
    err = capfd.readouterr().err
    warnings = [line for line in err.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "Traceback" not in err, err
    assert "checkpoint 300 cannot be read" in warnings[0]
    assert "resuming from checkpoint 200" in warnings[0]
    # Set aside, not deleted; the run's checkpoints are the readable ones.
    assert os.listdir(os.path.join(run_dir, CORRUPT_SUBDIR)) == ["300"]
    assert _steps(run_dir) == [100, 200]
    # One half-written (a directory emptied by a crash) is set aside beside the first.
    for name in os.listdir(os.path.join(run_dir, "checkpoints", "200")):
        path = os.path.join(run_dir, "checkpoints", "200", name)
        if os.path.isdir(path):
            shutil.rmtree(path)
    assert latest_checkpoint(run_dir)[0] == 100
    assert sorted(os.listdir(os.path.join(run_dir, CORRUPT_SUBDIR))) == ["200", "300"]


@pytest.mark.slow
def test_run_py_resumes_past_an_unreadable_newest_checkpoint(tmp_path):
    run_dir = str(tmp_path / "run")
    out = subprocess.run(RUN + BASE + ["--stop_at_return=none", "--total_env_steps=30000",
                                       f"--logdir={run_dir}"],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    steps = _steps(run_dir)
    assert len(steps) >= 2, steps
    truncate_state(os.path.join(run_dir, "checkpoints", str(steps[-1])))
    out = subprocess.run(RUN + [f"--resume={run_dir}", f"--total_env_steps={steps[-1] + 2000}",
                                "--quiet"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    warnings = [line for line in out.stderr.splitlines() if "warning: checkpoint" in line]
    assert len(warnings) == 1 and f"checkpoint {steps[-1]} cannot be read" in warnings[0], (
        out.stderr)
    s = _summary(run_dir)
    assert s["resumed_from_env_steps"] == steps[-2] and s["env_steps"] >= steps[-1] + 2000


def test_no_readable_checkpoint_is_one_error(tmp_path):
    directory = tmp_path / "checkpoints" / "100"
    directory.mkdir(parents=True)
    with pytest.raises(CheckpointError, match="no readable checkpoint in .*checkpoints"):
        latest_checkpoint(str(tmp_path))


# A learner's state sharded across four devices (a run's learner on a bigger machine).
SAVE_ON_FOUR_DEVICES = """
import sys
import jax, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from trellis.builders.experiments.checkpointing import Checkpointer, checkpoint_dir
w = jax.device_put(np.arange(8.0), NamedSharding(Mesh(np.array(jax.devices()), ("data",)),
                                                 PartitionSpec("data")))
checkpointer = Checkpointer(checkpoint_dir(sys.argv[1]))
checkpointer.save(100, {"w": w}, {"env_steps": 100, "learner_steps": 10})
checkpointer.close()
"""


def test_a_checkpoint_made_on_other_devices_is_readable_for_a_resume(tmp_path):
    """The newest readable checkpoint is found on a machine with fewer devices than the run
    had (orbax, given no target, refused with "Topology mismatch": the resume said no
    checkpoint was readable)."""
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    subprocess.run([sys.executable, "-c", SAVE_ON_FOUR_DEVICES, str(tmp_path)], env=env,
                   cwd=REPO, check=True, timeout=120)
    assert jax.device_count() < 4
    assert latest_checkpoint(str(tmp_path)) == (100, {"env_steps": 100, "learner_steps": 10})
    assert not os.path.exists(os.path.join(str(tmp_path), CORRUPT_SUBDIR))


def _learner_pid(launcher):
    """The learner node's process: local_mp names each node's process by its label."""
    for pid in processes.descendants(launcher):
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() == "learner":
                    return pid
        except OSError:
            pass  # Ended meanwhile.
    return None


@pytest.mark.slow
def test_a_killed_learner_restarts_from_its_checkpoint_and_the_run_reaches_its_target(tmp_path):
    run_dir = str(tmp_path / "run")
    proc = _start(["--max_learner_restarts=1", "--stop_at_return=150",
                   "--total_env_steps=1000000", f"--logdir={run_dir}"])
    try:
        _wait_for(lambda: _steps(run_dir) and _steps(run_dir)[-1] > 0, proc, 180,
                  "checkpointing")
        killed = _learner_pid(proc.pid)
        assert killed is not None
        workers_before = {pid for pid in processes.descendants(proc.pid)
                          if _comm(pid).startswith("actor")}
        os.kill(killed, signal.SIGKILL)
        _, stderr = proc.communicate(timeout=400)
    finally:
        _finish(proc, 10)
    assert proc.returncode == 0, stderr
    s = _summary(run_dir)
    assert s["stopped_by"] == "return_target" and s["mean_return"] >= 150, s
    assert s["node_restarts"].get("learner") == 1, s
    # The env workers went on in the same processes, reconnected to the new learner.
    assert not any(label.startswith("actor") for label in s["node_restarts"]), (
        s["node_restarts"], stderr)
    assert "connecting again" in stderr and workers_before


def _comm(pid):
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


# Run in a fresh Python, as tests/test_ray.py's cluster scripts: a local cluster of three Ray
# nodes (ray.cluster_utils), the "learner" on the head (its custom resource), two env workers
# on the other two; one of those is removed (its raylet and workers SIGKILLed, as a machine
# lost) once the program runs.
LOST_NODE_SCRIPT = """
import faulthandler, json, time
faulthandler.dump_traceback_later(400, exit=True)
import ray
from ray.cluster_utils import Cluster
from trellis.launch import runtime
from tests import launch_nodes as nodes

cluster = Cluster(initialize_head=True, head_node_args={
    "num_cpus": 1, "resources": {"learner": 1}, "include_dashboard": False})
workers = [cluster.add_node(num_cpus=2) for _ in range(2)]
cluster.wait_for_nodes(timeout=180)
ray.init(address=cluster.address)
program = runtime.Program("lost")
with program.group("learner", resources={"learner": 1}):
    learner = program.add_node(runtime.CourierNode(nodes.RayPlacement))
with program.group("actor", max_restarts=1, resources={"CPU": 1}):
    actors = [program.add_node(runtime.CourierNode(nodes.RayPlacement)) for _ in range(2)]
running = runtime.launch(program, platform="ray", block=False, ray_address=cluster.address)
try:
    head = learner.dereference().node_id()
    before = actors[0].dereference().node_id()
    lost = next(w for w in workers if w.node_id == before)
    cluster.remove_node(lost, allow_graceful=False)
    old_address, deadline = actors[0].address, time.monotonic() + 180
    while actors[0].address == old_address and running.is_running():
        assert time.monotonic() < deadline, "not placed again"
        time.sleep(0.2)
    after = actors[0].dereference().node_id()
    placed = {"head": head, "before": before, "after": after, "running": running.is_running(),
              "left": [w.node_id for w in workers if w is not lost],
              "restarts": running.restarts}
finally:
    running.stop()
ray.shutdown()
cluster.shutdown()
print(json.dumps(placed))
"""


@pytest.mark.slow
def test_env_workers_of_a_lost_ray_node_are_placed_again_on_the_nodes_left():
    pytest.importorskip("ray")
    # The nodes bind loopback only: the cluster runs without Ray's auth token (test_ray's).
    env = dict(os.environ, RAY_AUTH_MODE="disabled", PYTHONPATH=REPO)
    out = subprocess.run([sys.executable, "-c", LOST_NODE_SCRIPT], env=env, cwd=REPO,
                         capture_output=True, text=True, timeout=500)
    assert out.returncode == 0, out.stderr[-4000:]
    placed = json.loads(out.stdout.strip().splitlines()[-1])
    assert placed["running"] and placed["restarts"] == {"actor/0": 1}, placed
    assert placed["after"] in placed["left"] and placed["before"] not in placed["left"], placed
    assert "its Ray node is gone; placed again" in out.stderr


# The same loss under run.py: the head has the cluster's only GPU (a logical one), so the
# learner group (which asks for an accelerator) lands there; the env workers on the two
# others. Once the run trains, a node holding an env worker is removed.
LOST_NODE_RUN_SCRIPT = """
import faulthandler, json, os, subprocess, sys, time
faulthandler.dump_traceback_later(560, exit=True)
import ray
from ray._private.state import available_resources_per_node
from ray.cluster_utils import Cluster

run_dir = sys.argv[1]
cluster = Cluster(initialize_head=True, head_node_args={
    "num_cpus": 1, "num_gpus": 1, "include_dashboard": False})
workers = [cluster.add_node(num_cpus=2) for _ in range(2)]
cluster.wait_for_nodes(timeout=180)
ray.init(address=cluster.address)
run = subprocess.Popen([sys.executable, "launch/run.py", "--platform=ray",
                        f"--ray_address={cluster.address}", "--stop_at_return=100",
                        "--total_env_steps=1000000", f"--logdir={run_dir}", "--quiet"])
metrics, deadline = os.path.join(run_dir, "metrics.jsonl"), time.monotonic() + 240
while not (os.path.exists(metrics) and os.path.getsize(metrics) > 0):
    assert run.poll() is None and time.monotonic() < deadline, "not training"
    time.sleep(0.5)
free = available_resources_per_node()
lost = next(w for w in workers if free.get(w.node_id, {}).get("CPU", 2) < 2)
cluster.remove_node(lost, allow_graceful=False)
code = run.wait(timeout=400)
ray.shutdown()
cluster.shutdown()
print(json.dumps({"code": code}))
"""


@pytest.mark.slow
def test_a_run_loses_a_ray_node_and_reaches_its_target(tmp_path):
    pytest.importorskip("ray")
    env = dict(os.environ, RAY_AUTH_MODE="disabled", PYTHONPATH=REPO)
    run_dir = str(tmp_path / "run")
    out = subprocess.run([sys.executable, "-c", LOST_NODE_RUN_SCRIPT, run_dir], env=env,
                         cwd=REPO, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"code": 0}, out.stderr[-4000:]
    s = _summary(run_dir)
    assert s["stopped_by"] == "return_target" and s["mean_return"] >= 100, s
    assert any(label.startswith("actor") for label in s["node_restarts"]), s
    assert "its Ray node is gone; placed again" in out.stderr
