"""Pong to a target return: time from launch, frames/s, GPU busy fraction, CPU use, start-up.

Usage: python benchmarks/atari.py [--agent impala] [--env envpool:Pong-v5] [--target 18]
       [--num_actors N] [--envs_per_actor 32] [--platform local_mp] [--budget_s 900]
       [--sample_s 1] [--curve_s 60] [--logdir DIR] [-- extra run.py flags]
Runs `launch/run.py --agent=AGENT --preset=atari --env=ENV --stop_at_return=TARGET` (the
command a user types, start-up included; docs/atari.md) until it reaches the target or the
wall-time budget ends, sampling the GPU's busy fraction (`nvidia-smi`, where it exists) and
the CPU's use (/proc/stat) every --sample_s while it runs. Prints what it measured (the mean
return every --curve_s seconds among it; from metrics.jsonl, the learner's updates a second,
the policy lag, env steps per policy call and how often the unroll queue was empty, which
tell a learner-bound run from one that waits for data), then one JSON object as the last
line. Issue 21's check: Pong's mean return 18 within 15 minutes of launch at >= 52,000
frames/s on a 16-core GPU machine.

Stopping the benchmark (Ctrl-C, SIGTERM) stops run.py and its nodes (benchmarks/common.py's
`child_process`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from common import child_process, cpu_count, rounded

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The flags of a run of a few minutes on 2 cores through the main path (a Pong run.py costs
# over a minute there, so tests/test_benchmarks.py runs it only in the slow suite).
SMOKE_FLAGS = ["--platform=local_mt", "--num_actors=1", "--envs_per_actor=2", "--target=21",
               "--budget_s=300", "--", "--total_env_steps=400", "--batch_size=2"]

# What a frame skip is when config.json does not say (envpool's and ALE's default).
DEFAULT_FRAME_SKIP = 4


def gpu_busy() -> float | None:
    """The GPUs' mean utilization now, in [0, 1], from nvidia-smi; None where it is missing
    or fails."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=utilization.gpu",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True,
                             timeout=10, check=True).stdout
        values = [float(line) for line in out.split()]
    except (subprocess.SubprocessError, OSError, ValueError):
        return None
    return statistics.mean(values) / 100 if values else None


def cpu_jiffies() -> tuple[int, int] | None:
    """(busy, total) CPU time of all cores since boot, in jiffies (/proc/stat); None off
    Linux."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def busy_fraction(samples: list[tuple[float, tuple[int, int] | None]], since: float
                  ) -> float | None:
    """The CPU's busy fraction between the first sample at or after `since` and the last."""
    window = [(t, j) for t, j in samples if t >= since and j is not None]
    if len(window) < 2:
        return None
    (_, (b0, t0)), (_, (b1, t1)) = window[0], window[-1]
    return (b1 - b0) / (t1 - t0) if t1 > t0 else None


def read_records(path: str) -> list[dict]:
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except OSError:
        return []


def learner_figures(learning: list[dict]) -> dict:
    """What the records after the first learner update say about what bounds the rate: the
    learner's updates a second, the policy lag (the mean of the records' means, and their
    maximum), env steps per policy call of the central inference, and the share of records
    whose unroll queue was empty (the learner waiting for data). Values are None where the
    records lack them (fewer than two records, or a run without that field)."""

    def mean(name: str) -> float | None:
        values = [r[name] for r in learning if r.get(name) is not None]
        return statistics.mean(values) if values else None

    span = learning[-1]["time"] - learning[0]["time"] if len(learning) >= 2 else 0.0
    lag_max = [r["policy_lag_max"] for r in learning if r.get("policy_lag_max") is not None]
    queues = [r["queue_size"] for r in learning if r.get("queue_size") is not None]
    return {
        "learner_steps_per_s": ((learning[-1]["learner_steps"] - learning[0]["learner_steps"])
                                / span if span > 0 else None),
        "policy_lag_mean": mean("policy_lag_mean"),
        "policy_lag_max": max(lag_max, default=None),
        "inference_batch_mean": mean("inference_batch_mean"),
        "queue_empty_fraction": (sum(q == 0 for q in queues) / len(queues) if queues
                                 else None),
    }


def return_curve(records: list[dict], launched: float, frame_skip: int, every_s: float
                 ) -> list[tuple[float, int, float]]:
    """(seconds from launch, frames, mean return) from the records with a mean return, at
    most one per `every_s` seconds, and the last."""
    scored = [r for r in records if r.get("return_mean") is not None]
    points, last = [], None
    for i, r in enumerate(scored):
        if last is None or r["time"] - last >= every_s or i == len(scored) - 1:
            points.append((r["time"] - launched, r["env_steps"] * frame_skip, r["return_mean"]))
            last = r["time"]
    return points


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--agent", default="impala", help="an agent with --preset=atari")
    p.add_argument("--env", default="envpool:Pong-v5")
    p.add_argument("--target", type=float, default=18.0, help="mean return to reach")
    p.add_argument("--platform", default="local_mp")
    p.add_argument("--num_actors", type=int, default=None,
                   help="env workers (default: the cores this process may use, less 2, "
                   "at least 1)")
    p.add_argument("--envs_per_actor", type=int, default=32)
    p.add_argument("--budget_s", type=float, default=900.0,
                   help="wall-time budget from launch; the run is stopped at its end")
    p.add_argument("--sample_s", type=float, default=1.0,
                   help="seconds between GPU and CPU samples")
    p.add_argument("--curve_s", type=float, default=60.0,
                   help="seconds between the points of the printed return curve")
    p.add_argument("--logdir", default=None,
                   help="keep the run directory here (default: a temporary one, removed)")
    args, extra = p.parse_known_args()
    extra = [a for a in extra if a != "--"]
    cores = cpu_count()
    num_actors = args.num_actors or max(1, cores - 2)

    with tempfile.TemporaryDirectory() as scratch:
        logdir = args.logdir or scratch
        command = [sys.executable, os.path.join(REPO, "launch", "run.py"),
                   f"--agent={args.agent}", "--preset=atari", f"--env={args.env}",
                   f"--platform={args.platform}", f"--num_actors={num_actors}",
                   f"--envs_per_actor={args.envs_per_actor}", f"--stop_at_return={args.target}",
                   "--total_env_steps=1000000000", f"--logdir={logdir}", "--quiet", *extra]
        print(" ".join(command[1:]), flush=True)
        gpu: list[tuple[float, float]] = []
        cpu: list[tuple[float, tuple[int, int] | None]] = []
        launched = time.time()
        with child_process(command, cwd=REPO, stdout=subprocess.DEVNULL) as process:
            while process.poll() is None and time.time() - launched < args.budget_s:
                now = time.time()
                cpu.append((now, cpu_jiffies()))
                busy = gpu_busy()
                if busy is not None:
                    gpu.append((now, busy))
                time.sleep(max(0.0, args.sample_s - (time.time() - now)))
            stopped_by_budget = process.poll() is None
        ended = time.time()
        cpu.append((ended, cpu_jiffies()))
        records = read_records(os.path.join(logdir, "metrics.jsonl"))
        try:
            with open(os.path.join(logdir, "summary.json")) as f:
                summary = json.load(f)
            with open(os.path.join(logdir, "config.json")) as f:
                saved = json.load(f).get("command_line", {})
        except OSError as e:
            raise SystemExit(f"run.py wrote no summary ({e}); its command: "
                             f"{' '.join(command)}") from None

    frame_skip = saved.get("frame_skip") or DEFAULT_FRAME_SKIP
    startup = summary.get("startup_s") or {}
    reached = next((r for r in records if r.get("return_mean") is not None
                    and r["return_mean"] >= args.target), None)
    # Steady: from the first record after the first learner step to the last record.
    learning = [r for r in records if r["learner_steps"] > 0]
    steady = None
    if len(learning) >= 2 and learning[-1]["time"] > learning[0]["time"]:
        steady = ((learning[-1]["env_steps"] - learning[0]["env_steps"]) * frame_skip
                  / (learning[-1]["time"] - learning[0]["time"]))
    first_learning = learning[0]["time"] if learning else launched
    gpu_steady = [b for t, b in gpu if t >= first_learning]
    returns = [r["return_mean"] for r in records if r.get("return_mean") is not None]
    result = {
        "agent": args.agent,
        "env": args.env,
        "platform": args.platform,
        "num_actors": num_actors,
        "envs_per_actor": args.envs_per_actor,
        "extra_flags": extra,
        "cores": cores,
        "target": args.target,
        "reached_target": reached is not None,
        "time_to_target_s": None if reached is None else reached["time"] - launched,
        "stopped_by": "wall_time_budget" if stopped_by_budget else summary["stopped_by"],
        "wall_s": ended - launched,
        "env_steps": summary["env_steps"],
        "frame_skip": frame_skip,
        "frames": summary["env_steps"] * frame_skip,
        "frames_per_s": summary["env_steps"] * frame_skip / (ended - launched),
        "steady_frames_per_s": steady,
        "mean_return": summary["mean_return"],
        "best_return": max(returns, default=None),
        "startup_s": startup,
        "gpu_busy_mean": statistics.mean(b for _, b in gpu) if gpu else None,
        "gpu_busy_steady": statistics.mean(gpu_steady) if gpu_steady else None,
        "cpu_busy": busy_fraction(cpu, launched),
        "cpu_busy_steady": busy_fraction(cpu, first_learning),
        "return_curve": return_curve(records, launched, frame_skip, args.curve_s),
        "steady": learner_figures(learning),
    }
    print(f"{args.agent} --preset=atari on {args.env}, {num_actors} x {args.envs_per_actor} "
          f"envs, {args.platform}, {cores} cores")
    target = (f"{result['time_to_target_s']:.1f} s" if reached
              else f"not reached (stopped by {result['stopped_by']})")
    print(f"  mean return {args.target:g}: {target}; last mean return {result['mean_return']}, "
          f"best {result['best_return']}")
    print(f"  {result['env_steps']:,} env steps = {result['frames']:,} frames in "
          f"{result['wall_s']:.1f} s: {result['frames_per_s']:,.0f} frames/s from launch, "
          f"{steady or 0:,.0f} steady (after the first learner step)")
    for seconds, frames, mean_return in result["return_curve"]:
        print(f"  {seconds:6.0f} s  {frames:>12,} frames  mean return {mean_return:6.1f}")
    print(f"  start-up from the program's launch: first env step "
          f"{startup.get('first_env_step')} s, first learner step "
          f"{startup.get('first_learner_step')} s")

    def share(x: float | None) -> str:
        return "n/a" if x is None else f"{100 * x:.0f}%"

    def number(x: float | None, digits: int = 1) -> str:
        return "n/a" if x is None else f"{x:,.{digits}f}"

    figures = result["steady"]
    print(f"  steady: {number(figures['learner_steps_per_s'])} learner updates/s, policy lag "
          f"mean {number(figures['policy_lag_mean'], 2)} (max "
          f"{number(figures['policy_lag_max'], 0)}), {number(figures['inference_batch_mean'])} "
          f"env steps per policy call, unroll queue empty at "
          f"{share(figures['queue_empty_fraction'])} of the records")

    print(f"  GPU busy {share(result['gpu_busy_mean'])} (steady "
          f"{share(result['gpu_busy_steady'])}); CPU busy {share(result['cpu_busy'])} "
          f"(steady {share(result['cpu_busy_steady'])}) of {cores} cores")
    print(json.dumps(rounded(result)))


if __name__ == "__main__":
    main()
