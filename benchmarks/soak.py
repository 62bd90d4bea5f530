"""Endurance: IMPALA on local_mp for a given time while random env workers are SIGKILLed.

Usage: python benchmarks/soak.py [--minutes 20] [--kill_every 20,60] [--seed 0]
       [-- extra run.py flags]

Starts `launch/run.py --agent=impala --platform=local_mp` with no step budget and no return
target. Once the first env steps are counted, for --minutes, it SIGKILLs a random env worker
every 20-60 s (uniform) and waits for the launcher to restart it; once a minute from the start it
samples every process of the program (resident memory, open file descriptors) and the env steps
in metrics.jsonl, and once more at the end. Then it sends SIGTERM to the launcher (as a user's
Ctrl-C or a scheduler would) and checks that the program stopped cleanly: exit code 130,
summary.json written, no process left behind.

Prints one line per minute, a table of every process at the first minute and at the end, the
verdicts, then one JSON line; exits 0 only if every verdict holds. Linux only (reads /proc).
Node processes are told apart by their names (local_mp names them after their nodes).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

from common import child_process, rounded

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The flags of this script's smoke run in the default test suite (tests/test_benchmarks.py):
# its main path on a budget of seconds.
SMOKE_FLAGS = ["--minutes=0.1", "--kill_every=1,2"]
ENV_WORKER = "actor/"  # Env workers' node labels: "actor/0", "actor/1", ...
RSS_TOLERANCE = 0.2  # End RSS within 20% of the RSS after the first minute.
RESTART_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 60.0
SIGNAL_EXIT_CODE = 130  # run.py's exit code when stopped by a signal.


def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else int(fields[1])


def _alive(pid: int) -> bool:
    return _ppid(pid) is not None


def program_processes(root: int) -> dict[int, str]:
    """pid -> name of `root` ("launcher") and all its live descendants (named by comm)."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            ppid = _ppid(int(entry))
            if ppid is not None:
                parents[int(entry)] = ppid
    tree = {root: "launcher"} if root in parents else {}
    grew = True
    while grew:
        grew = False
        for pid, ppid in parents.items():
            if ppid in tree and pid not in tree:
                tree[pid] = _comm(pid)
                grew = True
    return tree


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"


def usage(pid: int) -> dict[str, float] | None:
    """Resident memory (MB) and open file descriptors of process `pid`; None if it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            rss_kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, StopIteration):
        return None
    return {"pid": pid, "rss_mb": rss_kb / 1024, "fds": fds}


def sample(root: int) -> dict[str, dict[str, float]]:
    """name -> usage of every process of the program (names with a pid suffix if repeated)."""
    out = {}
    for pid, name in sorted(program_processes(root).items()):
        use = usage(pid)
        if use is not None:
            out[name if name not in out else f"{name}#{pid}"] = use
    return out


def env_steps(logdir: str) -> int:
    """The env steps of the newest record in metrics.jsonl (0 before the first)."""
    try:
        with open(os.path.join(logdir, "metrics.jsonl"), "rb") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return 0
    for line in reversed(lines):
        try:
            return int(json.loads(line)["env_steps"])
        except (ValueError, KeyError):
            continue  # A line being written.
    return 0


def env_workers(root: int) -> dict[str, int]:
    return {name: pid for pid, name in program_processes(root).items()
            if name.startswith(ENV_WORKER)}


def kill_and_await_restart(root: int, rng: random.Random) -> dict:
    """SIGKILLs a random env worker, waits for a new process of the same node."""
    workers = env_workers(root)
    name = rng.choice(sorted(workers))
    pid = workers[name]
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    while time.monotonic() - killed < RESTART_TIMEOUT_S:
        new = env_workers(root).get(name)
        if new is not None and new != pid:
            return {"node": name, "pid": pid, "new_pid": new,
                    "restart_s": time.monotonic() - killed}
        time.sleep(0.05)
    return {"node": name, "pid": pid, "new_pid": None, "restart_s": None}


def stop(proc: subprocess.Popen, seen: set[int]) -> dict:
    """SIGTERM to the launcher; how it ended and which of the `seen` processes outlived it."""
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        code = None
    stop_s = time.monotonic() - start
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in seen) and time.monotonic() < deadline:
        time.sleep(0.1)
    return {"exit_code": code, "stop_s": stop_s,
            "left_behind": sorted(pid for pid in seen if _alive(pid))}


def soak(minutes: float, kill_every: tuple[float, float], seed: int, extra: list[str],
         logdir: str) -> dict:
    cmd = [sys.executable, os.path.join(REPO, "launch", "run.py"), "--agent=impala",
           "--platform=local_mp", "--total_env_steps=1000000000000", "--stop_at_return=none",
           "--max_actor_restarts=100000", f"--seed={seed}", f"--logdir={logdir}", "--quiet",
           *extra]
    rng = random.Random(seed)
    start = time.monotonic()
    # Its own stop (SIGTERM to run.py) is what the soak measures; the group is stopped too
    # if the soak itself is interrupted or terminated.
    with child_process(cmd, cwd=REPO, stdout=subprocess.DEVNULL) as proc:
        seen: set[int] = set()
        samples, minutes_log, kills = [], [], []
        try:
            while env_steps(logdir) == 0:
                if proc.poll() is not None:
                    raise RuntimeError(f"run.py exited with code {proc.returncode} before its "
                                       f"first env steps")
                time.sleep(0.2)
            began = time.monotonic()
            first_steps_s = began - start
            # Timed from the first env steps: a slow start-up (a busy machine) leaves the kills
            # their time, and the samples fall each minute of the soak and at its end.
            end = began + minutes * 60
            next_kill = began + rng.uniform(*kill_every)
            next_sample = began + 60
            last = (start, 0)
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"run.py exited with code {proc.returncode} mid-soak")
                now = time.monotonic()
                if now >= next_kill and now < end:
                    kills.append(kill_and_await_restart(proc.pid, rng))
                    next_kill = time.monotonic() + rng.uniform(*kill_every)
                if now >= min(next_sample, end):  # Each minute, and once at the end.
                    processes = sample(proc.pid)
                    seen.update(int(p["pid"]) for p in processes.values())
                    steps = env_steps(logdir)
                    rate = (steps - last[1]) / (now - last[0])
                    last = (now, steps)
                    minutes_log.append({"minute": round((now - start) / 60, 2),
                                        "env_steps": steps, "env_steps_per_s": rate,
                                        "kills": len(kills)})
                    samples.append(processes)
                    print(f"minute {(now - start) / 60:>5.1f}: {steps:>12,d} env steps, "
                          f"{rate:>8,.0f} steps/s, {len(kills):>3} kills, "
                          f"{len(processes)} processes", flush=True)
                    if now >= end:
                        break
                    next_sample += 60
                time.sleep(0.1)
        finally:
            ending = stop(proc, seen) if proc.poll() is None else {
                "exit_code": proc.returncode, "stop_s": 0.0, "left_behind": []}
    summary_path = os.path.join(logdir, "summary.json")
    summary = json.load(open(summary_path)) if os.path.exists(summary_path) else {}
    return {"minutes": minutes, "kill_every_s": list(kill_every), "seed": seed,
            "first_env_steps_s": first_steps_s, "per_minute": minutes_log, "kills": kills,
            "processes": {"first_minute": samples[0] if samples else {},
                          "end": samples[-1] if samples else {}},
            "stop": ending, "summary": {k: summary.get(k) for k in
                                        ("stopped_by", "exit_code", "node_restarts",
                                         "env_steps", "learner_steps")}}


def verdicts(result: dict) -> dict[str, bool]:
    """The checks of a soak: restarts, progress, memory, a clean stop."""
    kills = result["kills"]
    first, end = result["processes"]["first_minute"], result["processes"]["end"]
    restarts = sum((result["summary"]["node_restarts"] or {}).values())
    return {
        "every kill followed by a restart": bool(kills) and all(k["new_pid"] for k in kills)
        and restarts == len(kills),
        "env steps every minute": bool(result["per_minute"])
        and all(m["env_steps_per_s"] > 0 for m in result["per_minute"]),
        f"RSS at the end within {RSS_TOLERANCE:.0%} of the first minute's": bool(end) and all(
            name in first and use["rss_mb"] <= (1 + RSS_TOLERANCE) * first[name]["rss_mb"]
            for name, use in end.items()),
        "stopped cleanly": result["stop"]["exit_code"] == SIGNAL_EXIT_CODE
        and not result["stop"]["left_behind"] and result["summary"]["stopped_by"] == "signal",
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=20.0,
                   help="how long env workers are killed, from the first env steps")
    p.add_argument("--kill_every", default="20,60", help="MIN,MAX seconds between kills")
    p.add_argument("--seed", type=int, default=0)
    args, extra = p.parse_known_args()
    kill_every = tuple(float(s) for s in args.kill_every.split(","))
    with tempfile.TemporaryDirectory() as logdir:
        result = soak(args.minutes, kill_every, args.seed, [a for a in extra if a != "--"],
                      logdir)
    first, end = result["processes"]["first_minute"], result["processes"]["end"]
    print(f"\n{'process':<16}{'RSS MB 1st min':>15}{'RSS MB end':>12}{'fds 1st':>9}"
          f"{'fds end':>9}")
    for name in sorted(set(first) | set(end)):
        a, b = first.get(name, {}), end.get(name, {})
        print(f"{name:<16}{a.get('rss_mb', float('nan')):>15.1f}"
              f"{b.get('rss_mb', float('nan')):>12.1f}{a.get('fds', '-'):>9}"
              f"{b.get('fds', '-'):>9}")
    restart_s = [k["restart_s"] for k in result["kills"] if k["restart_s"] is not None]
    print(f"\nkills: {len(result['kills'])}, restarts counted by the launcher: "
          f"{result['summary']['node_restarts']}, restart time max "
          f"{max(restart_s, default=float('nan')):.1f} s; first env steps after "
          f"{result['first_env_steps_s']:.1f} s; stopped in {result['stop']['stop_s']:.1f} s "
          f"with exit code {result['stop']['exit_code']}")
    checks = verdicts(result)
    for name, ok in checks.items():
        print(f"{'ok  ' if ok else 'FAIL'} {name}")
    result["verdicts"] = checks
    print(json.dumps(rounded(result)))
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
