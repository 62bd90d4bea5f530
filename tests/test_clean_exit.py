"""`launch/run.py` ends cleanly: no native-thread abort or traceback, and no process left over.

Each test runs run.py in a subprocess, records every process it starts while it runs (from
/proc), and checks, once run.py has returned, that none of them is still alive, and that its
output has none of the noise a torn-down thread or a failing node prints. Covered: the step
budget (on threads, on processes, and with unrolls through a replay node, whose early stop used
to surface as a traceback), the return target, Ctrl-C, and an env worker killed and restarted.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests import processes

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN = os.path.join(REPO, "launch", "run.py")
NOISE = ("terminate called", "FATAL", "Traceback")
SMALL = ["--agent=impala", "--env=CartPole-v1", "--num_actors=2", "--envs_per_actor=8",
         "--quiet", "--log_every_s=0.5"]
DEADLINE_S = 240.0  # A whole run on a busy 2-core machine, start-up included.


@dataclasses.dataclass
class Finished:
    returncode: int
    out: str  # stdout and stderr together
    summary: dict
    left: list[str]  # "pid cmdline" of the run's processes still alive when run.py returned


def _start_time(pid: int) -> str | None:
    """The process's start time (field 22 of /proc/PID/stat), or None if it is gone or a zombie.

    Comparing start times tells a process from a later one that reuses its pid.
    """
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else fields[19]


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _threads(pid: int) -> int:
    return len(glob.glob(f"/proc/{pid}/task/*"))


class Run:
    """run.py in a subprocess (its own session, like a shell job), with its process tree."""

    def __init__(self, tmp_path, *flags: str):
        self.run_dir = tmp_path / "run"
        self._log = open(tmp_path / "output.txt", "w+")  # noqa: SIM115 -- closed in finish()
        self.process = subprocess.Popen(
            [sys.executable, RUN, *SMALL, f"--logdir={self.run_dir}", *flags],
            cwd=str(tmp_path), stdout=self._log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.seen: dict[int, tuple[str, str]] = {}  # pid -> (start time, command line)
        # run.py's own children: multiprocessing's resource tracker and fork server.
        self.helpers: set[int] = set()
        self._deadline = time.monotonic() + DEADLINE_S

    def watch(self) -> None:
        """Records the processes run.py has started so far (nodes and their children)."""
        pending = [self.process.pid]
        while pending:
            parent = pending.pop()
            for child in processes.children(parent):
                if parent == self.process.pid:
                    self.helpers.add(child)
                start, known = _start_time(child), self.seen.get(child)
                if start is not None and (known is None or known[0] == start):
                    # Read at every sight: one seen between its fork and its exec shows
                    # run.py's command line (multiprocessing's resource tracker, taken for a
                    # node once), and an exiting process's reads empty (the last kept).
                    cmdline = _cmdline(child)
                    if cmdline or known is None:
                        self.seen[child] = (start, cmdline)
                pending.append(child)

    def poll_until(self, condition, what: str) -> None:
        """Watches the process tree until `condition()` holds; fails at the deadline."""
        while not condition():
            if self.process.poll() is not None:
                # It may have exited just after `condition()` was read: read it once more.
                assert condition(), f"run.py exited before {what}"
                return
            assert time.monotonic() < self._deadline, f"timed out waiting for {what}"
            self.watch()
            time.sleep(0.05)

    def env_steps(self) -> int:
        """The newest env-step count in metrics.jsonl (0 before the first record)."""
        try:
            with open(self.run_dir / "metrics.jsonl") as f:
                lines = f.read().splitlines()
        except FileNotFoundError:
            return 0
        records = [json.loads(line) for line in lines if line.endswith("}")]
        return max((r.get("env_steps", 0) for r in records), default=0)

    def node_pids(self) -> list[int]:
        """The live node processes: the children of run.py's fork server."""
        return [pid for helper in processes.children(self.process.pid)
                if "forkserver" in _cmdline(helper) for pid in processes.children(helper)]

    def _alive(self, pid: int) -> bool:
        return _start_time(pid) == self.seen[pid][0]

    def finish(self) -> Finished:
        """Waits for run.py to return; what it printed and which of its processes are left."""
        try:
            self.poll_until(lambda: self.process.poll() is not None, "run.py to return")
        finally:
            if self.process.poll() is None:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        left = [pid for pid in self.seen if self._alive(pid)]
        # multiprocessing's resource tracker and fork server are no nodes: each ends when it
        # reads EOF from its pipe, i.e. just after run.py; they get a deadline, the nodes none.
        helpers = [pid for pid in left if pid in self.helpers]
        deadline = time.monotonic() + 10.0
        while any(self._alive(pid) for pid in helpers) and time.monotonic() < deadline:
            time.sleep(0.05)
        described = [f"{pid} {self.seen[pid][1]}" for pid in left
                     if pid not in helpers or self._alive(pid)]
        self._log.seek(0)
        out = self._log.read()
        self._log.close()
        summary_path = self.run_dir / "summary.json"
        summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
        return Finished(self.process.returncode, out, summary, described)


def _assert_clean(finished: Finished, returncode: int, stopped_by: str) -> None:
    assert finished.returncode == returncode, finished.out
    assert finished.summary.get("stopped_by") == stopped_by, finished.out
    for noise in NOISE:
        assert noise not in finished.out, f"{noise!r} in the output:\n{finished.out}"
    assert finished.left == [], f"processes left after run.py returned: {finished.left}"


@pytest.mark.parametrize("flags", [
    ["--platform=local_mp"],
    ["--platform=local_mp"],  # Twice: the abort it guards against was intermittent.
    ["--platform=local_mp", "--unroll_queue=replay"],
    ["--platform=local_mt"],
], ids=["local_mp", "local_mp-again", "local_mp-replay", "local_mt"])
def test_a_run_stopped_by_its_budget_exits_cleanly(tmp_path, flags):
    run = Run(tmp_path, "--total_env_steps=12000", "--stop_at_return=none", *flags)
    finished = run.finish()
    _assert_clean(finished, 0, "budget")
    assert "[launch]" not in finished.out, finished.out  # No node failed, not even at the end.


def test_a_run_stopped_by_its_return_target_exits_cleanly(tmp_path):
    # A random CartPole policy returns about 20; 25 over 10 episodes comes within seconds.
    run = Run(tmp_path, "--platform=local_mp", "--total_env_steps=2000000",
              "--stop_at_return=25", "--return_window=10")
    finished = run.finish()
    _assert_clean(finished, 0, "return_target")
    assert "[launch]" not in finished.out, finished.out


def test_ctrl_c_stops_a_run_cleanly(tmp_path):
    run = Run(tmp_path, "--platform=local_mp", "--total_env_steps=2000000",
              "--stop_at_return=none")
    run.poll_until(lambda: run.env_steps() > 0, "training to start")
    os.killpg(run.process.pid, signal.SIGINT)  # What Ctrl-C in a shell sends.
    finished = run.finish()
    _assert_clean(finished, 130, "signal")
    # Through a handler (the launcher's while run.py's loop waits inside the program, the
    # session's between waits), never a KeyboardInterrupt in run.py's loop: raised inside
    # tensorboardX's add_scalar (just after the metrics record this test waits for), one left
    # a lock held and run.py hung in the writer's close() (issue 14).
    assert ("[launch] SIGINT: stopping program" in finished.out
            or "[run] SIGINT: stopping the run" in finished.out), finished.out


def test_no_process_is_left_after_an_env_worker_restart(tmp_path):
    run = Run(tmp_path, "--platform=local_mp", "--total_env_steps=60000",
              "--stop_at_return=none", "--max_actor_restarts=1")
    run.poll_until(lambda: run.env_steps() >= 2000, "training to start")
    nodes = run.node_pids()
    assert len(nodes) == 3, nodes  # The learner and two env workers.
    # The learner runs JAX (dozens of threads); an env worker only steps envs.
    victim = min(nodes, key=_threads)
    os.kill(victim, signal.SIGKILL)
    run.poll_until(lambda: len(run.node_pids()) == 3 and victim not in run.node_pids(),
                   "the env worker's restart")
    finished = run.finish()
    assert "failed; restarting it (restart 1 of 1)" in finished.out, finished.out
    assert finished.summary.get("node_restarts") in ({"actor/0": 1}, {"actor/1": 1}), finished.out
    _assert_clean(finished, 0, "budget")
