"""launch/tune.py end to end on Ray Tune: a sweep runs every trial to its end even when one
trial's process is killed, and Ctrl-C leaves no process behind (Ray's included)."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests import processes

pytest.importorskip("ray.tune")
from trellis.builders.experiments.tuning import read_events  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--agent=impala", "--num_actors=1", "--envs_per_actor=4", "--batch_size=4",
        "--unroll_length=8", "--log_every_s=0.5", "--checkpoint_every_s=2", "--return_window=5",
        "--search", "learning_rate=loguniform:1e-4:1e-2"]


def _tune(tmp_path, *args) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, os.path.join(ROOT, "launch", "tune.py"), *TINY, *args,
         f"--logdir={tmp_path / 'sweep'}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _alive(pids) -> set[int]:
    out = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    out.add(pid)
        except OSError:
            pass
    return out


def _wait_for(condition, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def _reporting_trials(sweep_dir) -> list[str]:
    trials = sweep_dir / "trials"
    if not trials.is_dir():
        return []
    return [t.name for t in trials.iterdir() if (t / "metrics.jsonl").exists()
            and (t / "metrics.jsonl").stat().st_size > 0]


@pytest.mark.slow
def test_a_sweep_ends_with_every_trial_and_a_killed_one_marked_failed(tmp_path):
    proc = _tune(tmp_path, "--num_trials=3", "--max_concurrent=3", "--total_env_steps=6000")
    try:
        _wait_for(lambda: len(_reporting_trials(tmp_path / "sweep")) == 3, 400,
                  "three trials reporting")
        workers = _wait_for(lambda: sorted(p for p in processes.descendants(proc.pid)
                                           if "ImplicitFunc" in _cmdline(p)), 30,
                            "the trials' worker processes")
        os.kill(workers[0], signal.SIGKILL)
        output, _ = proc.communicate(timeout=400)
    finally:
        proc.kill()
    assert proc.returncode == 0, output[-3000:]
    sweep = json.loads((tmp_path / "sweep" / "sweep.json").read_text())
    trials = sweep["trials"]
    assert len(trials) == 3
    assert sorted(t["status"] for t in trials) == ["completed", "completed", "failed"]
    for trial in trials:
        assert os.path.isfile(os.path.join(trial["run_dir"], "config.json"))
        assert 1e-4 <= trial["hparams"]["learning_rate"] <= 1e-2
    completed = [t for t in trials if t["status"] == "completed"]
    for trial in completed:
        summary = json.loads(open(os.path.join(trial["run_dir"], "summary.json")).read())
        assert summary["env_steps"] >= 6000 and trial["metric"] == summary["mean_return"]
    best = max(completed, key=lambda t: t["metric"])
    assert sweep["best"]["trial_id"] == best["trial_id"]
    assert (tmp_path / "sweep" / "sweep.png").stat().st_size > 0
    assert (tmp_path / "sweep" / "tune").is_dir()  # Tune's own results.


@pytest.mark.slow
def test_ctrl_c_stops_every_trial_and_leaves_no_process(tmp_path):
    proc = _tune(tmp_path, "--num_trials=2", "--total_env_steps=10000000")
    try:
        _wait_for(lambda: _reporting_trials(tmp_path / "sweep"), 400, "a trial reporting")
        tree = processes.descendants(proc.pid)
        assert any("raylet" in _cmdline(p) for p in tree)
        proc.send_signal(signal.SIGINT)
        start = time.monotonic()
        proc.communicate(timeout=10)
        _wait_for(lambda: not _alive(tree), 10 - (time.monotonic() - start),
                  f"the sweep's processes to end: {sorted(_alive(tree))}")
    finally:
        proc.kill()
        for pid in _alive(processes.descendants(proc.pid)):
            os.kill(pid, signal.SIGKILL)
    assert proc.returncode in (0, 130)


@pytest.mark.slow
def test_pbt_exploits_record_the_donor_and_resume_from_its_checkpoint(tmp_path):
    proc = _tune(tmp_path, "--num_trials=3", "--max_concurrent=3", "--total_env_steps=10000",
                 "--scheduler=pbt", "--pbt_interval=1500", "--pbt_quantile=0.34",
                 "--search", "learning_rate=loguniform:1e-5:1e-1")
    try:
        output, _ = proc.communicate(timeout=500)
    finally:
        proc.kill()
    assert proc.returncode == 0, output[-3000:]
    sweep = json.loads((tmp_path / "sweep" / "sweep.json").read_text())
    assert [t["status"] for t in sweep["trials"]] == ["completed"] * 3
    ids = {t["trial_id"] for t in sweep["trials"]}
    events = [(t, event) for t in sweep["trials"] for event in read_events(t["run_dir"])]
    assert events, "no exploit in the sweep"
    for trial, event in events:
        assert event["donor"] in ids - {trial["trial_id"]}
        config = json.loads(open(os.path.join(trial["run_dir"], "config.json")).read())
        resumed = [s["resumed_from_env_steps"] for s in config["run"]["sessions"]]
        assert event["env_steps"] in resumed  # The run went on from the donor's checkpoint.
